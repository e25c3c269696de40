#include "kvstore/tier2/slot_table.hpp"

#include <algorithm>

namespace tandem::kv::tier2 {

SlotTable::SlotTable(uint32_t slots_count) : slots_(slots_count) {
  RT_ASSERT(slots_count >= 1, "SlotTable needs at least one slot");
  RT_ASSERT(slots_count < none_, "too many slots", slots_count);
  free_.reserve(slots_count);
  visible_.reserve(slots_count);
}

SlotTable::Slot& SlotTable::at(SlotIndex slot) {
  RT_ASSERT(slot < slots_.size(), "slot out of range", slot, slots_.size());
  return slots_[slot];
}

const SlotTable::Slot& SlotTable::at(SlotIndex slot) const {
  RT_ASSERT(slot < slots_.size(), "slot out of range", slot, slots_.size());
  return slots_[slot];
}

std::optional<SlotIndex> SlotTable::find(const BlockHash& hash) const {
  auto it = visible_.find(hash);
  if (it == visible_.end()) return std::nullopt;
  RT_ASSERT(slots_[it->second].state == SlotState::stored, "visible slot not stored", it->second);
  RT_ASSERT(slots_[it->second].owner == owner_self, "visible slot of another owner");
  return it->second;
}

std::optional<SlotIndex> SlotTable::find_writing(const BlockHash& hash) const {
  auto it = writing_.find(hash);
  if (it == writing_.end()) return std::nullopt;
  RT_ASSERT(slots_[it->second].state == SlotState::writing, "writing slot not writing");
  RT_ASSERT(slots_[it->second].hash == hash, "writing map points at another block");
  return it->second;
}

SlotState SlotTable::state(SlotIndex slot) const {
  return at(slot).state;
}

const SlotMeta& SlotTable::meta(SlotIndex slot) const {
  const Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::stored || s.state == SlotState::doomed, "no meta", slot);
  RT_ASSERT(s.meta.length_bytes > 0, "stored block of length 0", slot);
  return s.meta;
}

OwnerIndex SlotTable::owner(SlotIndex slot) const {
  const Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::stored || s.state == SlotState::doomed, "no owner", slot);
  RT_ASSERT(s.owner == owner_self || s.pin_count == 0, "a foreign block is pinned", slot);
  return s.owner;
}

const BlockHash& SlotTable::hash(SlotIndex slot) const {
  const Slot& s = at(slot);
  RT_ASSERT(s.state != SlotState::free, "free slot has no hash", slot);
  RT_ASSERT(s.state != SlotState::writing || writing_.contains(s.hash), "untracked write", slot);
  return s.hash;
}

uint32_t SlotTable::pin_count(SlotIndex slot) const {
  return at(slot).pin_count;
}

void SlotTable::lru_push_back(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(!s.in_lru, "already on the LRU list", slot);
  RT_ASSERT(s.state == SlotState::stored && s.pin_count == 0, "not evictable", slot);
  s.lru_prev = lru_tail_;
  s.lru_next = none_;
  if (lru_tail_ != none_) slots_[lru_tail_].lru_next = slot;
  lru_tail_ = slot;
  if (lru_head_ == none_) lru_head_ = slot;
  s.in_lru = true;
  ++counts_.evictable_count;
}

void SlotTable::lru_push_front(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(!s.in_lru, "already on the LRU list", slot);
  RT_ASSERT(s.state == SlotState::stored && s.pin_count == 0, "not evictable", slot);
  s.lru_next = lru_head_;
  s.lru_prev = none_;
  if (lru_head_ != none_) slots_[lru_head_].lru_prev = slot;
  lru_head_ = slot;
  if (lru_tail_ == none_) lru_tail_ = slot;
  s.in_lru = true;
  ++counts_.evictable_count;
}

void SlotTable::lru_unlink(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(s.in_lru, "not on the LRU list", slot);
  RT_ASSERT(counts_.evictable_count > 0, "evictable count underflow");
  (s.lru_prev != none_ ? slots_[s.lru_prev].lru_next : lru_head_) = s.lru_next;
  (s.lru_next != none_ ? slots_[s.lru_next].lru_prev : lru_tail_) = s.lru_prev;
  s.lru_prev = s.lru_next = none_;
  s.in_lru = false;
  --counts_.evictable_count;
}

void SlotTable::free_slot(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(!s.in_lru && s.pin_count == 0, "freeing a slot in use", slot);
  RT_ASSERT(s.state != SlotState::free, "double free", slot);
  if (s.state == SlotState::doomed) --counts_.doomed_count;
  if (s.state == SlotState::writing) --counts_.writing_count;
  s = Slot{};
  free_.push_back(slot);
  ++counts_.free_count;
}

void SlotTable::forget(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::stored, "forget: not stored", slot);
  if (s.in_lru) lru_unlink(slot);
  if (s.owner == owner_self) {
    size_t erased = visible_.erase(s.hash);
    RT_ASSERT(erased == 1, "own stored slot missing from the map", slot);
  } else {
    --counts_.foreign_count;
  }
  --counts_.stored_count;
  s.dirty = false;  // a stale entry in dirty_ is skipped by take_dirty
}

Result<Reservation> SlotTable::reserve(const BlockHash& hash) {
  RT_ASSERT(restored_, "reserve before restore_finish");
  RT_ASSERT(!visible_.contains(hash) && !writing_.contains(hash), "reserve of a known block");
  Reservation r;
  if (!free_.empty()) {
    r.slot = free_.back();
    free_.pop_back();
    --counts_.free_count;
  } else if (lru_head_ != none_) {
    r.slot = lru_head_;
    Slot& victim = slots_[r.slot];
    r.evicted = Victim{victim.owner, victim.hash};
    forget(r.slot);
    victim = Slot{};
  } else {
    return make_error(ErrorKind::overloaded, "tier-2 store full: every one of " +
                                                 std::to_string(slots_.size()) +
                                                 " slots is pinned or being written");
  }
  Slot& s = slots_[r.slot];
  RT_ASSERT(s.state == SlotState::free && s.pin_count == 0, "reserved a busy slot", r.slot);
  s.state = SlotState::writing;
  s.hash = hash;
  writing_.emplace(hash, r.slot);
  ++counts_.writing_count;
  return r;
}

void SlotTable::commit(SlotIndex slot, const SlotMeta& meta) {
  Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::writing, "commit of a slot not being written", slot);
  RT_ASSERT(meta.length_bytes > 0, "commit of an empty block", slot);
  writing_.erase(s.hash);
  --counts_.writing_count;
  s.state = SlotState::stored;
  s.owner = owner_self;
  s.meta = meta;
  auto [it, inserted] = visible_.emplace(s.hash, slot);
  RT_ASSERT(inserted, "commit of a block already visible", slot);
  ++counts_.stored_count;
  lru_push_back(slot);
}

void SlotTable::abort(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::writing, "abort of a slot not being written", slot);
  size_t erased = writing_.erase(s.hash);
  RT_ASSERT(erased == 1, "writing slot missing from the writing map", slot);
  free_slot(slot);
}

void SlotTable::touch(SlotIndex slot, uint64_t tick) {
  Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::stored && s.owner == owner_self, "touch of a hidden slot");
  RT_ASSERT(tick > s.meta.last_use_tick, "ticks must increase", tick, s.meta.last_use_tick);
  s.meta.last_use_tick = tick;
  if (s.in_lru) {
    lru_unlink(slot);
    lru_push_back(slot);
  }
  if (!s.dirty) {
    s.dirty = true;
    dirty_.push_back(slot);
  }
}

void SlotTable::pin(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::stored && s.owner == owner_self, "pin of a hidden slot");
  RT_ASSERT(s.pin_count < UINT32_MAX, "pin count overflow", slot);
  if (s.pin_count == 0) {
    lru_unlink(slot);
    ++counts_.pinned_count;
  }
  ++s.pin_count;
}

bool SlotTable::unpin(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(s.pin_count > 0, "unpin of an unpinned slot", slot);
  RT_ASSERT(s.state == SlotState::stored || s.state == SlotState::doomed, "pinned free slot");
  if (--s.pin_count > 0) return false;
  --counts_.pinned_count;
  if (s.state == SlotState::doomed) {
    free_slot(slot);
    return true;
  }
  lru_push_back(slot);
  return false;
}

bool SlotTable::drop(SlotIndex slot) {
  Slot& s = at(slot);
  RT_ASSERT(s.state == SlotState::stored, "drop of a slot not stored", slot);
  forget(slot);
  RT_ASSERT(!s.in_lru, "dropped slot still evictable", slot);
  if (s.pin_count > 0) {
    s.state = SlotState::doomed;
    ++counts_.doomed_count;
    return false;
  }
  free_slot(slot);
  return true;
}

RestoreOutcome SlotTable::restore(SlotIndex slot, OwnerIndex owner, const BlockHash& hash,
                                  const SlotMeta& meta, Victim* displaced) {
  RT_ASSERT(!restored_, "restore after restore_finish");
  RT_ASSERT(meta.length_bytes > 0, "restore of an empty block", slot);
  Slot& s = at(slot);
  RestoreOutcome outcome = RestoreOutcome::stored;
  if (s.state == SlotState::stored) {
    if (s.meta.generation >= meta.generation) return RestoreOutcome::rejected;
    RT_ASSERT(displaced != nullptr, "restore needs somewhere to report a displaced entry");
    *displaced = Victim{s.owner, s.hash};
    if (s.owner == owner_self)
      visible_.erase(s.hash);
    else
      --counts_.foreign_count;
    --counts_.stored_count;
    outcome = RestoreOutcome::replaced;
  }
  if (owner == owner_self) {
    auto [it, inserted] = visible_.emplace(hash, slot);
    RT_ASSERT(inserted, "one hash restored into two slots", slot, it->second);
  } else {
    ++counts_.foreign_count;
  }
  s.state = SlotState::stored;
  s.owner = owner;
  s.hash = hash;
  s.meta = meta;
  ++counts_.stored_count;
  return outcome;
}

void SlotTable::restore_finish() {
  RT_ASSERT(!restored_, "restore_finish twice");
  RT_ASSERT(free_.empty() && counts_.evictable_count == 0, "restore_finish on a used table");
  restored_ = true;
  std::vector<SlotIndex> stored = stored_slots();
  std::sort(stored.begin(), stored.end(), [this](SlotIndex a, SlotIndex b) {
    const Slot& x = slots_[a];
    const Slot& y = slots_[b];
    bool x_foreign = x.owner != owner_self, y_foreign = y.owner != owner_self;
    if (x_foreign != y_foreign) return x_foreign;  // foreign first: the cold end
    if (x.meta.last_use_tick != y.meta.last_use_tick) {
      return x.meta.last_use_tick < y.meta.last_use_tick;
    }
    return a < b;
  });
  for (SlotIndex slot : stored) lru_push_back(slot);
  for (SlotIndex slot = slots_count(); slot-- > 0;) {
    if (slots_[slot].state != SlotState::free) continue;
    free_.push_back(slot);  // lowest index on top: fresh writes go in file order
    ++counts_.free_count;
  }
}

std::vector<SlotIndex> SlotTable::take_dirty() {
  std::vector<SlotIndex> out;
  out.reserve(dirty_.size());
  for (SlotIndex slot : dirty_) {
    Slot& s = slots_[slot];
    if (!s.dirty) continue;  // dropped or evicted since it was touched
    RT_ASSERT(s.state == SlotState::stored, "dirty slot not stored", slot);
    s.dirty = false;
    out.push_back(slot);
  }
  dirty_.clear();
  RT_ASSERT(out.size() <= slots_.size(), "more dirty slots than slots", out.size());
  return out;
}

std::vector<BlockHash> SlotTable::visible_hashes() const {
  std::vector<BlockHash> out;
  out.reserve(visible_.size());
  for (const auto& [hash, slot] : visible_) out.push_back(hash);
  RT_ASSERT(out.size() == counts_.stored_count - counts_.foreign_count, "visible count");
  RT_ASSERT(out.size() <= slots_.size(), "more visible blocks than slots");
  return out;
}

std::vector<SlotIndex> SlotTable::stored_slots() const {
  std::vector<SlotIndex> out;
  out.reserve(counts_.stored_count);
  for (SlotIndex slot = 0; slot < slots_count(); ++slot) {
    if (slots_[slot].state == SlotState::stored) out.push_back(slot);
  }
  RT_ASSERT(out.size() == counts_.stored_count, "stored count", out.size());
  RT_ASSERT(std::is_sorted(out.begin(), out.end()), "stored slots out of order");
  return out;
}

void SlotTable::check_invariants() const {
  SlotCounts c;
  uint32_t visible_count = 0;
  for (SlotIndex slot = 0; slot < slots_count(); ++slot) {
    const Slot& s = slots_[slot];
    bool evictable = s.state == SlotState::stored && s.pin_count == 0;
    RT_ASSERT(s.in_lru == (evictable && restored_), "LRU membership wrong", slot);
    RT_ASSERT(s.pin_count == 0 || s.state == SlotState::stored || s.state == SlotState::doomed,
              "pinned slot neither stored nor doomed", slot);
    if (s.pin_count > 0) ++c.pinned_count;
    if (s.in_lru) ++c.evictable_count;
    switch (s.state) {
      case SlotState::free:
        ++c.free_count;
        break;
      case SlotState::writing:
        ++c.writing_count;
        RT_ASSERT(writing_.at(s.hash) == slot, "writing map wrong", slot);
        break;
      case SlotState::doomed:
        ++c.doomed_count;
        RT_ASSERT(s.pin_count > 0, "doomed slot without pins", slot);
        break;
      case SlotState::stored:
        ++c.stored_count;
        if (s.owner != owner_self) ++c.foreign_count;
        if (s.owner == owner_self) ++visible_count;
        if (s.owner == owner_self) RT_ASSERT(visible_.at(s.hash) == slot, "map wrong", slot);
        break;
    }
  }
  if (!restored_) c.free_count = counts_.free_count;  // free stack is built at restore_finish
  RT_ASSERT(c.free_count == counts_.free_count && c.free_count == free_.size(), "free count");
  RT_ASSERT(c.writing_count == counts_.writing_count && c.writing_count == writing_.size(),
            "writing count");
  RT_ASSERT(c.stored_count == counts_.stored_count, "stored count");
  RT_ASSERT(c.foreign_count == counts_.foreign_count, "foreign count");
  RT_ASSERT(c.doomed_count == counts_.doomed_count, "doomed count");
  RT_ASSERT(c.pinned_count == counts_.pinned_count, "pinned count");
  RT_ASSERT(c.evictable_count == counts_.evictable_count, "evictable count");
  RT_ASSERT(visible_count == visible_.size(), "visible map size");
}

}  // namespace tandem::kv::tier2
