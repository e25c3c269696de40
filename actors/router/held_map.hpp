// One instance's held blocks in the router index: node id -> (LRU stamp, held children).
// Open addressing, linear probing, load <= 1/2, backward-shift deletion; one 16-byte entry
// per block and no allocation per insert. Pointers returned stay valid until an insert
// grows the table (reserve() first to prevent that) or an erase. Pure, not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::router {

struct Held {
  uint64_t stamp = 0;        // last touch (larger = more recent)
  uint32_t child_count = 0;  // held children (0 = a leaf of this instance's tree)
};

class HeldMap {
 public:
  HeldMap();
  Held* find(uint32_t node);                      // nullptr when absent
  Held& at(uint32_t node);                        // precondition (asserted): present
  Held& insert(uint32_t node, const Held& held);  // precondition (asserted): absent
  void erase(uint32_t node);                      // precondition (asserted): present
  void reserve(size_t entries);                   // no growth until size() passes entries
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  static constexpr uint32_t empty_key = UINT32_MAX;
  struct Entry {
    uint32_t node = empty_key;
    Held held;
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
