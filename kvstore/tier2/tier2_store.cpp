#include "kvstore/tier2/tier2_store.hpp"

#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tandem::kv::tier2 {
namespace {

constexpr size_t owners_max = 1024;  // distinct fingerprints kept on disk at once
constexpr const char* data_file_name = "tier2.data";
constexpr const char* index_dir_name = "index";

Error invalid(std::string message) {
  return make_error(ErrorKind::invalid, std::move(message));
}

Error index_failure(std::string_view what, const rocksdb::Status& status) {
  return make_error(ErrorKind::failed,
                    "tier-2 index " + std::string(what) + ": " + status.ToString());
}

struct Layout {
  uint64_t slot_bytes = 0;
  uint32_t slots_count = 0;
};

// The checks that need no I/O; each error names its config key.
Result<Layout> validate_config(const Tier2Config& c) {
  if (c.directory.empty()) return invalid("directory: empty (a directory for tier-2 blocks)");
  if (c.block_bytes == 0) return invalid("block_bytes: must be > 0");
  if (c.block_bytes > block_bytes_max) {
    return invalid("block_bytes: " + std::to_string(c.block_bytes) + " is above the limit of " +
                   std::to_string(block_bytes_max));
  }
  if (c.fingerprint.empty()) return invalid("fingerprint: empty (see make_fingerprint)");
  if (c.pins_max == 0 || c.pins_max > pins_max_bound) {
    return invalid("pins_max: " + std::to_string(c.pins_max) + " is not in [1, " +
                   std::to_string(pins_max_bound) + "]");
  }
  if (c.writes_inflight_max == 0 || c.writes_inflight_max > writes_inflight_max_bound) {
    return invalid("writes_inflight_max: " + std::to_string(c.writes_inflight_max) +
                   " is not in [1, " + std::to_string(writes_inflight_max_bound) + "]");
  }
  if (c.puts_batch_max == 0 || c.puts_batch_max > puts_batch_max_bound) {
    return invalid("puts_batch_max: " + std::to_string(c.puts_batch_max) + " is not in [1, " +
                   std::to_string(puts_batch_max_bound) + "]");
  }
  if (c.index_commits_per_sync == 0 || c.index_commits_per_sync > index_commits_per_sync_bound) {
    return invalid("index_commits_per_sync: " + std::to_string(c.index_commits_per_sync) +
                   " is not in [1, " + std::to_string(index_commits_per_sync_bound) + "]");
  }
  if (c.use_ticks_dirty_max == 0) return invalid("use_ticks_dirty_max: must be > 0");
  if (c.slots_max == 0 || c.slots_max > slots_max_bound) {
    return invalid("slots_max: " + std::to_string(c.slots_max) + " is not in [1, " +
                   std::to_string(slots_max_bound) + "]");
  }
  Layout layout{round_up_bytes(c.block_bytes, io_alignment_bytes), 0};
  if (c.capacity_bytes == 0) return invalid("capacity_bytes: must be > 0");
  if (c.capacity_bytes < layout.slot_bytes) {
    return invalid("capacity_bytes: " + std::to_string(c.capacity_bytes) +
                   " is smaller than one slot (" + std::to_string(layout.slot_bytes) +
                   " bytes: block_bytes rounded up to 4096)");
  }
  uint64_t slots = c.capacity_bytes / layout.slot_bytes;
  if (slots > c.slots_max) {
    return invalid("capacity_bytes: " + std::to_string(slots) + " slots of " +
                   std::to_string(layout.slot_bytes) + " bytes exceed slots_max (" +
                   std::to_string(c.slots_max) + ")");
  }
  if (c.host_cache_bytes != 0 && c.host_cache_bytes < layout.slot_bytes) {
    return invalid("host_cache_bytes: " + std::to_string(c.host_cache_bytes) +
                   " holds no block (one slot is " + std::to_string(layout.slot_bytes) +
                   " bytes); use 0 for no cache");
  }
  layout.slots_count = static_cast<uint32_t>(slots);
  RT_ASSERT(layout.slots_count >= 1, "validated layout has no slot");
  RT_ASSERT(layout.slot_bytes % io_alignment_bytes == 0, "slot size unaligned");
  return layout;
}

// The directory exists, is a directory, and a file can be created in it (also as root on a
// read-only mount); the data file fits in the file system's free space.
Status check_directory(const Tier2Config& c, uint64_t data_file_bytes) {
  struct stat st {};
  if (::stat(c.directory.c_str(), &st) != 0) {
    return invalid("directory: " + c.directory + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return invalid("directory: " + c.directory + " is not a directory");
  std::string probe = c.directory + "/.tier2-write-probe";
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return invalid("directory: " + c.directory + " is not writable: " + std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  struct statvfs vfs {};
  if (::statvfs(c.directory.c_str(), &vfs) != 0) {
    return invalid("directory: statvfs " + c.directory + ": " + std::strerror(errno));
  }
  uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  uint64_t allocated_bytes = 0;  // an existing data file's blocks count as available
  std::string data_path = c.directory + "/" + data_file_name;
  if (::stat(data_path.c_str(), &st) == 0) allocated_bytes = uint64_t(st.st_blocks) * 512;
  if (data_file_bytes + index_reserve_bytes > free_bytes + allocated_bytes) {
    return invalid("capacity_bytes: " + std::to_string(c.capacity_bytes) + " and " +
                   std::to_string(index_reserve_bytes) + " bytes for the index exceed the free "
                   "space of " + c.directory + " (" +
                   std::to_string(free_bytes + allocated_bytes) + " bytes available)");
  }
  return {};
}

}  // namespace

std::string_view to_string(Tier2Miss reason) {
  switch (reason) {
    case Tier2Miss::absent:
      return "absent";
    case Tier2Miss::short_read:
      return "short_read";
    case Tier2Miss::io_error:
      return "io_error";
    case Tier2Miss::checksum:
      return "checksum";
  }
  return "unknown";
}

std::string_view to_string(Tier2EventKind kind) {
  switch (kind) {
    case Tier2EventKind::miss_short_read:
      return "miss_short_read";
    case Tier2EventKind::miss_io_error:
      return "miss_io_error";
    case Tier2EventKind::miss_checksum:
      return "miss_checksum";
    case Tier2EventKind::put_io_error:
      return "put_io_error";
    case Tier2EventKind::index_error:
      return "index_error";
    case Tier2EventKind::index_entry_invalid:
      return "index_entry_invalid";
    case Tier2EventKind::index_slot_out_of_range:
      return "index_slot_out_of_range";
    case Tier2EventKind::index_slot_conflict:
      return "index_slot_conflict";
    case Tier2EventKind::layout_changed:
      return "layout_changed";
    case Tier2EventKind::fingerprint_collision:
      return "fingerprint_collision";
    case Tier2EventKind::data_file_missing:
      return "data_file_missing";
  }
  return "unknown";
}

std::string make_fingerprint(const KvLayout& l) {
  return "model=" + l.model + ";dtype=" + l.dtype +
         ";block_tokens=" + std::to_string(l.block_tokens) +
         ";layers=" + std::to_string(l.layers_count) +
         ";kv_heads=" + std::to_string(l.kv_heads_count) +
         ";head_dim=" + std::to_string(l.head_dim) + ";extra=" + l.extra;
}

Tier2Store::Tier2Store(Tier2Config config, uint64_t slot_bytes, uint32_t slots_count)
    : config_(std::move(config)),
      slot_bytes_(slot_bytes),
      digest_(tier2::fingerprint_digest(config_.fingerprint, config_.block_bytes)),
      slots_(slots_count),
      cache_(config_.host_cache_bytes, slot_bytes),
      read_scratch_(slot_bytes) {
  owners_.push_back(digest_);
}

Tier2Store::~Tier2Store() {
  if (db_ == nullptr) return;
  (void)flush();
  (void)db_->Close();
}

Result<std::unique_ptr<Tier2Store>> Tier2Store::open(const Tier2Config& config,
                                                     Tier2OpenHooks hooks) {
  auto layout = validate_config(config);
  if (!layout) return layout.error();
  if (Status dir = check_directory(config, layout->slot_bytes * layout->slots_count); !dir) {
    return dir.error();
  }
  std::unique_ptr<Tier2Store> store(
      new Tier2Store(config, layout->slot_bytes, layout->slots_count));
  // In order; the first failure ends the open (the destructor closes what was opened).
  Status step = store->open_index();
  if (step) step = store->check_format();
  if (step) step = store->check_layout();
  if (step) step = store->check_fingerprint_record();
  if (step) step = store->open_data_file(hooks);
  if (step) step = store->load_entries();
  if (!step) return step.error();
  RT_ASSERT(store->file_ != nullptr && store->db_ != nullptr, "open left a part unopened");
  store->check_invariants();
  return store;
}

namespace {

// RocksDB's own LOG file lives on the store's disk. When that disk fills, a log line after a
// failed append trips an assertion in Debian's librocksdb (WritableFileWriter: "written to
// again after an error") and aborts the node. The store reports index errors itself (its
// events and statuses), so RocksDB's log is not kept.
class DiscardLogger final : public rocksdb::Logger {
 public:
  DiscardLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::FATAL_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* /*format*/, va_list /*ap*/) override {}
};

}  // namespace

Status Tier2Store::open_index() {
  RT_ASSERT(db_ == nullptr, "index opened twice");
  rocksdb::Options options;
  options.info_log = std::make_shared<DiscardLogger>();
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.write_buffer_size = 8u << 20;    // entries are ~100 bytes: 8 MiB holds ~80k
  options.max_total_wal_size = 64u << 20;  // bounds the WAL replayed at open
  options.keep_log_file_num = 4;
  options.max_open_files = 256;
  std::string path = config_.directory + "/" + index_dir_name;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status status = rocksdb::DB::Open(options, path, &raw);
  if (!status.ok()) return index_failure("open " + path, status);
  db_.reset(raw);
  RT_ASSERT(db_ != nullptr, "RocksDB open returned ok and no handle");
  return {};
}

// The format record: absent in a new index (written now), refused when newer than ours.
Status Tier2Store::check_format() {
  RT_ASSERT(db_ != nullptr, "check_format before open_index");
  std::string value;
  rocksdb::Status status = db_->Get(rocksdb::ReadOptions(), meta_key("format"), &value);
  if (status.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    if (it->Valid()) {
      return invalid("directory: " + config_.directory + "/" + index_dir_name +
                     " holds a database that is not a tier-2 index (no format record)");
    }
    rocksdb::WriteOptions sync;
    sync.sync = true;
    status = db_->Put(sync, meta_key("format"), encode_u64(format_version_current));
    if (!status.ok()) return index_failure("write format record", status);
    return {};
  }
  if (!status.ok()) return index_failure("read format record", status);
  auto version = decode_u64(value);
  if (!version) return index_failure("format record", rocksdb::Status::Corruption("bad size"));
  if (*version != format_version_current) {
    return make_error(ErrorKind::unimplemented,
                      "directory: " + config_.directory + " holds tier-2 format version " +
                          std::to_string(*version) + "; this build reads version " +
                          std::to_string(format_version_current) +
                          (*version > format_version_current
                               ? " (written by a newer tandem: upgrade, or use another directory)"
                               : " (no migration from older versions)"));
  }
  RT_ASSERT(*version == format_version_current, "format check fell through");
  return {};
}

namespace {

// The smallest key above every key that starts with `prefix`: the end of its range.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty() && static_cast<uint8_t>(prefix.back()) == 0xff) prefix.pop_back();
  RT_ASSERT(!prefix.empty(), "a prefix of 0xff bytes only has no end");
  prefix.back() = static_cast<char>(static_cast<uint8_t>(prefix.back()) + 1);
  return prefix;
}

// Deletes every entry whose key starts with `prefix` with one synced range delete (constant
// size, however many entries; the sync also makes every earlier unsynced delete durable);
// returns how many there were.
Result<uint64_t> delete_prefix(rocksdb::DB& db, const std::string& prefix) {
  RT_ASSERT(!prefix.empty(), "deleting every key of the index");
  uint64_t count = 0;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) ++count;
  if (!it->status().ok()) return index_failure("scan " + prefix, it->status());
  rocksdb::WriteBatch batch;
  rocksdb::Status status = batch.DeleteRange(prefix, prefix_end(prefix));
  if (!status.ok()) return index_failure("delete entries", status);
  rocksdb::WriteOptions sync;
  sync.sync = true;
  status = db.Write(sync, &batch);
  if (!status.ok()) return index_failure("delete entries", status);
  return count;
}

}  // namespace

// slot_bytes decides where every slot lies: entries written under another slot size point
// at the wrong bytes, so all of them go (the data file is reused as empty).
Status Tier2Store::check_layout() {
  RT_ASSERT(db_ != nullptr, "check_layout before open_index");
  std::string value;
  rocksdb::Status status = db_->Get(rocksdb::ReadOptions(), meta_key("slot_bytes"), &value);
  if (!status.ok() && !status.IsNotFound()) return index_failure("read layout", status);
  auto stored = status.ok() ? decode_u64(value) : std::optional<uint64_t>(slot_bytes_);
  if (stored != slot_bytes_) {
    auto dropped = delete_prefix(*db_, std::string(1, block_key_tag));
    if (!dropped) return dropped.error();
    stats_.index_dropped_count += *dropped;
    note_event(Tier2EventKind::layout_changed,
               "slot_bytes " + (stored ? std::to_string(*stored) : std::string("unreadable")) +
                   " -> " + std::to_string(slot_bytes_) + ": " + std::to_string(*dropped) +
                   " entries dropped");
  }
  rocksdb::WriteOptions sync;
  sync.sync = true;
  status = db_->Put(sync, meta_key("slot_bytes"), encode_u64(slot_bytes_));
  if (!status.ok()) return index_failure("write layout", status);
  RT_ASSERT(slot_bytes_ % io_alignment_bytes == 0, "slot size unaligned");
  return {};
}

// Our digest's record must name our fingerprint text. If it names another (a 128-bit digest
// collision), the entries under the digest are not ours: they are deleted, never served.
Status Tier2Store::check_fingerprint_record() {
  RT_ASSERT(db_ != nullptr, "check_fingerprint_record before open_index");
  std::string key = fingerprint_key(digest_);
  std::string value;
  rocksdb::Status status = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (!status.ok() && !status.IsNotFound()) return index_failure("read fingerprint", status);
  if (status.ok() && value == config_.fingerprint) return {};
  if (status.ok()) {
    std::string prefix = encode_block_key(digest_, BlockHash{}).substr(0, 17);
    auto dropped = delete_prefix(*db_, prefix);
    if (!dropped) return dropped.error();
    stats_.index_dropped_count += *dropped;
    note_event(Tier2EventKind::fingerprint_collision,
               "digest " + digest_.hex() + " was recorded for '" + value + "', not '" +
                   config_.fingerprint + "': " + std::to_string(*dropped) + " entries dropped");
  }
  rocksdb::WriteOptions sync;
  sync.sync = true;
  status = db_->Put(sync, key, config_.fingerprint);
  if (!status.ok()) return index_failure("write fingerprint", status);
  RT_ASSERT(owners_.size() == 1 && owners_[0] == digest_, "owners set before the scan");
  return {};
}

Status Tier2Store::open_data_file(Tier2OpenHooks& hooks) {
  std::string path = config_.directory + "/" + data_file_name;
  uint64_t size_bytes = slot_bytes_ * slots_.slots_count();
  std::error_code ec;
  data_file_created_ = !std::filesystem::exists(path, ec);
  auto file = PosixBlockFile::open(path, size_bytes, config_.io_mode);
  if (!file) return file.error();
  file_ = std::move(*file);
  if (hooks.wrap_file) file_ = hooks.wrap_file(std::move(file_));
  RT_ASSERT(file_ != nullptr, "wrap_file returned no file");
  RT_ASSERT(file_->size_bytes() == size_bytes, "data file size", file_->size_bytes());
  return {};
}

// Rebuilds the slot map from the index. Entries that cannot be used are deleted in one
// synced batch at the end.
Status Tier2Store::load_entries() {
  RT_ASSERT(db_ != nullptr && file_ != nullptr, "load_entries before the index and data file");
  std::string value;
  rocksdb::Status status = db_->Get(rocksdb::ReadOptions(), meta_key("generation"), &value);
  if (status.ok()) generation_ = decode_u64(value).value_or(0);
  if (!status.ok() && !status.IsNotFound()) return index_failure("read generation", status);
  if (data_file_created_) {  // a new data file holds none of the indexed blocks
    auto dropped = delete_prefix(*db_, std::string(1, block_key_tag));
    if (!dropped) return dropped.error();
    stats_.index_dropped_count += *dropped;
    if (*dropped > 0) {
      note_event(Tier2EventKind::data_file_missing,
                 std::to_string(*dropped) + " entries dropped: the data file was created anew");
    }
  }
  rocksdb::WriteBatch deletes;
  uint64_t max_tick = 0;
  std::string prefix(1, block_key_tag);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    std::string_view val(it->value().data(), it->value().size());
    load_entry(key, val, &max_tick, &deletes);
  }
  if (!it->status().ok()) return index_failure("scan entries", it->status());
  if (deletes.Count() > 0) {
    rocksdb::WriteOptions sync;
    sync.sync = true;
    status = db_->Write(sync, &deletes);
    if (!status.ok()) return index_failure("delete unusable entries", status);
    stats_.index_dropped_count += deletes.Count();
  }
  slots_.restore_finish();
  tick_ = max_tick;
  RT_ASSERT(slots_.counts().stored_count <= slots_.slots_count(), "more entries than slots");
  return {};
}

void Tier2Store::load_entry(std::string_view key, std::string_view value, uint64_t* max_tick,
                            rocksdb::WriteBatch* deletes) {
  auto drop = [this, key, deletes](Tier2EventKind kind, std::string detail) {
    deletes->Delete(rocksdb::Slice(key.data(), key.size()));
    note_event(kind, std::move(detail));
  };
  auto k = decode_block_key(key);
  auto e = decode_index_entry(value);
  if (!k || !e || e->meta.length_bytes > slot_bytes_) {
    return drop(Tier2EventKind::index_entry_invalid,
                "entry of " + std::to_string(value.size()) + " bytes under a key of " +
                    std::to_string(key.size()) + " bytes is not a valid index entry");
  }
  if (e->slot_index >= slots_.slots_count()) {
    return drop(Tier2EventKind::index_slot_out_of_range,
                "slot " + std::to_string(e->slot_index) + " >= slots " +
                    std::to_string(slots_.slots_count()) + " (capacity shrank)");
  }
  auto owner_it = std::find(owners_.begin(), owners_.end(), k->fingerprint);
  if (owner_it == owners_.end() && owners_.size() >= owners_max) {
    return drop(Tier2EventKind::index_entry_invalid, "more than 1024 fingerprints on disk");
  }
  if (owner_it == owners_.end()) owner_it = owners_.insert(owners_.end(), k->fingerprint);
  auto owner = static_cast<OwnerIndex>(owner_it - owners_.begin());
  auto slot = static_cast<SlotIndex>(e->slot_index);
  Victim displaced;
  RestoreOutcome outcome = slots_.restore(slot, owner, k->hash, e->meta, &displaced);
  std::string conflict = "slot " + std::to_string(slot) + " claimed twice; older dropped";
  if (outcome == RestoreOutcome::rejected)
    return drop(Tier2EventKind::index_slot_conflict, conflict);
  if (outcome == RestoreOutcome::replaced) {
    deletes->Delete(key_of(displaced.owner, displaced.hash));
    note_event(Tier2EventKind::index_slot_conflict, conflict);
  }
  *max_tick = std::max(*max_tick, e->meta.last_use_tick);
  generation_ = std::max(generation_, e->meta.generation);
}

Result<DropReport> Tier2Store::drop_all() {
  if (Status ready = index_ready(); !ready) return ready.error();
  auto deleted = delete_prefix(*db_, std::string(1, block_key_tag));
  if (!deleted) {
    note_event(Tier2EventKind::index_error, "drop of every block: " + deleted.error().message);
    return deleted.error();
  }
  index_commits_unsynced_ = 0;  // the synced write synced the whole WAL before it
  DropReport report;
  for (SlotIndex slot : slots_.stored_slots()) {
    if (slots_.pin_count(slot) > 0) ++report.pinned_count;
    if (slots_.owner(slot) == owner_self) record_removed(slots_.hash(slot));
    cache_.erase(slot);
    slots_.drop(slot);  // freed now, or doomed until its last unpin
    ++report.dropped_count;
  }
  RT_ASSERT(slots_.counts().stored_count == 0, "a block survived drop_all");
  // Every stored block had an entry (evicted ones may linger: their deletes can fail).
  RT_ASSERT(*deleted >= report.dropped_count, "fewer entries than stored blocks", *deleted);
  return report;
}

std::string Tier2Store::key_of(OwnerIndex owner, const BlockHash& hash) const {
  RT_ASSERT(owner < owners_.size(), "unknown owner", owner);
  return encode_block_key(owners_[owner], hash);
}

void Tier2Store::note_event(Tier2EventKind kind, std::string detail) {
  auto k = static_cast<size_t>(kind);
  RT_ASSERT(k < tier2_event_kinds_count, "event kind out of range", k);
  if (event_reported_[k]) return;
  event_reported_[k] = true;
  events_.push_back(Tier2Event{kind, std::move(detail)});
  RT_ASSERT(events_.size() <= tier2_event_kinds_count, "more events than kinds");
}

std::vector<Tier2Event> Tier2Store::drain_events() {
  std::vector<Tier2Event> out;
  out.swap(events_);
  return out;
}

std::vector<BlockHash> Tier2Store::drain_removed(bool* overflowed) {
  std::vector<BlockHash> out;
  out.swap(removed_);
  *overflowed = removed_overflow_;
  removed_overflow_ = false;
  RT_ASSERT(removed_.empty());
  return out;
}

}  // namespace tandem::kv::tier2
