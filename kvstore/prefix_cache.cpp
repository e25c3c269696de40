#include "kvstore/prefix_cache.hpp"

#include <algorithm>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::kv {

std::vector<BlockHash> block_hashes_of(std::span<const BlockHash> q, uint32_t k) {
  RT_ASSERT(k >= 1, k);
  std::vector<BlockHash> out;
  out.reserve(q.size() / k);
  for (size_t i = k; i <= q.size(); i += k) out.push_back(q[i - 1]);
  return out;
}

PrefixCache::PrefixCache(uint32_t blocks_count, uint32_t block_tokens, uint32_t sub_block_tokens)
    : blocks_(blocks_count), block_tokens_(block_tokens) {
  RT_ASSERT(blocks_count >= 1, blocks_count);
  RT_ASSERT(block_tokens >= 1, block_tokens);
  if (sub_block_tokens == 0) sub_block_tokens = block_tokens;
  RT_ASSERT(sub_block_tokens <= block_tokens && block_tokens % sub_block_tokens == 0,
            block_tokens, sub_block_tokens);
  k_ = block_tokens / sub_block_tokens;
  slot_hashes_.resize(size_t{blocks_count} * k_);
  free_.reserve(blocks_count);
  // Stack: block 0 is handed out first.
  for (uint32_t i = blocks_count; i > 0; --i) {
    free_.push_back(i - 1);
    blocks_[i - 1].in_free = true;
  }
  by_hash_.reserve(size_t{blocks_count} * k_);
}

void PrefixCache::walk(std::span<const BlockHash> hashes,
                       std::vector<BlockIndex>& holders) const {
  holders.clear();
  for (size_t t = 0; t < hashes.size(); ++t) {
    auto it = by_hash_.find(hashes[t]);
    // A hash cached at another slot than its position's (a malformed list): no match.
    if (it == by_hash_.end() || it->second.slot != t % k_) break;
    RT_ASSERT(blocks_[it->second.block].cached(), it->second.block);
    holders.push_back(it->second.block);
  }
}

uint32_t PrefixCache::match(std::span<const BlockHash> hashes) const {
  uint32_t matched = 0;
  for (size_t t = 0; t < hashes.size(); ++t) {
    auto it = by_hash_.find(hashes[t]);
    if (it == by_hash_.end() || it->second.slot != t % k_) break;
    ++matched;
  }
  return matched;
}

Result<Allocation> PrefixCache::acquire(std::span<const BlockHash> hashes, uint32_t fresh_count,
                                        uint32_t query_blocks_count, Query query) {
  // The blocks holding the leading cached hashes, looked up once.
  walk(hashes, matched_scratch_);
  auto matched = static_cast<uint32_t>(matched_scratch_.size());
  uint32_t full = matched / k_;
  uint32_t partial = matched % k_;
  // The blocks to reference: each full block position's holder of its last slot, and the
  // holder of the last matched entry when the match ends inside a block.
  distinct_scratch_.clear();
  for (uint32_t i = 0; i < full; ++i) distinct_scratch_.push_back(matched_scratch_[k_ * i + k_ - 1]);
  if (partial > 0) distinct_scratch_.push_back(matched_scratch_[matched - 1]);
  const size_t referenced = distinct_scratch_.size();
  // Distinct evictable ones: a (malformed) hash list may repeat a hash.
  std::vector<BlockIndex>& evictable = subtree_scratch_;
  evictable.clear();
  for (BlockIndex b : distinct_scratch_) {
    if (blocks_[b].ref_count == 0) evictable.push_back(b);
  }
  std::sort(evictable.begin(), evictable.end());
  auto matched_evictable = static_cast<uint32_t>(
      std::unique(evictable.begin(), evictable.end()) - evictable.begin());
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
  out.cached.reserve(full);
  out.fresh.reserve(fresh_count);
  for (size_t i = 0; i < referenced; ++i) {
    BlockIndex b = distinct_scratch_[i];
    if (blocks_[b].ref_count == 0) {
      lru_unlink(b);
      ++used_count_;
    }
    ++blocks_[b].ref_count;
    if (i < full) {
      out.cached.push_back(b);
    } else {
      out.partial_source = b;
      out.partial_sub_blocks = partial;
    }
  }
  for (uint32_t i = 0; i < fresh_count; ++i) out.fresh.push_back(take_fresh());
  RT_ASSERT(out.fresh.size() == fresh_count, out.fresh.size());
  if (query == Query::internal) return out;
  ++counters_.queries_count;
  uint64_t query_blocks = std::max<uint64_t>(hashes.size(), query_blocks_count);
  counters_.query_blocks_count += query_blocks;
  counters_.query_tokens_count += query_blocks * sub_block_tokens();
  counters_.hit_blocks_count += matched;
  counters_.hit_tokens_count += uint64_t{matched} * sub_block_tokens();
  if (partial > 0) ++counters_.partial_hits_count;
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
    RT_ASSERT(blocks_[b].cached() && blocks_[b].ref_count == 0, b);
    lru_unlink(b);
    // Slots a branch below also holds go to it; the rest (and what hangs off it) goes.
    if (!hand_over(b)) uncache_subtree(b);
    ++counters_.evictions_count;
  }
  RT_ASSERT(blocks_[b].ref_count == 0, b);
  blocks_[b].ref_count = 1;
  ++used_count_;
  return b;
}

CommitOutcome PrefixCache::commit(BlockIndex block, const BlockHash& hash,
                                  const std::optional<BlockHash>& parent) {
  RT_ASSERT(k_ == 1, "whole-block commit with sub-blocks", k_);
  return commit(block, std::span<const BlockHash>(&hash, 1), parent);
}

CommitOutcome PrefixCache::commit(BlockIndex block, std::span<const BlockHash> slots,
                                  const std::optional<BlockHash>& parent) {
  RT_ASSERT(block < blocks_.size(), block);
  Block& b = blocks_[block];
  RT_ASSERT(b.ref_count > 0, "commit of an unreferenced block", block);
  RT_ASSERT(!slots.empty() && slots.size() <= k_, slots.size(), k_);
  const auto n = static_cast<uint32_t>(slots.size());
  uint32_t s = 0;
  if (b.cached()) {
    for (uint32_t i = b.first; i < b.fill && i < n; ++i) {
      RT_ASSERT(slot_hash(block, i) == slots[i], "commit changes a cached entry", block, i);
    }
    if (n <= b.fill) return CommitOutcome::duplicate;
    s = b.fill;
  } else {
    // The leading slots other blocks hold (the KV was copied from them, or computed twice).
    while (s < n) {
      auto it = by_hash_.find(slots[s]);
      if (it == by_hash_.end()) break;
      if (it->second.slot != s || it->second.block == block) return CommitOutcome::duplicate;
      ++s;
    }
    if (s == n) return CommitOutcome::duplicate;
    BlockIndex parent_block = none_;
    uint32_t base = 0;
    if (s > 0) {
      const EntryAt& at = by_hash_.at(slots[s - 1]);
      parent_block = at.block;
      base = blocks_[parent_block].base_depth;
    } else if (parent) {
      auto it = by_hash_.find(*parent);
      if (it == by_hash_.end() || it->second.slot != k_ - 1) return CommitOutcome::orphan;
      parent_block = it->second.block;
      base = blocks_[parent_block].base_depth + k_;
    }
    b.first = b.fill = s;
    b.base_depth = base;
    if (parent_block != none_) link_child(parent_block, block);
    ++cached_count_;
  }
  // Register in chain order while no other block holds the slot (one that does starts a
  // branch of its own under this block: this block stops there).
  const uint32_t registered_from = s;
  while (s < n && !by_hash_.contains(slots[s])) {
    by_hash_.emplace(slots[s], EntryAt{block, s});
    slot_hashes_[size_t{block} * k_ + s] = slots[s];
    note_event(slots[s], +1);
    ++s;
  }
  b.fill = s;
  RT_ASSERT(b.cached(), block);
  RT_ASSERT(by_hash_.size() <= size_t{blocks_.size()} * k_, by_hash_.size());
  if (s == registered_from) return CommitOutcome::duplicate;
  take_over_dominated(block);
  return CommitOutcome::stored;
}

uint32_t PrefixCache::commit_prefix(std::span<const BlockIndex> blocks,
                                    std::span<const BlockHash> hashes, uint32_t committed,
                                    uint32_t computed_tokens) {
  const auto done = std::min<uint32_t>(computed_tokens / sub_block_tokens(),
                                       static_cast<uint32_t>(hashes.size()));
  PrefixHashes q{hashes, k_};
  for (uint32_t i = committed / k_; i * k_ < done; ++i) {
    const uint32_t n = std::min(k_, done - i * k_);
    if (i * k_ + n <= committed) continue;
    RT_ASSERT(i < blocks.size(), i, blocks.size());
    (void)commit(blocks[i], q.slots(i, n), q.parent(i));
  }
  return std::max(committed, done);
}

void PrefixCache::move_entries(BlockIndex from, BlockIndex to, uint32_t begin, uint32_t end) {
  for (uint32_t slot = begin; slot < end; ++slot) {
    const BlockHash& hash = slot_hash(from, slot);
    by_hash_.at(hash) = EntryAt{to, slot};
    slot_hashes_[size_t{to} * k_ + slot] = hash;
  }
}

void PrefixCache::uncache_empty(BlockIndex block) {
  Block& b = blocks_[block];
  RT_ASSERT(b.first_child == none_ && b.parent == none_, block);
  b.first = b.fill = 0;
  b.base_depth = 0;
  RT_ASSERT(cached_count_ > 0);
  --cached_count_;
}

void PrefixCache::take_over_dominated(BlockIndex block) {
  Block& z = blocks_[block];
  while (z.first > 0) {
    const BlockIndex pi = z.parent;
    RT_ASSERT(pi != none_, block);
    Block& p = blocks_[pi];
    RT_ASSERT(p.cached() && p.first < z.first && z.first <= p.fill &&
                  p.base_depth == z.base_depth,
              block, pi);
    // p holds a diverging slot too (a branch): it stays, this block stays below it; an
    // eviction of p hands its shared slots over (hand_over).
    if (p.fill != z.first) break;
    move_entries(pi, block, p.first, p.fill);
    unlink_child(block);
    // p's other children hang off entries this block holds now.
    while (p.first_child != none_) {
      const BlockIndex c = p.first_child;
      unlink_child(c);
      link_child(block, c);
    }
    const BlockIndex grand = p.parent;
    unlink_child(pi);
    if (grand != none_) link_child(grand, block);
    z.first = p.first;
    uncache_empty(pi);
    ++counters_.merged_count;
    if (p.ref_count == 0) {  // evictable before: nothing holds it now
      lru_unlink(pi);
      p.in_free = true;
      free_.push_back(pi);
    }
  }
}

bool PrefixCache::hand_over(BlockIndex block) {
  Block& b = blocks_[block];
  RT_ASSERT(b.cached(), block);
  // The child at this block position that branched off last holds the KV of every slot
  // before its branch point.
  BlockIndex heir = none_;
  for (BlockIndex c = b.first_child; c != none_; c = blocks_[c].next_sibling) {
    const Block& cb = blocks_[c];
    if (cb.first > 0 && (heir == none_ || cb.first > blocks_[heir].first)) heir = c;
  }
  if (heir == none_) return false;
  Block& h = blocks_[heir];
  const uint32_t r = h.first;
  RT_ASSERT(b.first < r && r <= b.fill && h.base_depth == b.base_depth, block, heir);
  move_entries(block, heir, b.first, r);
  unlink_child(heir);
  // Children hanging off the slots the heir holds now follow them.
  for (BlockIndex c = b.first_child; c != none_;) {
    const BlockIndex next = blocks_[c].next_sibling;
    const uint32_t parent_slot = blocks_[c].first > 0 ? blocks_[c].first - 1 : k_ - 1;
    if (parent_slot < r) {
      unlink_child(c);
      link_child(heir, c);
    }
    c = next;
  }
  const BlockIndex parent = b.parent;
  unlink_child(block);
  if (parent != none_) link_child(parent, heir);
  h.first = b.first;
  ++counters_.handed_over_count;
  if (r == b.fill) {  // the heir took everything: nothing left to uncache
    uncache_empty(block);
    return true;
  }
  // This block keeps its own branch [r, fill), now below the heir.
  b.first = r;
  link_child(heir, block);
  return false;
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
    if (b.cached()) {
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

void PrefixCache::link_child(BlockIndex parent, BlockIndex block) {
  Block& b = blocks_[block];
  Block& p = blocks_[parent];
  RT_ASSERT(b.parent == none_ && b.prev_sibling == none_ && b.next_sibling == none_, block);
  b.parent = parent;
  b.next_sibling = p.first_child;
  if (p.first_child != none_) blocks_[p.first_child].prev_sibling = block;
  p.first_child = block;
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
  RT_ASSERT(blocks_[root].cached(), root);
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
    RT_ASSERT(b.cached(), at);
    for (uint32_t slot = b.first; slot < b.fill; ++slot) {
      by_hash_.erase(slot_hash(at, slot));
      note_event(slot_hash(at, slot), -1);
    }
    b.first = b.fill = 0;
    b.base_depth = 0;
    b.parent = b.first_child = b.next_sibling = b.prev_sibling = none_;
    RT_ASSERT(cached_count_ > 0);
    --cached_count_;
    if (at == root) continue;
    ++counters_.unreachable_count;
    if (b.ref_count == 0) {  // evictable: unreachable now, so free
      lru_unlink(at);
      b.in_free = true;
      free_.push_back(at);
    }
  }
}

std::optional<BlockHash> PrefixCache::entry_parent(BlockIndex block, uint32_t slot) const {
  const Block& b = blocks_[block];
  if (slot > b.first) return slot_hash(block, slot - 1);
  if (b.parent == none_) return std::nullopt;
  return slot_hash(b.parent, slot > 0 ? slot - 1 : k_ - 1);
}

void PrefixCache::fill_stored(std::vector<BlockHash> hashes, CacheEvents& out) const {
  struct Item {
    uint32_t depth;
    EntryAt at;
  };
  std::vector<Item> items;
  items.reserve(hashes.size());
  for (const auto& hash : hashes) {
    auto it = by_hash_.find(hash);
    RT_ASSERT(it != by_hash_.end(), "a stored event for a hash no longer cached");
    items.push_back({blocks_[it->second.block].base_depth + it->second.slot, it->second});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.at.block != b.at.block ? a.at.block < b.at.block : a.at.slot < b.at.slot;
  });
  out.stored.reserve(items.size());
  out.stored_parents.reserve(items.size());
  for (const Item& item : items) {
    out.stored.push_back(slot_hash(item.at.block, item.at.slot));
    out.stored_parents.push_back(entry_parent(item.at.block, item.at.slot));
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
  for (const auto& [hash, at] : by_hash_) all.push_back(hash);
  CacheEvents out;
  fill_stored(std::move(all), out);
  return out;
}

void PrefixCache::note_event(const BlockHash& hash, int delta) {
  int& net = pending_events_[hash];
  net += delta;
  RT_ASSERT(net >= -1 && net <= 1, net);
  if (net == 0) pending_events_.erase(hash);
  RT_ASSERT(pending_events_.size() <= 2 * slot_hashes_.size(), pending_events_.size());
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
  return blocks_[block].cached();
}

void PrefixCache::check_invariants() const {
  uint32_t free_seen = 0, used_seen = 0, lru_seen = 0, cached_seen = 0;
  uint32_t with_parent_seen = 0, listed_seen = 0;
  size_t entries_seen = 0;
  for (BlockIndex i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    bool evictable = b.cached() && b.ref_count == 0;
    // Exactly one state.
    RT_ASSERT(int{b.in_free} + int{evictable} + int{b.ref_count > 0} == 1, i);
    RT_ASSERT(!(b.in_free && b.cached()), i);
    RT_ASSERT(b.first <= b.fill && b.fill <= k_, i, b.first, b.fill);
    if (b.in_free) ++free_seen;
    if (b.ref_count > 0) ++used_seen;
    if (b.cached()) {
      ++cached_seen;
      RT_ASSERT(b.base_depth % k_ == 0, i, b.base_depth);
      for (uint32_t slot = b.first; slot < b.fill; ++slot) {
        auto it = by_hash_.find(slot_hash(i, slot));
        RT_ASSERT(it != by_hash_.end() && it->second.block == i && it->second.slot == slot, i,
                  slot);
        ++entries_seen;
      }
      // A cached block's chain is cached, and it is listed under its parent (counted below:
      // every listed child names its lister, and as many are listed as have a parent).
      if (b.parent != none_) {
        const Block& p = blocks_[b.parent];
        RT_ASSERT(p.cached(), i);
        if (b.first > 0) {  // the parent holds the slot before, at the same position
          RT_ASSERT(p.base_depth == b.base_depth && p.first < b.first && p.fill >= b.first, i);
        } else {  // the parent is the previous position's full block
          RT_ASSERT(p.fill == k_ && b.base_depth == p.base_depth + k_, i);
        }
        ++with_parent_seen;
      } else {
        RT_ASSERT(b.first == 0 && b.base_depth == 0, i);
        RT_ASSERT(b.prev_sibling == none_ && b.next_sibling == none_, i);
      }
      BlockIndex prev_child = none_;
      for (BlockIndex c = b.first_child; c != none_; c = blocks_[c].next_sibling) {
        RT_ASSERT(blocks_[c].cached() && blocks_[c].parent == i, i, c);
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
    RT_ASSERT(blocks_[at].cached() && blocks_[at].ref_count == 0, at);
    RT_ASSERT(blocks_[at].lru_prev == prev, at);
    RT_ASSERT(++lru_seen <= blocks_.size(), "LRU cycle");
    prev = at;
  }
  RT_ASSERT(prev == lru_tail_);
  for (BlockIndex f : free_) RT_ASSERT(blocks_[f].in_free, f);
  RT_ASSERT(free_seen == free_.size(), free_seen, free_.size());
  RT_ASSERT(used_seen == used_count_, used_seen, used_count_);
  RT_ASSERT(lru_seen == evictable_count_, lru_seen, evictable_count_);
  RT_ASSERT(cached_seen == cached_count_, cached_seen, cached_count_);
  RT_ASSERT(entries_seen == by_hash_.size(), entries_seen, by_hash_.size());
  RT_ASSERT(with_parent_seen == listed_seen, with_parent_seen, listed_seen);
  RT_ASSERT(free_seen + used_seen + lru_seen == blocks_.size());
}

}  // namespace tandem::kv
