// The tier-2 store's host-memory cache: verified block bytes in RAM in front of the data file,
// least recently used first out, bounded by bytes. A pure core (no I/O, threads or clocks).
//
// Holds only bytes that are known good: the bytes of a put whose write and index entry are
// durable, or bytes read back from the file that passed length and checksum verification.
// Keyed by slot; the store erases a slot's entry whenever the slot's block is dropped,
// evicted or replaced, so a cached entry always belongs to the slot's current block.
// Entries are shared_ptr<const AlignedBuffer> (immutable snapshots): a pin keeps its bytes
// alive after the cache lets go of them, so memory is bounded by capacity_bytes plus the
// bytes of pinned blocks (at most pins_max x slot_bytes).
//
// Owned by one Tier2Store (one thread). Cost: find/insert/erase O(1) average.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>

#include "kvstore/tier2/aligned_buffer.hpp"
#include "kvstore/tier2/slot_table.hpp"

namespace tandem::kv::tier2 {

using SharedBytes = std::shared_ptr<const AlignedBuffer>;

class HostCache {
 public:
  // capacity_bytes 0 disables the cache (insert keeps nothing).
  // Preconditions (asserted): entry_bytes > 0 (every entry is charged one slot's bytes).
  HostCache(uint64_t capacity_bytes, uint64_t entry_bytes);

  // The cached bytes of `slot`, made most recently used; nullptr if not cached.
  SharedBytes find(SlotIndex slot);
  // Caches `bytes` for `slot` (replacing an older entry), evicting least recently used
  // entries to stay within capacity. Preconditions (asserted): bytes->size() <= entry_bytes.
  void insert(SlotIndex slot, SharedBytes bytes);
  void erase(SlotIndex slot);

  bool enabled() const { return entries_max_ > 0; }
  uint64_t used_bytes() const { return lru_.size() * entry_bytes_; }
  uint64_t entries_count() const { return lru_.size(); }

 private:
  struct Entry {
    SlotIndex slot;
    SharedBytes bytes;
  };
  uint64_t entry_bytes_;
  uint64_t entries_max_;  // capacity_bytes / entry_bytes
  std::list<Entry> lru_;  // front = most recently used; <= entries_max_
  std::unordered_map<SlotIndex, std::list<Entry>::iterator> by_slot_;  // <= entries_max_
};

}  // namespace tandem::kv::tier2
