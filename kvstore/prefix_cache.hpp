// The device KV block pool and its prefix cache: a pure core (no threads, clocks or I/O).
//
// A pool of `blocks_count` blocks, BlockIndex 0..blocks_count-1. Every block is in exactly
// one state:
//   free        holds nothing useful; on the free list;
//   evictable   cached (full, known hash) and unreferenced; on the LRU list, kept until a
//               fresh block is needed and no free block is left;
//   referenced  ref_count > 0, owned by one or more requests; cached (shared through its
//               hash) or private (a fresh block being filled, or a duplicate).
// Eviction takes the least recently released evictable block. release() walks a request's
// blocks from last to first, so a prefix's tail is evicted before its head.
//
// Chains: a block committed with a parent hash hangs under the cached block of that hash, and
// a cached block's parent is always cached (a block is reachable by match() only through its
// whole chain). Evicting a block therefore uncaches its cached descendants too: unreferenced
// ones go back to the free list, referenced ones become private (freed on release). So the
// cached set is exactly what match() can reach, and the events below describe it exactly
// (the router's precise index, issue 13).
//
// Owned by one actor (prefill or decode). Every map and list is bounded by blocks_count.
// Cost: match O(hashes), acquire O(hashes + fresh), release O(blocks), commit O(1) average.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvstore/block_hash.hpp"
#include "runtime/base/result.hpp"

namespace tandem::kv {

struct Allocation {
  std::vector<BlockIndex> cached;  // the leading hashes' blocks, in order (ref_count +1 each)
  std::vector<BlockIndex> fresh;   // private blocks for the caller to fill (ref_count 1)
};

enum class CommitOutcome {
  stored,     // the block is now cached under the hash
  duplicate,  // another block already holds this hash; this one stays private
  orphan,     // its parent hash is not cached (evicted meanwhile): it stays private
};

struct PrefixCacheCounters {
  uint64_t queries_count = 0;       // successful acquire() calls
  uint64_t query_blocks_count = 0;  // prompt blocks asked for by successful acquire() calls
  uint64_t hit_blocks_count = 0;    // of those, served from the cache
  uint64_t hit_tokens_count = 0;    // hit_blocks_count x block_tokens
  uint64_t query_tokens_count = 0;  // query_blocks_count x block_tokens
  uint64_t evictions_count = 0;     // evictable blocks reclaimed for fresh use
  uint64_t overloaded_count = 0;    // acquire() refused for lack of blocks
  uint64_t unreachable_count = 0;   // cached descendants uncached with an evicted block
};

// Net change of the cached hash set since the last drain (stored and removed are disjoint:
// a hash stored then removed in the same window appears in neither). Applying `removed`
// (each with its cached descendants) and then `stored` in order to the set as it was at the
// last drain gives the set as it is: stored is in chain order (by depth: a block's parent is
// cached before the drain or listed earlier), stored_parents[i] is stored[i]'s parent hash
// (nullopt: the first block of a chain).
struct CacheEvents {
  std::vector<BlockHash> stored;
  std::vector<std::optional<BlockHash>> stored_parents;  // parallel to stored
  std::vector<BlockHash> removed;
};

// The parent hash of chain position `i` of a prompt's `hashes` (nullopt: the first block).
inline std::optional<BlockHash> chain_parent(std::span<const BlockHash> hashes, size_t i) {
  return i == 0 ? std::nullopt : std::optional<BlockHash>(hashes[i - 1]);
}

class PrefixCache {
 public:
  // Preconditions (asserted): blocks_count >= 1, block_tokens >= 1.
  PrefixCache(uint32_t blocks_count, uint32_t block_tokens);

  // How many leading hashes are cached. No side effects (counters and LRU untouched).
  uint32_t match(std::span<const BlockHash> hashes) const;

  // Takes a reference on the cached blocks of the leading cached hashes and allocates
  // `fresh_count` private blocks (free ones first, then evicting LRU-oldest evictable ones).
  // Errors: overloaded when free + evictable (excluding the matched ones) < fresh_count;
  // nothing changes then (except overloaded_count).
  // `query_blocks_count`: the prompt's full blocks this acquire answers for, when the caller
  // offers only a prefix of them (e.g. it recomputes the last cached block); the query
  // counters count max(hashes.size(), query_blocks_count) blocks, hits count the matched.
  // `query`: a prompt's lookup (counted) or an internal fill that is no prompt's query (e.g.
  // tier 2 bringing blocks back while holding the prompt's cached head): not counted.
  enum class Query { prompt, internal };
  Result<Allocation> acquire(std::span<const BlockHash> hashes, uint32_t fresh_count,
                             uint32_t query_blocks_count = 0, Query query = Query::prompt);

  // A private block the caller owns has been filled with the full block `hash`: cache it,
  // under the cached block of `parent` (the previous block of its chain; nullopt: the first).
  // Preconditions (asserted): block is referenced and not cached.
  CommitOutcome commit(BlockIndex block, const BlockHash& hash,
                       const std::optional<BlockHash>& parent = std::nullopt);

  // Drops one reference per listed block, from last to first. A block reaching ref_count 0
  // becomes evictable (cached) or free (private). Preconditions (asserted): each listed
  // block is referenced (listing a block twice drops two references).
  void release(std::span<const BlockIndex> blocks);
  // Takes one more reference on each listed block, already referenced by the caller (e.g. a
  // copy to tier 2 pins a request's blocks beyond its own hold); release() drops it. No
  // counters change. Preconditions (asserted): each block is referenced.
  void retain(std::span<const BlockIndex> blocks);

  CacheEvents drain_events();  // and starts a new window
  bool has_events() const { return !pending_events_.empty(); }
  // Everything cached, as `stored` events in chain order (removed empty), and starts a new
  // event window (what was pending is part of the snapshot). O(cached log cached).
  CacheEvents snapshot();
  // Whether `hash` is cached (reachable by match()).
  bool holds(const BlockHash& hash) const { return by_hash_.contains(hash); }

  uint32_t blocks_count() const { return static_cast<uint32_t>(blocks_.size()); }
  uint32_t block_tokens() const { return block_tokens_; }
  uint32_t blocks_free_count() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t blocks_evictable_count() const { return evictable_count_; }
  uint32_t blocks_used_count() const { return used_count_; }  // referenced
  uint32_t blocks_cached_count() const { return static_cast<uint32_t>(by_hash_.size()); }
  // free + evictable: what acquire() can hand out as fresh right now.
  uint32_t blocks_available_count() const { return blocks_free_count() + evictable_count_; }
  uint32_t ref_count(BlockIndex block) const;
  bool is_cached(BlockIndex block) const;
  const PrefixCacheCounters& counters() const { return counters_; }

  // Full O(blocks_count) consistency check; aborts (RT_ASSERT) on any violation. For tests
  // and debug builds of the shells.
  void check_invariants() const;

 private:
  static constexpr BlockIndex none_ = UINT32_MAX;
  struct Block {
    uint32_t ref_count = 0;
    bool cached = false;
    bool in_free = false;
    BlockHash hash{};
    BlockIndex lru_prev = none_;  // valid only while evictable
    BlockIndex lru_next = none_;
    // While cached: the chain. parent: the cached block of the parent hash (none_: a first
    // block); children: the cached blocks under this one, an intrusive sibling list.
    BlockIndex parent = none_;
    uint32_t depth = 0;  // 0 for a first block
    BlockIndex first_child = none_;
    BlockIndex next_sibling = none_;
    BlockIndex prev_sibling = none_;
  };

  BlockIndex take_fresh();
  void lru_push_back(BlockIndex block);
  void lru_unlink(BlockIndex block);
  void note_event(const BlockHash& hash, int delta);
  // Uncaches `block` and its cached descendants (events, chain links); descendants with no
  // reference go back to the free list. `block` itself is left to the caller.
  void uncache_subtree(BlockIndex block);
  void unlink_child(BlockIndex block);
  // The stored events for `hashes` (all cached), sorted by depth, with their parents.
  void fill_stored(std::vector<BlockHash> hashes, CacheEvents& out) const;

  std::vector<Block> blocks_;
  std::vector<BlockIndex> free_;  // stack
  BlockIndex lru_head_ = none_;   // oldest evictable
  BlockIndex lru_tail_ = none_;   // newest evictable
  uint32_t evictable_count_ = 0;
  uint32_t used_count_ = 0;
  uint32_t block_tokens_ = 0;
  std::unordered_map<BlockHash, BlockIndex, BlockHashHasher> by_hash_;  // <= blocks_count
  std::unordered_map<BlockHash, int, BlockHashHasher> pending_events_;  // <= 2 x blocks_count
  // acquire()'s scratch (reused: no allocation once warm), each <= the hashes offered.
  std::vector<BlockIndex> matched_scratch_, distinct_scratch_, subtree_scratch_;
  PrefixCacheCounters counters_;
};

}  // namespace tandem::kv
