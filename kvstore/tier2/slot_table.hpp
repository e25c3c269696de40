// The tier-2 store's slot map: a pure core (no I/O, threads or clocks) that decides which
// slot of the data file holds which block, which blocks are visible, and which slot a new
// write takes (a free slot, else the least recently used evictable block's).
//
// Every slot is in exactly one state:
//   free      holds nothing the index references; on the free stack;
//   writing   reserved by a write in flight (put_begin .. put_commit/abort); not visible,
//             never evicted;
//   stored    holds a complete block the index references; visible when its owner is 0
//             (this store's fingerprint), never served otherwise (a foreign fingerprint's);
//   doomed    its block was dropped (failed verification) while pinned; not visible; freed
//             when the last pin goes.
// A stored slot with no pins is evictable and on the LRU list; a pinned one is not. Foreign
// blocks (owner != 0) are kept at the cold end of the LRU list: they are evicted before any
// block of this store's fingerprint, however recently those were used, and they are not
// touched (nobody here can read them).
//
// Owned by one Tier2Store (one thread). Memory: 96 bytes per slot plus ~70 per visible block
// (hash-map node).
// Cost: every operation O(1) (average for the hash map) except restore_finish
// (O(slots log slots)) and check_invariants (O(slots)).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvstore/block_hash.hpp"
#include "runtime/base/result.hpp"

namespace tandem::kv::tier2 {

using SlotIndex = uint32_t;
using OwnerIndex = uint16_t;  // 0 = this store's fingerprint; others index foreign ones
inline constexpr OwnerIndex owner_self = 0;

struct Checksum128 {
  uint64_t low = 0;
  uint64_t high = 0;
  friend bool operator==(const Checksum128&, const Checksum128&) = default;
};

// What the index says about a stored block.
struct SlotMeta {
  uint32_t length_bytes = 0;   // 1..slot_bytes
  Checksum128 checksum;        // XXH3-128 over the block's header (key, length, generation) + data
  uint64_t generation = 0;     // store-wide write counter at the put; a later write is larger
  uint64_t last_use_tick = 0;  // logical time of the last put/get/pin (persisted lazily)
  friend bool operator==(const SlotMeta&, const SlotMeta&) = default;
};

enum class SlotState : uint8_t { free, writing, stored, doomed };

// The block a reservation took its slot from: the caller deletes its index entry.
struct Victim {
  OwnerIndex owner = owner_self;
  BlockHash hash;
};
struct Reservation {
  SlotIndex slot = 0;
  std::optional<Victim> evicted;
};

enum class RestoreOutcome {
  stored,    // the slot was free and now holds the entry
  replaced,  // the slot held an entry of a lower generation; `displaced` says which
  rejected,  // the slot holds an entry of a higher or equal generation; this one is not used
};

struct SlotCounts {
  uint32_t free_count = 0;
  uint32_t writing_count = 0;
  uint32_t stored_count = 0;  // own + foreign
  uint32_t foreign_count = 0;
  uint32_t doomed_count = 0;
  uint32_t pinned_count = 0;  // stored or doomed slots with pins
  uint32_t evictable_count = 0;
};

class SlotTable {
 public:
  // Preconditions (asserted): slots_count >= 1.
  explicit SlotTable(uint32_t slots_count);

  uint32_t slots_count() const { return static_cast<uint32_t>(slots_.size()); }

  // The slot of this store's visible block `hash`, if any. No side effects.
  std::optional<SlotIndex> find(const BlockHash& hash) const;
  // The slot a write in flight of `hash` reserved, if any. No side effects.
  std::optional<SlotIndex> find_writing(const BlockHash& hash) const;
  SlotState state(SlotIndex slot) const;
  const SlotMeta& meta(SlotIndex slot) const;   // stored or doomed only (asserted)
  OwnerIndex owner(SlotIndex slot) const;       // stored or doomed only (asserted)
  const BlockHash& hash(SlotIndex slot) const;  // stored, doomed or writing (asserted)
  uint32_t pin_count(SlotIndex slot) const;

  // A slot for a new write of `hash`: the top of the free stack, else the LRU-oldest
  // evictable block's (returned in `evicted`; it is no longer visible). The slot becomes
  // writing. Errors: overloaded when no slot is free or evictable (nothing changes).
  // Preconditions (asserted): `hash` is neither visible nor being written.
  Result<Reservation> reserve(const BlockHash& hash);
  // writing -> stored (visible, most recently used). Preconditions (asserted): writing.
  void commit(SlotIndex slot, const SlotMeta& meta);
  // writing -> free. Preconditions (asserted): writing.
  void abort(SlotIndex slot);

  // A use of a visible block: most recently used, tick recorded, marked dirty (its persisted
  // tick is stale). Preconditions (asserted): stored and owner_self; tick > its last tick.
  void touch(SlotIndex slot, uint64_t tick);
  // Pins: a pinned slot is not evictable. Preconditions (asserted): pin: stored; unpin:
  // pinned. Unpinning the last pin of a doomed slot frees it (returns true then).
  void pin(SlotIndex slot);
  bool unpin(SlotIndex slot);
  // Drops a stored block (failed verification, or an explicit erase): it is no longer
  // visible; the slot is freed now (returns true) or, if pinned, doomed until the last unpin.
  bool drop(SlotIndex slot);

  // Opening an existing store: entries from the index, in any order, then restore_finish().
  // `displaced` receives the entry a replacement pushed out. Preconditions (asserted): not
  // finished; meta.length_bytes > 0; slot < slots_count.
  RestoreOutcome restore(SlotIndex slot, OwnerIndex owner, const BlockHash& hash,
                         const SlotMeta& meta, Victim* displaced);
  // Builds the LRU list (foreign blocks first, then by last_use_tick) and the free stack
  // (unreferenced slots, lowest index on top). Preconditions (asserted): called once.
  void restore_finish();

  // Slots whose last_use_tick changed since the last take (for persisting ticks), cleared.
  std::vector<SlotIndex> take_dirty();
  uint32_t dirty_count() const { return static_cast<uint32_t>(dirty_.size()); }

  // Visible blocks of this store (owner_self), in no particular order. Cost O(blocks).
  std::vector<BlockHash> visible_hashes() const;
  // Stored slots (own and foreign), ascending. Cost O(slots).
  std::vector<SlotIndex> stored_slots() const;
  const SlotCounts& counts() const { return counts_; }

  // Full O(slots) consistency check; aborts (RT_ASSERT) on any violation.
  void check_invariants() const;

 private:
  static constexpr SlotIndex none_ = UINT32_MAX;
  struct Slot {
    SlotState state = SlotState::free;
    OwnerIndex owner = owner_self;
    bool dirty = false;
    bool in_lru = false;
    uint32_t pin_count = 0;
    SlotIndex lru_prev = none_;
    SlotIndex lru_next = none_;
    BlockHash hash;
    SlotMeta meta;
  };

  Slot& at(SlotIndex slot);
  const Slot& at(SlotIndex slot) const;
  void lru_push_back(SlotIndex slot);   // most recently used end
  void lru_push_front(SlotIndex slot);  // cold end
  void lru_unlink(SlotIndex slot);
  void free_slot(SlotIndex slot);
  void forget(SlotIndex slot);  // stored -> not visible (map, counts, LRU), state unchanged

  std::vector<Slot> slots_;
  std::vector<SlotIndex> free_;   // stack; <= slots_count
  std::vector<SlotIndex> dirty_;  // <= slots_count (one entry per dirty slot)
  std::unordered_map<BlockHash, SlotIndex, BlockHashHasher> visible_;  // <= slots_count
  std::unordered_map<BlockHash, SlotIndex, BlockHashHasher> writing_;  // <= slots_count
  SlotIndex lru_head_ = none_;                                         // oldest evictable
  SlotIndex lru_tail_ = none_;                                         // newest evictable
  SlotCounts counts_;
  bool restored_ = false;
};

}  // namespace tandem::kv::tier2
