// An open-addressing hash table from a block hash to (node, depth) for the router's index:
// linear probing, power-of-two capacity, load <= 1/2, backward-shift deletion (no
// tombstones). One 40-byte entry per block, so a lookup is one cache miss, and
// prefetch() lets a caller overlap many lookups. Not thread-safe; pure.
#pragma once

#include <cstdint>
#include <vector>

#include "kvstore/block_hash.hpp"
#include "runtime/base/huge_pages.hpp"

namespace tandem::router {

class BlockTable {
 public:
  static constexpr uint32_t empty_node = UINT32_MAX;
  struct Entry {
    kv::BlockHash hash;
    uint32_t node = empty_node;  // empty_node: a free slot
    uint32_t depth = 0;          // position of the block in its chain
  };

  BlockTable();
  // The entry for `hash`, or nullptr. Valid until the next insert or erase.
  const Entry* find(const kv::BlockHash& hash) const;
  // Precondition (asserted): `hash` is absent. May grow (invalidates entry pointers).
  void insert(const kv::BlockHash& hash, uint32_t node, uint32_t depth);
  // Returns whether it was present.
  bool erase(const kv::BlockHash& hash);
  // Hints the CPU to load the slot where `hash` starts probing.
  void prefetch(const kv::BlockHash& hash) const { __builtin_prefetch(&slots_[home(hash)]); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  size_t home(const kv::BlockHash& hash) const { return hash.prefix64() & mask_; }
  void grow();

  std::vector<Entry, HugePageAllocator<Entry>> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace tandem::router
