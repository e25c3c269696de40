#include "kvstore/prefix_cache.hpp"

#include <algorithm>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::kv {

PrefixCache::PrefixCache(uint32_t blocks_count, uint32_t block_tokens)
    : blocks_(blocks_count), block_tokens_(block_tokens) {
  RT_ASSERT(blocks_count >= 1, blocks_count);
  RT_ASSERT(block_tokens >= 1, block_tokens);
  free_.reserve(blocks_count);
  // Stack: block 0 is handed out first.
  for (uint32_t i = blocks_count; i > 0; --i) {
    free_.push_back(i - 1);
    blocks_[i - 1].in_free = true;
  }
  by_hash_.reserve(blocks_count);
}

uint32_t PrefixCache::match(std::span<const BlockHash> hashes) const {
  uint32_t matched = 0;
  for (const auto& hash : hashes) {
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) break;
    RT_ASSERT(blocks_[it->second].cached && blocks_[it->second].hash == hash, it->second);
    ++matched;
  }
  RT_ASSERT(matched <= hashes.size());
  return matched;
}

Result<Allocation> PrefixCache::acquire(std::span<const BlockHash> hashes, uint32_t fresh_count,
                                        uint32_t query_blocks_count, Query query) {
  // The leading cached hashes' blocks, looked up once (match() without a second pass).
  matched_scratch_.clear();
  for (const auto& hash : hashes) {
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) break;
    RT_ASSERT(blocks_[it->second].cached && blocks_[it->second].hash == hash, it->second);
    matched_scratch_.push_back(it->second);
  }
  auto matched = static_cast<uint32_t>(matched_scratch_.size());
  // Distinct evictable blocks: a (malformed) hash list may repeat a hash.
  distinct_scratch_.clear();
  for (BlockIndex b : matched_scratch_) {
    if (blocks_[b].ref_count == 0) distinct_scratch_.push_back(b);
  }
  std::sort(distinct_scratch_.begin(), distinct_scratch_.end());
  auto matched_evictable = static_cast<uint32_t>(
      std::unique(distinct_scratch_.begin(), distinct_scratch_.end()) - distinct_scratch_.begin());
  RT_ASSERT(matched_evictable <= evictable_count_, matched_evictable, evictable_count_);
  uint64_t available = uint64_t{free_.size()} + evictable_count_ - matched_evictable;
  if (fresh_count > available) {
    ++counters_.overloaded_count;
    return make_error(ErrorKind::overloaded,
                      "KV pool: " + std::to_string(fresh_count) + " fresh blocks needed, " +
                          std::to_string(available) + " free or evictable of " +
                          std::to_string(blocks_.size()));
  }
  Allocation out;
  out.cached.reserve(matched);
  out.fresh.reserve(fresh_count);
  for (BlockIndex b : matched_scratch_) {
    if (blocks_[b].ref_count == 0) {
      lru_unlink(b);
      ++used_count_;
    }
    ++blocks_[b].ref_count;
    out.cached.push_back(b);
  }
  for (uint32_t i = 0; i < fresh_count; ++i) out.fresh.push_back(take_fresh());
  RT_ASSERT(out.fresh.size() == fresh_count, out.fresh.size());
  if (query == Query::internal) return out;
  ++counters_.queries_count;
  uint64_t query_blocks = std::max<uint64_t>(hashes.size(), query_blocks_count);
  counters_.query_blocks_count += query_blocks;
  counters_.query_tokens_count += query_blocks * block_tokens_;
  counters_.hit_blocks_count += matched;
  counters_.hit_tokens_count += uint64_t{matched} * block_tokens_;
  RT_ASSERT(used_count_ <= blocks_.size(), used_count_);
  return out;
}

BlockIndex PrefixCache::take_fresh() {
  BlockIndex b = none_;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
    RT_ASSERT(blocks_[b].in_free, b);
    blocks_[b].in_free = false;
  } else {
    b = lru_head_;
    RT_ASSERT(b != none_, "take_fresh with nothing free or evictable");
    RT_ASSERT(blocks_[b].cached && blocks_[b].ref_count == 0, b);
    lru_unlink(b);
    uncache_subtree(b);
    ++counters_.evictions_count;
  }
  RT_ASSERT(blocks_[b].ref_count == 0, b);
  blocks_[b].ref_count = 1;
  ++used_count_;
  return b;
}

CommitOutcome PrefixCache::commit(BlockIndex block, const BlockHash& hash,
                                  const std::optional<BlockHash>& parent) {
  RT_ASSERT(block < blocks_.size(), block);
  Block& b = blocks_[block];
  RT_ASSERT(b.ref_count > 0, "commit of an unreferenced block", block);
  RT_ASSERT(!b.cached, "commit of an already cached block", block);
  if (auto it = by_hash_.find(hash); it != by_hash_.end()) {
    RT_ASSERT(it->second != block, block);
    return CommitOutcome::duplicate;
  }
  BlockIndex parent_block = none_;
  if (parent) {
    auto it = by_hash_.find(*parent);
    if (it == by_hash_.end()) return CommitOutcome::orphan;
    parent_block = it->second;
  }
  by_hash_.emplace(hash, block);
  b.cached = true;
  b.hash = hash;
  b.parent = parent_block;
  b.depth = 0;
  if (parent_block != none_) {
    Block& p = blocks_[parent_block];
    b.depth = p.depth + 1;
    b.next_sibling = p.first_child;
    if (p.first_child != none_) blocks_[p.first_child].prev_sibling = block;
    p.first_child = block;
  }
  note_event(hash, +1);
  RT_ASSERT(by_hash_.size() <= blocks_.size(), by_hash_.size());
  return CommitOutcome::stored;
}

void PrefixCache::release(std::span<const BlockIndex> blocks) {
  for (size_t i = blocks.size(); i > 0; --i) {
    BlockIndex block = blocks[i - 1];
    RT_ASSERT(block < blocks_.size(), block);
    Block& b = blocks_[block];
    RT_ASSERT(b.ref_count > 0, "release of an unreferenced block", block);
    if (--b.ref_count > 0) continue;
    RT_ASSERT(used_count_ > 0);
    --used_count_;
    if (b.cached) {
      lru_push_back(block);
    } else {
      b.in_free = true;
      free_.push_back(block);
    }
  }
  RT_ASSERT(free_.size() + evictable_count_ + used_count_ == blocks_.size());
}

void PrefixCache::retain(std::span<const BlockIndex> blocks) {
  for (BlockIndex block : blocks) {
    RT_ASSERT(block < blocks_.size(), block);
    Block& b = blocks_[block];
    RT_ASSERT(b.ref_count > 0, "retain of an unreferenced block", block);
    RT_ASSERT(b.ref_count < UINT32_MAX, block);
    ++b.ref_count;
  }
}

void PrefixCache::unlink_child(BlockIndex block) {
  Block& b = blocks_[block];
  if (b.parent == none_) return;
  if (b.prev_sibling != none_)
    blocks_[b.prev_sibling].next_sibling = b.next_sibling;
  else
    blocks_[b.parent].first_child = b.next_sibling;
  if (b.next_sibling != none_) blocks_[b.next_sibling].prev_sibling = b.prev_sibling;
  b.parent = b.prev_sibling = b.next_sibling = none_;
}

void PrefixCache::uncache_subtree(BlockIndex root) {
  RT_ASSERT(blocks_[root].cached, root);
  subtree_scratch_.clear();
  subtree_scratch_.push_back(root);
  for (size_t i = 0; i < subtree_scratch_.size(); ++i) {
    for (BlockIndex c = blocks_[subtree_scratch_[i]].first_child; c != none_;
         c = blocks_[c].next_sibling) {
      subtree_scratch_.push_back(c);
      RT_ASSERT(subtree_scratch_.size() <= blocks_.size(), "chain cycle", root);
    }
  }
  unlink_child(root);
  for (BlockIndex at : subtree_scratch_) {
    Block& b = blocks_[at];
    RT_ASSERT(b.cached, at);
    by_hash_.erase(b.hash);
    note_event(b.hash, -1);
    b.cached = false;
    b.parent = b.first_child = b.next_sibling = b.prev_sibling = none_;
    b.depth = 0;
    if (at == root) continue;
    ++counters_.unreachable_count;
    if (b.ref_count == 0) {  // evictable: unreachable now, so free
      lru_unlink(at);
      b.in_free = true;
      free_.push_back(at);
    }
  }
}

void PrefixCache::fill_stored(std::vector<BlockHash> hashes, CacheEvents& out) const {
  struct Item {
    uint32_t depth;
    BlockIndex block;
  };
  std::vector<Item> items;
  items.reserve(hashes.size());
  for (const auto& hash : hashes) {
    auto it = by_hash_.find(hash);
    RT_ASSERT(it != by_hash_.end(), "a stored event for a hash no longer cached");
    items.push_back({blocks_[it->second].depth, it->second});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.depth != b.depth ? a.depth < b.depth : a.block < b.block;
  });
  out.stored.reserve(items.size());
  out.stored_parents.reserve(items.size());
  for (const Item& item : items) {
    const Block& b = blocks_[item.block];
    out.stored.push_back(b.hash);
    out.stored_parents.push_back(b.parent == none_ ? std::nullopt
                                                    : std::optional(blocks_[b.parent].hash));
  }
}

CacheEvents PrefixCache::drain_events() {
  CacheEvents out;
  std::vector<BlockHash> stored;
  for (const auto& [hash, delta] : pending_events_) {
    RT_ASSERT(delta == 1 || delta == -1, delta);
    (delta > 0 ? stored : out.removed).push_back(hash);
  }
  pending_events_.clear();
  fill_stored(std::move(stored), out);
  return out;
}

CacheEvents PrefixCache::snapshot() {
  pending_events_.clear();
  std::vector<BlockHash> all;
  all.reserve(by_hash_.size());
  for (const auto& [hash, block] : by_hash_) all.push_back(hash);
  CacheEvents out;
  fill_stored(std::move(all), out);
  return out;
}

void PrefixCache::note_event(const BlockHash& hash, int delta) {
  int& net = pending_events_[hash];
  net += delta;
  RT_ASSERT(net >= -1 && net <= 1, net);
  if (net == 0) pending_events_.erase(hash);
  RT_ASSERT(pending_events_.size() <= 2 * blocks_.size(), pending_events_.size());
}

void PrefixCache::lru_push_back(BlockIndex block) {
  Block& b = blocks_[block];
  RT_ASSERT(b.lru_prev == none_ && b.lru_next == none_ && lru_head_ != block, block);
  b.lru_prev = lru_tail_;
  if (lru_tail_ != none_) blocks_[lru_tail_].lru_next = block;
  lru_tail_ = block;
  if (lru_head_ == none_) lru_head_ = block;
  ++evictable_count_;
}

void PrefixCache::lru_unlink(BlockIndex block) {
  Block& b = blocks_[block];
  RT_ASSERT(evictable_count_ > 0, block);
  if (b.lru_prev != none_)
    blocks_[b.lru_prev].lru_next = b.lru_next;
  else
    lru_head_ = b.lru_next;
  if (b.lru_next != none_)
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  else
    lru_tail_ = b.lru_prev;
  b.lru_prev = b.lru_next = none_;
  --evictable_count_;
}

uint32_t PrefixCache::ref_count(BlockIndex block) const {
  RT_ASSERT(block < blocks_.size(), block);
  return blocks_[block].ref_count;
}

bool PrefixCache::is_cached(BlockIndex block) const {
  RT_ASSERT(block < blocks_.size(), block);
  return blocks_[block].cached;
}

void PrefixCache::check_invariants() const {
  uint32_t free_seen = 0, used_seen = 0, lru_seen = 0, cached_seen = 0;
  uint32_t with_parent_seen = 0, listed_seen = 0;
  for (BlockIndex i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    bool evictable = b.cached && b.ref_count == 0;
    // Exactly one state.
    RT_ASSERT(int{b.in_free} + int{evictable} + int{b.ref_count > 0} == 1, i);
    RT_ASSERT(!(b.in_free && b.cached), i);
    if (b.in_free) ++free_seen;
    if (b.ref_count > 0) ++used_seen;
    if (b.cached) {
      ++cached_seen;
      auto it = by_hash_.find(b.hash);
      RT_ASSERT(it != by_hash_.end() && it->second == i, i);
      // A cached block's chain is cached, and it is listed under its parent (counted below:
      // every listed child names its lister, and as many are listed as have a parent).
      if (b.parent != none_) {
        const Block& p = blocks_[b.parent];
        RT_ASSERT(p.cached && b.depth == p.depth + 1, i);
        ++with_parent_seen;
      } else {
        RT_ASSERT(b.depth == 0 && b.prev_sibling == none_ && b.next_sibling == none_, i);
      }
      BlockIndex prev_child = none_;
      for (BlockIndex c = b.first_child; c != none_; c = blocks_[c].next_sibling) {
        RT_ASSERT(blocks_[c].cached && blocks_[c].parent == i, i, c);
        RT_ASSERT(blocks_[c].prev_sibling == prev_child, i, c);
        RT_ASSERT(++listed_seen <= blocks_.size(), "child list cycle", i);
        prev_child = c;
      }
    } else {
      RT_ASSERT(b.parent == none_ && b.first_child == none_ && b.next_sibling == none_, i);
    }
  }
  BlockIndex prev = none_;
  for (BlockIndex at = lru_head_; at != none_; at = blocks_[at].lru_next) {
    RT_ASSERT(blocks_[at].cached && blocks_[at].ref_count == 0, at);
    RT_ASSERT(blocks_[at].lru_prev == prev, at);
    RT_ASSERT(++lru_seen <= blocks_.size(), "LRU cycle");
    prev = at;
  }
  RT_ASSERT(prev == lru_tail_);
  for (BlockIndex f : free_) RT_ASSERT(blocks_[f].in_free, f);
  RT_ASSERT(free_seen == free_.size(), free_seen, free_.size());
  RT_ASSERT(used_seen == used_count_, used_seen, used_count_);
  RT_ASSERT(lru_seen == evictable_count_, lru_seen, evictable_count_);
  RT_ASSERT(cached_seen == by_hash_.size(), cached_seen, by_hash_.size());
  RT_ASSERT(with_parent_seen == listed_seen, with_parent_seen, listed_seen);
  RT_ASSERT(free_seen + used_seen + lru_seen == blocks_.size());
}

}  // namespace tandem::kv
