#include "actors/router/held_map.hpp"

#include <bit>
#include <utility>

#include "runtime/base/assert.hpp"

namespace tandem::router {

HeldMap::HeldMap() {
  rehash(16);
  RT_ASSERT(slots_.size() == 16 && size_ == 0);
}

size_t HeldMap::slot_of(uint32_t node) const {
  size_t i = home(node);
  while (slots_[i].node != empty_key && slots_[i].node != node) i = (i + 1) & mask_;
  return i;
}

uint32_t HeldMap::find(uint32_t node) const {
  RT_ASSERT(node != empty_key);
  size_t i = slot_of(node);
  return slots_[i].node == node ? slots_[i].entry : absent;
}

uint32_t HeldMap::at(uint32_t node) const {
  uint32_t entry = find(node);
  RT_ASSERT(entry != absent, "HeldMap::at of an absent node", node);
  return entry;
}

void HeldMap::insert(uint32_t node, uint32_t entry) {
  RT_ASSERT(node != empty_key);
  if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
  size_t i = slot_of(node);
  RT_ASSERT(slots_[i].node == empty_key, "HeldMap::insert of a present node", node);
  RT_ASSERT(entry != absent);
  slots_[i] = Entry{node, entry};
  ++size_;
}

void HeldMap::erase(uint32_t node) {
  size_t i = slot_of(node);
  RT_ASSERT(slots_[i].node == node, "HeldMap::erase of an absent node", node);
  for (size_t j = (i + 1) & mask_; slots_[j].node != empty_key; j = (j + 1) & mask_) {
    size_t k = home(slots_[j].node);
    bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i] = Entry{};
  RT_ASSERT(size_ > 0);
  --size_;
}

void HeldMap::reserve(size_t entries) {
  if (entries * 2 > slots_.size()) rehash(std::bit_ceil(entries * 2));
  RT_ASSERT(entries * 2 <= slots_.size(), entries);
}

void HeldMap::rehash(size_t slots_count) {
  RT_ASSERT(std::has_single_bit(slots_count) && slots_count >= 2 * size_, slots_count);
  std::vector<Entry> old = std::exchange(slots_, std::vector<Entry>(slots_count));
  mask_ = slots_count - 1;
  shift_ = 64 - static_cast<uint32_t>(std::countr_zero(slots_count));
  size_ = 0;
  for (const Entry& entry : old) {
    if (entry.node != empty_key) insert(entry.node, entry.entry);
  }
}

}  // namespace tandem::router
