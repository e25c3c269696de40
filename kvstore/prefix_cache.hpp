// The device KV block pool and its prefix cache: a pure core (no threads, clocks or I/O).
//
// A pool of `blocks_count` blocks, BlockIndex 0..blocks_count-1, of block_tokens tokens each.
// Every block is in exactly one state:
//   free        holds nothing useful; on the free list;
//   evictable   cached (holds at least one entry, below) and unreferenced; on the LRU list,
//               kept until a fresh block is needed and no free block is left;
//   referenced  ref_count > 0, owned by one or more requests; cached (shared through its
//               entries) or private (a fresh block being filled, or a duplicate).
// Eviction takes the least recently released evictable block. release() walks a request's
// blocks from last to first, so a prefix's tail is evicted before its head.
//
// Sub-blocks (issue 13). The cache matches at sub_block_tokens granularity (S, dividing
// block_tokens B; k = B / S sub-blocks per block; S == B: whole blocks, k = 1). A prompt is
// described by its prefix hashes q_0, q_1, ...: one per FULL sub-block, chained (q_t names
// tokens [0, (t+1) S)); q_{k i + k - 1} is block i's hash. An ENTRY is one cached q_t: the
// block holding it has valid KV for every position of sub-blocks 0..t mod k of its block
// position. A cached block holds the entries of a contiguous slot range [first, fill) of one
// block position (fill == k: the block is full); the slots before `first` are held by the
// entry's parent block at the same position (the KV is in this block too: it was copied from
// there). So a prompt that shares 3,900 tokens of a 4096-token block finds the entry of its
// 7th sub-block, copies those 3,584 tokens' KV out of the holder into a fresh block and
// computes from there. A partial block (fill < k, e.g. a prompt's last block) is cached too.
// When a block registers entries right after those of a partial block whose range ends where
// its own begins, it holds everything that block holds: it takes over that block's entries
// (no event: the hashes stay cached) and the dominated block is uncached (freed when
// unreferenced), so a session's growing last block costs one block, not one per turn. A
// block that branches off inside another's range stays below it; when the other is evicted,
// the branch takes over the shared slots (it holds their KV) instead of losing them, so an
// old block is never an ancestor whose eviction takes a newer session's blocks with it.
//
// Chains: an entry's parent is the previous q of its chain, and a cached entry's parent is
// always cached (an entry is reachable by match() only through its whole chain). Evicting a
// block therefore uncaches its entries' cached descendants too: blocks left with no entry go
// back to the free list when unreferenced and become private when referenced. So the cached
// set is exactly what match() can reach, and the events below describe it exactly (the
// router's precise index, issue 13).
//
// Owned by one actor (prefill or decode). Every map and list is bounded by blocks_count x k.
// Cost: match O(hashes), acquire O(hashes + fresh), release O(blocks), commit O(k) average.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvstore/block_hash.hpp"
#include "runtime/base/result.hpp"

namespace tandem::kv {

struct Allocation {
  std::vector<BlockIndex> cached;  // the leading FULL blocks matched, in order (ref_count +1)
  std::vector<BlockIndex> fresh;   // private blocks for the caller to fill (ref_count 1)
  // When the matched sub-blocks end inside a block: the block holding them (ref_count +1;
  // the caller copies it into fresh[0] and then release()s it) and how many sub-blocks of
  // it are valid. nullopt/0 otherwise.
  std::optional<BlockIndex> partial_source;
  uint32_t partial_sub_blocks = 0;
};

enum class CommitOutcome {
  stored,     // the block now holds at least one new entry
  duplicate,  // other blocks already hold every offered hash; nothing changed
  orphan,     // its parent hash is not cached (evicted meanwhile): nothing changed
};

// Query and hit counts are in sub-blocks (= blocks when sub_block_tokens == block_tokens).
struct PrefixCacheCounters {
  uint64_t queries_count = 0;       // successful acquire() calls
  uint64_t query_blocks_count = 0;  // prompt sub-blocks asked for by successful acquire()s
  uint64_t hit_blocks_count = 0;    // of those, served from the cache
  uint64_t hit_tokens_count = 0;    // hit_blocks_count x sub_block_tokens
  uint64_t query_tokens_count = 0;  // query_blocks_count x sub_block_tokens
  uint64_t partial_hits_count = 0;  // acquires whose match ended inside a block (a copy)
  uint64_t merged_count = 0;        // partial blocks taken over by a block holding more
  uint64_t handed_over_count = 0;   // evictions whose shared slots a branch below took over
  uint64_t evictions_count = 0;     // evictable blocks reclaimed for fresh use
  uint64_t overloaded_count = 0;    // acquire() refused for lack of blocks
  uint64_t unreachable_count = 0;   // cached descendants uncached with an evicted block
};

// Net change of the cached entry (hash) set since the last drain (stored and removed are disjoint:
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

// A prompt's prefix hashes (one per full sub-block) seen as blocks: k per block.
struct PrefixHashes {
  std::span<const BlockHash> q;  // q_0, q_1, ...
  uint32_t k = 1;                // sub-blocks per block
  size_t full_blocks() const { return q.size() / k; }
  const BlockHash& block(size_t i) const { return q[k * i + k - 1]; }  // i < full_blocks()
  // Block i's slots [0, n) and the hash before slot 0 (nullopt for block 0).
  std::span<const BlockHash> slots(size_t i, size_t n) const { return q.subspan(k * i, n); }
  std::optional<BlockHash> parent(size_t i) const { return chain_parent(q, k * i); }
  // Sub-blocks of block position i the prompt has (k for a full block; fewer for its
  // trailing partial block; 0 past it).
  uint32_t sub_blocks(size_t i) const {
    return k * i >= q.size() ? 0 : static_cast<uint32_t>(std::min<size_t>(k, q.size() - k * i));
  }
  // Whether `h` is block i's prefix hash of its first m < k sub-blocks (a partial block of
  // this prompt): that m, else 0.
  uint32_t partial_of(size_t i, const BlockHash& h) const {
    const uint32_t n = sub_blocks(i);
    for (uint32_t j = 0; j < n && j + 1 < k; ++j) {
      if (q[k * i + j] == h) return j + 1;
    }
    return 0;
  }
};
// Every k-th prefix hash: the full blocks' hashes.
std::vector<BlockHash> block_hashes_of(std::span<const BlockHash> q, uint32_t k);

class PrefixCache {
 public:
  // Preconditions (asserted): blocks_count >= 1, block_tokens >= 1, sub_block_tokens
  // divides block_tokens (0: = block_tokens, whole blocks).
  PrefixCache(uint32_t blocks_count, uint32_t block_tokens, uint32_t sub_block_tokens = 0);

  // How many leading prefix hashes (sub-blocks) are cached. No side effects (counters and
  // LRU untouched).
  uint32_t match(std::span<const BlockHash> hashes) const;

  // Takes a reference on the blocks holding the leading cached prefix hashes (the full ones
  // in `cached`, a trailing partial one as `partial_source`) and allocates `fresh_count`
  // private blocks (free ones first, then evicting LRU-oldest evictable ones).
  // Errors: overloaded when free + evictable (excluding the matched ones) < fresh_count;
  // nothing changes then (except overloaded_count).
  // `query_blocks_count`: the prompt's full sub-blocks this acquire answers for, when the
  // caller offers only a prefix of them (e.g. it recomputes the last cached one); the query
  // counters count max(hashes.size(), query_blocks_count), hits count the matched.
  // `query`: a prompt's lookup (counted) or an internal fill that is no prompt's query (e.g.
  // tier 2 bringing blocks back while holding the prompt's cached head): not counted.
  enum class Query { prompt, internal };
  Result<Allocation> acquire(std::span<const BlockHash> hashes, uint32_t fresh_count,
                             uint32_t query_blocks_count = 0, Query query = Query::prompt);

  // A block the caller owns holds valid KV for sub-blocks [0, slots.size()) of its block
  // position, whose prefix hashes are `slots` (<= k of them); `parent` is the prefix hash
  // before slot 0 (nullopt: block position 0). Registers the entries no other block holds
  // (those before are held by blocks the KV was copied from), in chain order, then takes
  // over the slots before them (see above). Calling it again as the block fills registers
  // the new slots. Preconditions (asserted): block is referenced, 1 <= slots.size() <= k;
  // when it is cached, slots extend the hashes it holds.
  CommitOutcome commit(BlockIndex block, std::span<const BlockHash> slots,
                       const std::optional<BlockHash>& parent);
  // A prompt's blocks (`blocks[i]` holds block position i) now hold valid KV for its first
  // `computed_tokens` tokens; sub-blocks [0, committed) were committed before. Commits every
  // block position with sub-blocks newly complete (duplicate or orphan: nothing) and returns
  // the new `committed` (<= hashes.size()). Precondition (asserted): blocks cover them.
  uint32_t commit_prefix(std::span<const BlockIndex> blocks, std::span<const BlockHash> hashes,
                         uint32_t committed, uint32_t computed_tokens);
  // Whole blocks (k == 1, asserted): the full block `hash`.
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
  // Whether `hash` is cached (an entry reachable by match()).
  bool holds(const BlockHash& hash) const { return by_hash_.contains(hash); }
  // Cached entries (prefix hashes); blocks_cached_count() counts the blocks holding them.
  uint32_t entries_count() const { return static_cast<uint32_t>(by_hash_.size()); }

  uint32_t blocks_count() const { return static_cast<uint32_t>(blocks_.size()); }
  uint32_t block_tokens() const { return block_tokens_; }
  uint32_t sub_block_tokens() const { return block_tokens_ / k_; }
  uint32_t sub_blocks_per_block() const { return k_; }
  uint32_t blocks_free_count() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t blocks_evictable_count() const { return evictable_count_; }
  uint32_t blocks_used_count() const { return used_count_; }  // referenced
  uint32_t blocks_cached_count() const { return cached_count_; }
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
    bool in_free = false;
    // Entries: slots [first, fill) of its block position; cached iff fill > first.
    uint32_t first = 0;
    uint32_t fill = 0;
    uint32_t base_depth = 0;  // chain depth (q index) of slot 0 of its block position
    BlockIndex lru_prev = none_;  // valid only while evictable
    BlockIndex lru_next = none_;
    // While cached: the chain. parent: the block holding the entry before slot `first`
    // (none_: block position 0 from slot 0); children: the cached blocks whose first entry's
    // parent this block holds, an intrusive sibling list.
    BlockIndex parent = none_;
    BlockIndex first_child = none_;
    BlockIndex next_sibling = none_;
    BlockIndex prev_sibling = none_;
    bool cached() const { return fill > first; }
  };
  struct EntryAt {
    BlockIndex block = 0;
    uint32_t slot = 0;
  };

  BlockIndex take_fresh();
  void lru_push_back(BlockIndex block);
  void lru_unlink(BlockIndex block);
  void note_event(const BlockHash& hash, int delta);
  // The block holding the leading entries of `hashes`, one per matched prefix hash (at its
  // own slot: a hash found at another slot ends the match).
  void walk(std::span<const BlockHash> hashes, std::vector<BlockIndex>& holders) const;
  // Uncaches `block` and its cached descendants (events, chain links); descendants with no
  // reference go back to the free list. `block` itself is left to the caller.
  void uncache_subtree(BlockIndex block);
  void link_child(BlockIndex parent, BlockIndex block);
  void unlink_child(BlockIndex block);
  void take_over_dominated(BlockIndex block);
  // Before evicting `block`: its same-position child that branched off last takes over the
  // slots before its branch point (it holds their KV). Returns whether nothing is left.
  bool hand_over(BlockIndex block);
  void move_entries(BlockIndex from, BlockIndex to, uint32_t begin, uint32_t end);
  void uncache_empty(BlockIndex block);
  const BlockHash& slot_hash(BlockIndex block, uint32_t slot) const {
    return slot_hashes_[size_t{block} * k_ + slot];
  }
  std::optional<BlockHash> entry_parent(BlockIndex block, uint32_t slot) const;
  // The stored events for `hashes` (all cached), sorted by depth, with their parents.
  void fill_stored(std::vector<BlockHash> hashes, CacheEvents& out) const;

  std::vector<Block> blocks_;
  std::vector<BlockHash> slot_hashes_;  // blocks_count x k: slot s of block b at b * k + s
  std::vector<BlockIndex> free_;  // stack
  BlockIndex lru_head_ = none_;   // oldest evictable
  BlockIndex lru_tail_ = none_;   // newest evictable
  uint32_t evictable_count_ = 0;
  uint32_t used_count_ = 0;
  uint32_t cached_count_ = 0;
  uint32_t block_tokens_ = 0;
  uint32_t k_ = 1;
  std::unordered_map<BlockHash, EntryAt, BlockHashHasher> by_hash_;  // <= blocks_count x k
  std::unordered_map<BlockHash, int, BlockHashHasher> pending_events_;  // <= 2 x that
  // Scratch (reused: no allocation once warm), each <= the hashes offered or blocks_count.
  std::vector<BlockIndex> matched_scratch_, distinct_scratch_, subtree_scratch_;
  PrefixCacheCounters counters_;
};

}  // namespace tandem::kv
