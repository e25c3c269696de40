// Tier2Store's data path: put, get, pin, verify (tier2_store.cpp opens, restores, drops all).
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <cstring>

#include "kvstore/tier2/tier2_store.hpp"

namespace tandem::kv::tier2 {
namespace {

std::string short_hex(const BlockHash& hash) {
  return hash.hex().substr(0, 16);
}

Error invalid(std::string message) {
  return make_error(ErrorKind::invalid, std::move(message));
}

Tier2EventKind miss_event(Tier2Miss reason) {
  switch (reason) {
    case Tier2Miss::short_read:
      return Tier2EventKind::miss_short_read;
    case Tier2Miss::io_error:
      return Tier2EventKind::miss_io_error;
    case Tier2Miss::checksum:
      return Tier2EventKind::miss_checksum;
    case Tier2Miss::absent:
      break;
  }
  RT_ASSERT(false, "no event for an absent block");
  return Tier2EventKind::miss_io_error;
}

}  // namespace

bool Tier2Store::contains(const BlockHash& hash) const {
  return slots_.find(hash).has_value();
}

std::vector<BlockHash> Tier2Store::blocks() const {
  return slots_.visible_hashes();
}

IoMode Tier2Store::io_mode() const {
  return file_->io_mode();
}

std::shared_ptr<AlignedBuffer> Tier2Store::take_buffer() {
  if (spare_buffers_.empty()) return std::make_shared<AlignedBuffer>(slot_bytes_);
  auto buffer = std::move(spare_buffers_.back());
  spare_buffers_.pop_back();
  RT_ASSERT(buffer != nullptr && buffer->size() == slot_bytes_, "spare buffer of wrong size");
  return buffer;
}

void Tier2Store::give_back_buffer(std::shared_ptr<AlignedBuffer> buffer) {
  RT_ASSERT(buffer != nullptr, "give_back of nothing");
  RT_ASSERT(buffer->size() == slot_bytes_, "foreign buffer given back", buffer->size());
  if (buffer.use_count() == 1 && spare_buffers_.size() < config_.writes_inflight_max) {
    spare_buffers_.push_back(std::move(buffer));
  }
  RT_ASSERT(spare_buffers_.size() <= config_.writes_inflight_max, "spare buffers over bound");
}

void Tier2Store::record_removed(const BlockHash& hash) {
  if (removed_.size() < removed_max) {
    removed_.push_back(hash);
  } else {
    removed_overflow_ = true;
  }
  RT_ASSERT(removed_.size() <= removed_max, "removed list over its bound");
}

// After an index write failed (a full disk), the index is closed and opened again before the
// next write (which replays its WAL): RocksDB's writer, written to again after an error,
// aborts the process on its own assertion, and a resumed one kept refusing. While it cannot
// open, index writes fail at once and blocks are not stored (reads go on).
Status Tier2Store::index_ready() {
  if (!index_failed_) return {};
  if (db_ != nullptr) {
    (void)db_->Close();
    db_.reset();
  }
  if (Status opened = open_index(); !opened) return opened.error();
  index_failed_ = false;
  index_commits_unsynced_ = 0;  // the reopen synced what the WAL held
  note_event(Tier2EventKind::index_error, "index reopened after a failed write");
  return {};
}

Status Tier2Store::delete_entry(OwnerIndex owner, const BlockHash& hash) {
  // Not synced: the next synced write (any put) makes it durable, as RocksDB replays a prefix
  // of its WAL; lost in a crash, the entry comes back and fails its checksum (its slot holds
  // another block's bytes).
  RT_ASSERT(!(owner == owner_self && slots_.find(hash)), "deleting the entry of a visible block");
  if (owner == owner_self) record_removed(hash);  // invisible now, whatever the write does
  if (Status ready = index_ready(); !ready) return ready.error();
  rocksdb::Status status = db_->Delete(rocksdb::WriteOptions(), key_of(owner, hash));
  index_failed_ = !status.ok();
  if (status.ok()) return {};
  note_event(Tier2EventKind::index_error,
             "delete of " + short_hex(hash) + ": " + status.ToString());
  return make_error(ErrorKind::failed, "tier-2 index delete: " + status.ToString());
}

Result<Reservation> Tier2Store::reserve_slot(const BlockHash& hash) {
  auto r = slots_.reserve(hash);
  if (!r) {
    ++stats_.puts_dropped_full_count;
    return r.error();
  }
  RT_ASSERT(slots_.state(r->slot) == SlotState::writing, "reserved slot not writing", r->slot);
  cache_.erase(r->slot);
  if (r->evicted) {
    ++stats_.evictions_count;
    if (r->evicted->owner != owner_self) ++stats_.evictions_foreign_count;
    (void)delete_entry(r->evicted->owner, r->evicted->hash);  // failure: an event; still safe
  }
  RT_ASSERT(!slots_.find(hash), "a block being written is visible");
  return r;
}

// Either answers a duplicate put (already visible: a use; or being written) or nothing.
std::optional<PutOutcome> Tier2Store::check_duplicate(const BlockHash& hash) {
  auto visible = slots_.find(hash);
  auto writing = slots_.find_writing(hash);
  RT_ASSERT(!(visible && writing), "a block both visible and being written");
  if (auto slot = visible) {
    use(*slot);
    ++stats_.puts_duplicate_count;
    return PutOutcome::duplicate;
  }
  if (writing) {
    RT_ASSERT(slots_.state(*writing) == SlotState::writing, "writing slot not writing");
    ++stats_.puts_duplicate_count;
    return PutOutcome::duplicate;
  }
  return std::nullopt;
}

Status Tier2Store::check_length(uint64_t length_bytes) const {
  if (length_bytes == 0 || length_bytes > config_.block_bytes) {
    return invalid("tier-2 put of " + std::to_string(length_bytes) + " bytes: a block is 1.." +
                   std::to_string(config_.block_bytes) + " bytes");
  }
  return {};
}

// Reserves a slot for one block of a put and writes its bytes there (not yet synced).
// nullopt: a duplicate (nothing to do). On a write failure the slot is free again.
Result<std::optional<Tier2Store::Staged>> Tier2Store::stage(const PutItem& item) {
  std::span<const uint8_t> data = item.data;
  if (Status length_ok = check_length(data.size()); !length_ok) return length_ok.error();
  if (check_duplicate(item.hash)) return std::optional<Staged>();
  auto r = reserve_slot(item.hash);
  if (!r) return r.error();
  RT_ASSERT(slots_.find_writing(item.hash) == r->slot, "reserved slot not tracked", r->slot);
  uint64_t padded_bytes = round_up_bytes(data.size(), io_alignment_bytes);
  RT_ASSERT(padded_bytes <= slot_bytes_, "block larger than its slot", padded_bytes);
  std::shared_ptr<AlignedBuffer> buffer;
  std::span<const uint8_t> source = data;  // buffered I/O needs neither alignment nor padding
  bool copy = file_->io_mode() == IoMode::direct && !is_io_aligned(data.data(), data.size());
  if (copy || cache_.enabled()) {
    buffer = take_buffer();
    std::memcpy(buffer->data(), data.data(), data.size());
    std::memset(buffer->data() + data.size(), 0, padded_bytes - data.size());
    if (copy) source = buffer->span().first(padded_bytes);
  }
  auto meta = write_data(r->slot, item.hash, source, data.size());
  if (!meta) {
    if (buffer) give_back_buffer(std::move(buffer));
    return meta.error();
  }
  return std::optional<Staged>(Staged{r->slot, item.hash, *meta, std::move(buffer)});
}

Result<PutOutcome> Tier2Store::put(const BlockHash& hash, std::span<const uint8_t> data) {
  PutItem item{hash, data};
  std::vector<Result<PutOutcome>> results = put_batch({&item, 1});
  RT_ASSERT(results.size() == 1, "put_batch of one gave", results.size());
  return std::move(results[0]);
}

std::vector<Result<PutOutcome>> Tier2Store::put_batch(std::span<const PutItem> items) {
  RT_ASSERT(items.size() <= config_.puts_batch_max, "put_batch over puts_batch_max", items.size());
  std::vector<std::optional<Error>> errors(items.size());  // per item; none: outcomes[i]
  std::vector<PutOutcome> outcomes(items.size(), PutOutcome::duplicate);
  std::vector<Staged> staged;
  std::vector<size_t> staged_items;  // staged[i] answers items[staged_items[i]]
  for (size_t i = 0; i < items.size(); ++i) {
    auto s = stage(items[i]);
    if (!s) {
      errors[i] = s.error();
    } else if (s->has_value()) {
      staged_items.push_back(i);
      outcomes[i] = PutOutcome::stored;
      staged.push_back(std::move(**s));
    }
  }
  Status durable = make_durable(staged);
  for (size_t i : staged_items) {
    if (!durable) errors[i] = durable.error();
  }
  std::vector<Result<PutOutcome>> results;
  results.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (errors[i]) {
      results.emplace_back(std::move(*errors[i]));
    } else {
      results.emplace_back(outcomes[i]);
    }
  }
  RT_ASSERT(results.size() == items.size(), "one result per item");
  return results;
}

Result<PutStart> Tier2Store::put_begin(const BlockHash& hash) {
  if (auto duplicate = check_duplicate(hash)) return PutStart{*duplicate, 0, {}};
  if (writes_.size() >= config_.writes_inflight_max) {
    ++stats_.puts_dropped_full_count;
    return make_error(ErrorKind::overloaded, "tier-2 writes in flight at writes_inflight_max (" +
                                                 std::to_string(config_.writes_inflight_max) + ")");
  }
  auto r = reserve_slot(hash);
  if (!r) return r.error();
  WriteId id = next_write_id_++;
  auto [it, inserted] = writes_.emplace(id, Write{r->slot, hash, take_buffer()});
  RT_ASSERT(inserted, "write id reused", id);
  RT_ASSERT(writes_.size() <= config_.writes_inflight_max, "writes in flight over the bound");
  return PutStart{PutOutcome::stored, id, it->second.buffer->span()};
}

Result<PutOutcome> Tier2Store::put_commit(WriteId id, uint64_t length_bytes) {
  auto it = writes_.find(id);
  if (it == writes_.end()) return invalid("tier-2 put_commit: unknown write " + std::to_string(id));
  if (Status length_ok = check_length(length_bytes); !length_ok) return length_ok.error();
  Write write = std::move(it->second);
  writes_.erase(it);
  RT_ASSERT(slots_.state(write.slot) == SlotState::writing, "committed slot not writing");
  uint64_t padded_bytes = round_up_bytes(length_bytes, io_alignment_bytes);
  RT_ASSERT(padded_bytes <= write.buffer->size(), "write buffer smaller than the block");
  std::memset(write.buffer->data() + length_bytes, 0, padded_bytes - length_bytes);
  auto source = write.buffer->span().first(padded_bytes);
  auto meta = write_data(write.slot, write.hash, source, length_bytes);
  if (!meta) {
    give_back_buffer(std::move(write.buffer));
    return meta.error();
  }
  std::vector<Staged> staged;
  staged.push_back(Staged{write.slot, write.hash, *meta, std::move(write.buffer)});
  if (Status durable = make_durable(staged); !durable) return durable.error();
  return PutOutcome::stored;
}

Status Tier2Store::put_abort(WriteId id) {
  auto it = writes_.find(id);
  if (it == writes_.end()) return invalid("tier-2 put_abort: unknown write " + std::to_string(id));
  RT_ASSERT(slots_.state(it->second.slot) == SlotState::writing, "aborted slot not writing");
  slots_.abort(it->second.slot);
  give_back_buffer(std::move(it->second.buffer));
  writes_.erase(it);
  RT_ASSERT(writes_.size() == slots_.counts().writing_count, "writes and writing slots differ");
  return {};
}

Error Tier2Store::fail_write(SlotIndex slot, const BlockHash& hash, const std::string& what) {
  RT_ASSERT(slots_.state(slot) == SlotState::writing, "failing a slot not being written", slot);
  slots_.abort(slot);
  ++stats_.puts_dropped_io_count;
  std::string detail =
      "put of " + short_hex(hash) + " to slot " + std::to_string(slot) + ": " + what;
  note_event(Tier2EventKind::put_io_error, detail);
  return make_error(ErrorKind::failed, "tier-2 " + detail);
}

// The block's checksum and its bytes in the slot (not synced yet). On failure the slot is
// free again.
Result<SlotMeta> Tier2Store::write_data(SlotIndex slot, const BlockHash& hash,
                                        std::span<const uint8_t> source, uint64_t length_bytes) {
  RT_ASSERT(slots_.state(slot) == SlotState::writing, "write to a slot not reserved", slot);
  RT_ASSERT(source.size() >= length_bytes && source.size() <= slot_bytes_, "bad source size");
  SlotMeta meta;
  meta.length_bytes = static_cast<uint32_t>(length_bytes);
  meta.generation = ++generation_;
  meta.checksum = block_checksum(digest_, hash, meta.generation, source.first(length_bytes));
  meta.last_use_tick = next_tick();
  auto written = file_->pwrite(source, uint64_t{slot} * slot_bytes_);
  if (!written) return fail_write(slot, hash, written.error().message);
  stats_.written_bytes += *written;
  if (*written != source.size()) {
    return fail_write(slot, hash,
                      "short write (" + std::to_string(*written) + " of " +
                          std::to_string(source.size()) + " bytes)");
  }
  return meta;
}

// Durable before visible, for a group of written blocks at once (group commit): one
// fdatasync of the data file, then one synced index batch with every entry, then all become
// visible. On a failure none does and every slot is free again.
Status Tier2Store::make_durable(std::vector<Staged>& staged) {
  if (staged.empty()) return {};
  RT_ASSERT(staged.size() <= config_.puts_batch_max, "group over puts_batch_max");
  Status step = file_->sync_data();
  if (step) step = index_ready();
  if (step) {
    rocksdb::WriteBatch batch;
    uint64_t generation_max = 0;
    for (const Staged& s : staged) {
      batch.Put(key_of(owner_self, s.hash), encode_index_entry(IndexEntry{s.slot, s.meta}));
      generation_max = std::max(generation_max, s.meta.generation);
    }
    batch.Put(meta_key("generation"), encode_u64(generation_max));
    rocksdb::WriteOptions options;
    // Synced: the WAL is fsynced before Write returns. Unsynced (index_commits_per_sync > 1):
    // a power loss can forget this entry until the next synced commit, never serve bad bytes.
    options.sync = ++index_commits_unsynced_ >= config_.index_commits_per_sync;
    rocksdb::Status status = db_->Write(options, &batch);
    index_failed_ = !status.ok();
    if (!status.ok()) step = make_error(ErrorKind::failed, "index write: " + status.ToString());
    if (status.ok() && options.sync) index_commits_unsynced_ = 0;
    if (!status.ok()) index_commits_unsynced_ = 0;  // nothing of this batch was committed
    RT_ASSERT(index_commits_unsynced_ < config_.index_commits_per_sync, "WAL sync overdue");
  }
  for (Staged& s : staged) {
    if (!step) {
      (void)fail_write(s.slot, s.hash, step.error().message);
      if (s.cached) give_back_buffer(std::move(s.cached));
      continue;
    }
    slots_.commit(s.slot, s.meta);
    ++stats_.puts_count;
    if (s.cached) cache_.insert(s.slot, std::move(s.cached));  // the put's own bytes
    RT_ASSERT(slots_.find(s.hash) == s.slot, "committed block not visible", s.slot);
  }
  if (!step) return step.error();
  return {};
}

Tier2Store::ReadOutcome Tier2Store::read_slot(SlotIndex slot, std::span<uint8_t> target) {
  const SlotMeta& meta = slots_.meta(slot);
  RT_ASSERT(target.size() >= meta.length_bytes, "read target smaller than the block", slot);
  RT_ASSERT(target.size() <= slot_bytes_, "read target larger than a slot", slot);
  ReadOutcome out;
  auto n = file_->pread(target, uint64_t{slot} * slot_bytes_);
  if (!n) {
    out.reason = Tier2Miss::io_error;
    out.detail = n.error().message;
    return out;
  }
  stats_.read_bytes += *n;
  if (*n < target.size()) {
    out.reason = Tier2Miss::short_read;
    out.detail = "read " + std::to_string(*n) + " of " + std::to_string(target.size()) + " bytes";
    return out;
  }
  const FingerprintDigest& owner_digest = owners_[slots_.owner(slot)];
  Checksum128 sum = block_checksum(owner_digest, slots_.hash(slot), meta.generation,
                                   target.first(meta.length_bytes));
  if (sum != meta.checksum) {
    out.reason = Tier2Miss::checksum;
    out.detail = "checksum mismatch over " + std::to_string(meta.length_bytes) + " bytes";
    return out;
  }
  out.ok = true;
  return out;
}

Error Tier2Store::miss(const BlockHash& hash, Tier2Miss reason, const std::string& detail) {
  RT_ASSERT(static_cast<size_t>(reason) < tier2_miss_reasons_count, "miss reason out of range");
  RT_ASSERT(!slots_.find(hash), "a miss on a block that is still visible");
  ++stats_.misses_count[static_cast<size_t>(reason)];
  last_miss_ = reason;
  return make_error(ErrorKind::not_found, "tier-2 miss (" + std::string(to_string(reason)) +
                                              "): block " + short_hex(hash) +
                                              (detail.empty() ? "" : ": " + detail));
}

// A block that failed a read check: its entry goes, its slot is freed (or doomed while
// pinned), and the first event of the reason is kept.
void Tier2Store::drop_bad(SlotIndex slot, const ReadOutcome& outcome) {
  RT_ASSERT(!outcome.ok, "drop_bad of a good read", slot);
  RT_ASSERT(slots_.state(slot) == SlotState::stored, "drop_bad of a slot not stored", slot);
  BlockHash hash = slots_.hash(slot);
  OwnerIndex owner = slots_.owner(slot);
  note_event(miss_event(outcome.reason),
             "block " + short_hex(hash) + " in slot " + std::to_string(slot) + " (generation " +
                 std::to_string(slots_.meta(slot).generation) + "): " + outcome.detail);
  cache_.erase(slot);
  slots_.drop(slot);  // invisible first, then the entry goes
  (void)delete_entry(owner, hash);
  ++stats_.corrupt_dropped_count;
}

void Tier2Store::use(SlotIndex slot) {
  slots_.touch(slot, next_tick());
  if (slots_.dirty_count() >= config_.use_ticks_dirty_max) (void)flush();
}

Result<uint64_t> Tier2Store::get(const BlockHash& hash, std::span<uint8_t> out) {
  auto slot = slots_.find(hash);
  if (!slot) {
    std::memset(out.data(), 0, out.size());
    return miss(hash, Tier2Miss::absent, "");
  }
  uint32_t length_bytes = slots_.meta(*slot).length_bytes;
  if (out.size() < length_bytes) {
    return invalid("tier-2 get: buffer of " + std::to_string(out.size()) +
                   " bytes for a block of " + std::to_string(length_bytes));
  }
  use(*slot);
  if (SharedBytes cached = cache_.find(*slot)) {
    RT_ASSERT(cached->size() >= length_bytes, "cached block shorter than its entry", *slot);
    std::memcpy(out.data(), cached->data(), length_bytes);
    ++stats_.hits_count;
    ++stats_.cache_hits_count;
    return uint64_t{length_bytes};
  }
  uint64_t padded_bytes = round_up_bytes(length_bytes, io_alignment_bytes);
  std::shared_ptr<AlignedBuffer> fill = cache_.enabled() ? take_buffer() : nullptr;
  std::span<uint8_t> target;
  bool into_out = fill == nullptr && out.size() >= padded_bytes &&
                  (file_->io_mode() == IoMode::buffered || is_io_aligned(out.data(), 0));
  if (into_out) {
    target = out.first(padded_bytes);  // straight into the caller's memory
  } else {
    target = (fill ? fill->span() : read_scratch_.span()).first(padded_bytes);
  }
  ReadOutcome outcome = read_slot(*slot, target);
  if (!outcome.ok) {
    if (fill) give_back_buffer(std::move(fill));
    drop_bad(*slot, outcome);
    std::memset(out.data(), 0, out.size());
    return miss(hash, outcome.reason, outcome.detail);
  }
  if (target.data() != out.data()) std::memcpy(out.data(), target.data(), length_bytes);
  if (fill) cache_.insert(*slot, std::move(fill));  // verified bytes only
  ++stats_.hits_count;
  RT_ASSERT(slots_.find(hash) == slot, "served block not visible", *slot);
  return uint64_t{length_bytes};
}

Result<Tier2Pin> Tier2Store::pin(const BlockHash& hash) {
  if (pins_.size() >= config_.pins_max) {
    return make_error(ErrorKind::overloaded,
                      "tier-2 pins at pins_max (" + std::to_string(config_.pins_max) + ")");
  }
  auto slot = slots_.find(hash);
  if (!slot) return miss(hash, Tier2Miss::absent, "");
  use(*slot);
  uint32_t length_bytes = slots_.meta(*slot).length_bytes;
  SharedBytes bytes = cache_.find(*slot);
  if (bytes) {
    ++stats_.cache_hits_count;
  } else {
    std::shared_ptr<AlignedBuffer> fill = take_buffer();
    auto target = fill->span().first(round_up_bytes(length_bytes, io_alignment_bytes));
    ReadOutcome outcome = read_slot(*slot, target);
    if (!outcome.ok) {
      give_back_buffer(std::move(fill));
      drop_bad(*slot, outcome);
      return miss(hash, outcome.reason, outcome.detail);
    }
    bytes = std::move(fill);
    cache_.insert(*slot, bytes);
  }
  ++stats_.hits_count;
  RT_ASSERT(bytes->size() >= length_bytes, "pinned bytes shorter than the block", *slot);
  slots_.pin(*slot);
  PinId id = next_pin_id_++;
  pins_.emplace(id, PinRecord{*slot, bytes});
  RT_ASSERT(pins_.size() <= config_.pins_max, "pins over pins_max");
  return Tier2Pin{id, bytes->span().first(length_bytes)};
}

Status Tier2Store::unpin(PinId id) {
  auto it = pins_.find(id);
  if (it == pins_.end()) return invalid("tier-2 unpin: unknown pin " + std::to_string(id));
  RT_ASSERT(slots_.pin_count(it->second.slot) > 0, "pin record on an unpinned slot");
  slots_.unpin(it->second.slot);
  pins_.erase(it);
  RT_ASSERT(pins_.size() < config_.pins_max, "pins over pins_max after an unpin");
  return {};
}

VerifyReport Tier2Store::verify() {
  VerifyReport report;
  for (SlotIndex slot : slots_.stored_slots()) {
    RT_ASSERT(slots_.state(slot) == SlotState::stored, "verify of a slot not stored", slot);
    uint32_t length_bytes = slots_.meta(slot).length_bytes;
    auto target = read_scratch_.span().first(round_up_bytes(length_bytes, io_alignment_bytes));
    ReadOutcome outcome = read_slot(slot, target);
    ++report.checked_count;
    if (outcome.ok) {
      ++report.ok_count;
      continue;
    }
    ++report.dropped_count[static_cast<size_t>(outcome.reason)];
    drop_bad(slot, outcome);
  }
  RT_ASSERT(report.checked_count >= report.ok_count, "verify counted more ok than checked");
  return report;
}

Status Tier2Store::flush() {
  if (Status ready = index_ready(); !ready) return ready.error();
  if (index_commits_unsynced_ > 0) {
    rocksdb::Status synced = db_->SyncWAL();
    index_failed_ = !synced.ok();
    if (!synced.ok()) {
      note_event(Tier2EventKind::index_error, "WAL sync: " + synced.ToString());
      return make_error(ErrorKind::failed, "tier-2 index WAL sync: " + synced.ToString());
    }
    index_commits_unsynced_ = 0;
  }
  std::vector<SlotIndex> dirty = slots_.take_dirty();
  if (dirty.empty()) return {};
  rocksdb::WriteBatch batch;
  for (SlotIndex slot : dirty) {
    RT_ASSERT(slots_.state(slot) == SlotState::stored, "dirty slot not stored", slot);
    RT_ASSERT(slots_.owner(slot) == owner_self, "a foreign block was touched", slot);
    batch.Put(key_of(owner_self, slots_.hash(slot)),
              encode_index_entry(IndexEntry{slot, slots_.meta(slot)}));
  }
  rocksdb::Status status = db_->Write(rocksdb::WriteOptions(), &batch);  // not synced
  index_failed_ = !status.ok();
  if (status.ok()) return {};
  note_event(Tier2EventKind::index_error, "last-use update: " + status.ToString());
  return make_error(ErrorKind::failed, "tier-2 index last-use update: " + status.ToString());
}

Tier2Stats Tier2Store::stats() const {
  Tier2Stats s = stats_;
  const SlotCounts& c = slots_.counts();
  s.blocks_used_count = c.stored_count - c.foreign_count;
  s.blocks_foreign_count = c.foreign_count;
  s.blocks_capacity_count = slots_.slots_count();
  s.blocks_pinned_count = c.pinned_count;
  s.writes_inflight_count = writes_.size();
  s.pins_count = pins_.size();
  s.host_cache_used_bytes = cache_.used_bytes();
  RT_ASSERT(c.stored_count >= c.foreign_count, "more foreign blocks than stored ones");
  RT_ASSERT(s.blocks_used_count <= s.blocks_capacity_count, "more blocks than slots");
  return s;
}

void Tier2Store::check_invariants() const {
  slots_.check_invariants();
  RT_ASSERT(writes_.size() <= config_.writes_inflight_max, "writes over the bound");
  RT_ASSERT(pins_.size() <= config_.pins_max, "pins over the bound");
  RT_ASSERT(writes_.size() == slots_.counts().writing_count, "writes and writing slots differ");
  for (const auto& [id, write] : writes_) {
    RT_ASSERT(slots_.state(write.slot) == SlotState::writing, "write on a slot not writing", id);
    RT_ASSERT(slots_.hash(write.slot) == write.hash, "write and slot disagree on the hash", id);
  }
  std::unordered_map<SlotIndex, uint32_t> pins_by_slot;
  for (const auto& [id, pin] : pins_) ++pins_by_slot[pin.slot];
  for (const auto& [slot, count] : pins_by_slot) {
    RT_ASSERT(slots_.pin_count(slot) == count, "pin records and pin count differ", slot);
  }
  RT_ASSERT(pins_by_slot.size() == slots_.counts().pinned_count, "pinned slots without records");
  RT_ASSERT(cache_.used_bytes() <= config_.host_cache_bytes, "host cache over its bound");
  RT_ASSERT(events_.size() <= tier2_event_kinds_count, "events over the bound");
}

}  // namespace tandem::kv::tier2
