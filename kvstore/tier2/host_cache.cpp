#include "kvstore/tier2/host_cache.hpp"

namespace tandem::kv::tier2 {

HostCache::HostCache(uint64_t capacity_bytes, uint64_t entry_bytes)
    : entry_bytes_(entry_bytes), entries_max_(entry_bytes == 0 ? 0 : capacity_bytes / entry_bytes) {
  RT_ASSERT(entry_bytes > 0, "HostCache: entry size 0");
  RT_ASSERT(entries_max_ * entry_bytes_ <= capacity_bytes, "HostCache bound overflow");
}

SharedBytes HostCache::find(SlotIndex slot) {
  auto it = by_slot_.find(slot);
  if (it == by_slot_.end()) return nullptr;
  RT_ASSERT(it->second->slot == slot, "HostCache map and list disagree", slot);
  lru_.splice(lru_.begin(), lru_, it->second);
  RT_ASSERT(lru_.front().bytes != nullptr && lru_.front().bytes->size() <= entry_bytes_,
            "cached entry without bytes", slot);
  return lru_.front().bytes;
}

void HostCache::insert(SlotIndex slot, SharedBytes bytes) {
  RT_ASSERT(bytes != nullptr, "HostCache::insert of nothing", slot);
  RT_ASSERT(bytes->size() <= entry_bytes_, "HostCache entry too large", bytes->size());
  if (entries_max_ == 0) return;
  erase(slot);
  while (lru_.size() >= entries_max_) {
    by_slot_.erase(lru_.back().slot);
    lru_.pop_back();
  }
  lru_.push_front(Entry{slot, std::move(bytes)});
  by_slot_.emplace(slot, lru_.begin());
  RT_ASSERT(lru_.size() <= entries_max_ && by_slot_.size() == lru_.size(), "HostCache bound");
}

void HostCache::erase(SlotIndex slot) {
  auto it = by_slot_.find(slot);
  if (it == by_slot_.end()) return;
  RT_ASSERT(it->second->slot == slot, "HostCache map and list disagree", slot);
  lru_.erase(it->second);
  by_slot_.erase(it);
  RT_ASSERT(by_slot_.size() == lru_.size(), "HostCache map and list sizes differ");
}

}  // namespace tandem::kv::tier2
