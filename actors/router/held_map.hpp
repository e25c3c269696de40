// One instance's held blocks in the router index: node id -> index of the block's entry in
// the instance's entry pool (router_core.hpp, Slot::entries). Open addressing, linear
// probing, load <= 1/2, backward-shift deletion; one 8-byte slot per block and no
// allocation per insert once reserved/grown. Pure, not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::router {

class HeldMap {
 public:
  HeldMap();
  static constexpr uint32_t absent = UINT32_MAX;
  uint32_t find(uint32_t node) const;             // the entry index, or `absent`
  uint32_t at(uint32_t node) const;               // precondition (asserted): present
  void insert(uint32_t node, uint32_t entry);     // precondition (asserted): absent
  void erase(uint32_t node);                      // precondition (asserted): present
  void reserve(size_t entries);                   // no growth until size() passes entries
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  static constexpr uint32_t empty_key = UINT32_MAX;
  struct Entry {
    uint32_t node = empty_key;
    uint32_t entry = 0;
  };
  size_t home(uint32_t node) const {
    return static_cast<size_t>((node * 0x9e3779b97f4a7c15ull) >> shift_);
  }
  size_t slot_of(uint32_t node) const;  // slot holding node, or the empty slot ending its run
  void rehash(size_t slots_count);

  std::vector<Entry> slots_;
  size_t mask_ = 0;
  uint32_t shift_ = 0;
  size_t size_ = 0;
};

}  // namespace tandem::router
