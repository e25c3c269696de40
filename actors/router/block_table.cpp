#include "actors/router/block_table.hpp"

#include <utility>

#include "runtime/base/assert.hpp"

namespace tandem::router {

BlockTable::BlockTable() : slots_(1024), mask_(1023) {
  RT_ASSERT((slots_.size() & mask_) == 0, slots_.size());
  RT_ASSERT(size_ == 0);
}

const BlockTable::Entry* BlockTable::find(const kv::BlockHash& hash) const {
  uint64_t key = hash.prefix64();
  for (size_t i = key & mask_;; i = (i + 1) & mask_) {
    const Entry& entry = slots_[i];
    if (entry.node == empty_node) return nullptr;
    // The first 8 bytes decide almost always; the full compare confirms.
    if (entry.hash.prefix64() == key && entry.hash == hash) return &entry;
  }
}

void BlockTable::insert(const kv::BlockHash& hash, uint32_t node, uint32_t depth) {
  RT_ASSERT(node != empty_node);
  if ((size_ + 1) * 2 > slots_.size()) grow();
  size_t i = home(hash);
  while (slots_[i].node != empty_node) {
    RT_ASSERT(!(slots_[i].hash == hash), "BlockTable::insert of a present hash");
    i = (i + 1) & mask_;
  }
  slots_[i] = Entry{hash, node, depth};
  ++size_;
  RT_ASSERT(size_ * 2 <= slots_.size(), size_);
}

bool BlockTable::erase(const kv::BlockHash& hash) {
  size_t i = home(hash);
  while (true) {
    if (slots_[i].node == empty_node) return false;
    if (slots_[i].hash == hash) break;
    i = (i + 1) & mask_;
  }
  // Backward shift: move later entries of the probe run into the hole when their home
  // position does not lie cyclically in (hole, j].
  for (size_t j = (i + 1) & mask_; slots_[j].node != empty_node; j = (j + 1) & mask_) {
    size_t k = home(slots_[j].hash);
    bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i] = Entry{};
  RT_ASSERT(size_ > 0);
  --size_;
  return true;
}

void BlockTable::grow() {
  auto old = std::exchange(slots_, std::vector<Entry, HugePageAllocator<Entry>>(slots_.size() * 2));
  mask_ = slots_.size() - 1;
  size_ = 0;
  for (const Entry& entry : old) {
    if (entry.node != empty_node) insert(entry.hash, entry.node, entry.depth);
  }
  RT_ASSERT(slots_.size() >= old.size() * 2);
}

}  // namespace tandem::router
