// Tier2Store: a node-local store of fixed-size KV blocks on NVMe with a RocksDB index. It
// survives restarts and never serves a wrong block: every read is verified, every failure
// is a miss, and a block is invisible until it is durable.
//
// Layout of `directory`:
//   tier2.data   one preallocated file of slots_count slots of slot_bytes each
//                (slot_bytes = block_bytes rounded up to 4096); O_DIRECT when accepted;
//   index/       RocksDB: (fingerprint digest, block hash) -> (slot, length, checksum,
//                last-use tick, generation), plus format/layout records (tier2_format.hpp).
//
// Guarantees:
//   durable before visible  put writes the slot, fdatasyncs the data file, then writes the
//                           index entry with WriteOptions::sync = true (the WAL is fsynced);
//                           only then can contains/get/pin see the block. A crash at any
//                           point leaves no entry, or an entry whose bytes are complete.
//                           (index_commits_per_sync > 1 relaxes only the index's sync; the
//                           data is still fdatasynced before its entry exists.)
//   every read verified     length and XXH3-128 over (key, length, generation, data); a
//                           short read, an I/O error or a mismatch is a miss (kind
//                           not_found), counted by reason; the entry is dropped and its slot
//                           freed; the first event of each reason is kept for drain_events().
//   never a wrong block     the key includes the fingerprint digest (model + KV layout +
//                           block_bytes); another fingerprint's entries are never served.
// Deletes (eviction, drops) and last-use updates are NOT synced: a crash may bring an
// evicted entry back, and then its slot holds another block's bytes, which fail the checksum
// (key and generation are in it): the resurrected entry is a miss, never a wrong block.
//
// Threads: single owner. One actor (kv-offload) calls every method; nothing is thread-safe.
// The calls block on the disk and on RocksDB (pwrite/pread/fdatasync, synced WAL writes), so
// the owning actor must run `detached` (its own thread), never on the scheduler's workers.
//
// Memory: ~170 bytes per slot (slot map) + host_cache_bytes + pins_max x slot_bytes (pinned
// blocks the cache let go of) + writes_inflight_max x slot_bytes (two-phase write buffers)
// + up to puts_batch_max x slot_bytes during a put_batch with the host cache on (its copies,
// which then become cache entries) + RocksDB's memtable and block cache (a few MiB; the index
// holds ~100 bytes per block).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvstore/block_hash.hpp"
#include "kvstore/tier2/block_file.hpp"
#include "kvstore/tier2/host_cache.hpp"
#include "kvstore/tier2/slot_table.hpp"
#include "kvstore/tier2/tier2_format.hpp"
#include "runtime/base/result.hpp"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace tandem::kv::tier2 {

// The identity of what a block's bytes mean: two stores (or one store across restarts) share
// blocks only when their fingerprints are equal. Compose it with make_fingerprint.
struct KvLayout {
  std::string model;          // model name and revision, e.g. "MiniMax-M2.7@abc123"
  std::string dtype;          // KV element type, e.g. "bf16", "fp8_e4m3"
  uint32_t block_tokens = 0;  // tokens per block
  uint32_t layers_count = 0;  // layers whose KV the block holds
  uint32_t kv_heads_count = 0;
  uint32_t head_dim = 0;
  std::string extra;  // anything else that changes the bytes (TP rank, PP stage, ...)
};
// "model=...;dtype=...;block_tokens=...;layers=...;kv_heads=...;head_dim=...;extra=..."
std::string make_fingerprint(const KvLayout& layout);

struct Tier2Config {
  std::string directory;              // must exist and be writable
  uint64_t capacity_bytes = 0;        // data file size; slots = capacity_bytes / slot_bytes
  uint64_t block_bytes = 0;           // largest block; slot_bytes = block_bytes rounded up to 4096
  uint64_t host_cache_bytes = 0;      // RAM cache of verified blocks (LRU); 0 = none
  uint32_t pins_max = 256;            // pins held at once
  uint32_t writes_inflight_max = 16;  // put_begin reservations not yet committed or aborted
  uint32_t puts_batch_max = 64;       // blocks per put_batch (one group commit)
  std::string fingerprint;            // make_fingerprint(...) of the model + KV layout
  uint64_t slots_max = 1u << 22;      // bound on slots_count (memory ~170 bytes per slot)
  uint32_t use_ticks_dirty_max = 4096;  // last-use updates held before flush() runs itself
  // Index commits (a put, put_commit or put_batch each) per WAL fsync. 1: a put is in the
  // durable index when it returns. N > 1: one device flush per put instead of two; a power
  // loss (not a process crash) can forget up to the last N - 1 commits: misses, never wrong
  // bytes, since the data is fdatasynced before its entry is written either way.
  uint32_t index_commits_per_sync = 1;
  IoModeRequest io_mode = IoModeRequest::direct_if_supported;
};
// Bounds on the config checked at open (beyond them: invalid).
inline constexpr uint32_t pins_max_bound = 1u << 20;
inline constexpr uint32_t writes_inflight_max_bound = 1024;
inline constexpr uint32_t puts_batch_max_bound = 4096;
inline constexpr uint32_t index_commits_per_sync_bound = 65536;
inline constexpr uint64_t slots_max_bound = 1ull << 28;
inline constexpr uint64_t block_bytes_max = 1ull << 31;  // 2 GiB; the index stores u32 lengths
// Room the RocksDB index needs beside the data file: its WAL and first files preallocate
// about 13 MB on ext4 and tmpfs, and it grows with the blocks held. A store is refused at
// open unless the data file and this much more fit in the free space.
inline constexpr uint64_t index_reserve_bytes = 64ull << 20;

// Why a get/pin missed (Error kind not_found; the message starts with the reason).
enum class Tier2Miss : uint8_t {
  absent,      // no entry: never stored, evicted, dropped, or another fingerprint's
  short_read,  // the file returned fewer bytes than the block's slot holds
  io_error,    // the read failed (EIO, ...)
  checksum,    // the bytes read do not match the checksum over key + length + data
};
inline constexpr size_t tier2_miss_reasons_count = 4;
std::string_view to_string(Tier2Miss reason);

// Noteworthy events; the first of each kind since open is kept for drain_events() (bounded
// by the number of kinds). Details name slots, hashes and generations, never block bytes.
enum class Tier2EventKind : uint8_t {
  miss_short_read,
  miss_io_error,
  miss_checksum,
  put_io_error,             // a put failed on the data file or the index (put dropped)
  index_error,              // a RocksDB delete/update failed (safe: see the header comment)
  index_entry_invalid,      // at open: an undecodable key/value, or a length above slot_bytes
  index_slot_out_of_range,  // at open: an entry past the data file's slots (capacity shrank)
  index_slot_conflict,      // at open: two entries claim one slot; the older one is dropped
  layout_changed,           // at open: slot_bytes differs from the index's; every entry dropped
  fingerprint_collision,    // at open: our digest's record names another fingerprint text
  data_file_missing,        // at open: entries exist but the data file did not; all dropped
};
inline constexpr size_t tier2_event_kinds_count = 11;
std::string_view to_string(Tier2EventKind kind);

struct Tier2Event {
  Tier2EventKind kind;
  std::string detail;
};

struct Tier2Stats {
  uint64_t hits_count = 0;        // get/pin served (host cache or verified disk read)
  uint64_t cache_hits_count = 0;  // of those, from the host cache
  std::array<uint64_t, tier2_miss_reasons_count> misses_count{};  // by Tier2Miss
  uint64_t puts_count = 0;               // blocks stored (durable and visible)
  uint64_t puts_duplicate_count = 0;     // puts of a block already stored or being written
  uint64_t puts_dropped_full_count = 0;  // overloaded: no victim, or writes in flight at max
  uint64_t puts_dropped_io_count = 0;    // failed: data write, sync or index write
  uint64_t evictions_count = 0;          // blocks evicted to make room (incl. foreign)
  uint64_t evictions_foreign_count = 0;  // of those, another fingerprint's
  uint64_t corrupt_dropped_count = 0;    // entries dropped by a failed read check (get/pin/verify)
  uint64_t index_dropped_count = 0;      // entries dropped at open (invalid, conflict, ...)
  uint64_t read_bytes = 0;               // data-file bytes read (slot-rounded)
  uint64_t written_bytes = 0;            // data-file bytes written (slot-rounded)
  uint64_t blocks_used_count = 0;        // visible blocks of this fingerprint
  uint64_t blocks_foreign_count = 0;     // other fingerprints' blocks still on disk
  uint64_t blocks_capacity_count = 0;    // slots
  uint64_t blocks_pinned_count = 0;      // slots with at least one pin
  uint64_t writes_inflight_count = 0;
  uint64_t pins_count = 0;
  uint64_t host_cache_used_bytes = 0;
};

struct VerifyReport {
  uint64_t checked_count = 0;  // stored blocks read back (own and foreign)
  uint64_t ok_count = 0;
  std::array<uint64_t, tier2_miss_reasons_count> dropped_count{};  // by Tier2Miss
};

struct DropReport {
  uint64_t dropped_count = 0;  // stored blocks dropped (own and foreign)
  uint64_t pinned_count = 0;   // of those, pinned: their slots are freed at their last unpin
};

using WriteId = uint64_t;
using PinId = uint64_t;

enum class PutOutcome {
  stored,     // durable and visible
  duplicate,  // already stored, or a write of it is in flight: nothing written
};

struct PutItem {
  BlockHash hash;
  std::span<const uint8_t> data;  // borrowed until put_batch returns
};

// A reserved slot for a two-phase put (Mooncake's put start/end): fill `buffer` (aligned,
// slot_bytes long; e.g. the target of an RMA pull), then put_commit or put_abort.
struct PutStart {
  PutOutcome outcome = PutOutcome::stored;  // duplicate: id is 0, buffer empty; nothing to do
  WriteId id = 0;
  std::span<uint8_t> buffer;  // valid until put_commit/put_abort of id
};

struct Tier2Pin {
  PinId id = 0;
  std::span<const uint8_t> bytes;  // verified block bytes; valid until unpin(id)
};

// Test and tooling hooks for open(); production passes none.
struct Tier2OpenHooks {
  // Wraps the data file (e.g. in a FaultyBlockFile); receives the PosixBlockFile.
  std::function<std::unique_ptr<BlockFile>(std::unique_ptr<BlockFile>)> wrap_file;
};

class Tier2Store {
 public:
  // Validates the config, opens (or creates) the index and the data file, and rebuilds the
  // slot map from the index: unreferenced slots are free; other fingerprints' entries stay
  // on disk, unserved, evicted before any of ours; invalid, out-of-range and conflicting
  // entries are deleted (counted in index_dropped_count, reported as events).
  // Errors: invalid naming the config key ("directory: ...", "capacity_bytes: ...",
  // "block_bytes: ...", "fingerprint: ...", "pins_max: ...", ...); unimplemented when the
  // index has a newer format version; failed when RocksDB or the data file cannot be opened
  // (e.g. another process holds the directory: RocksDB's LOCK).
  // Cost: O(entries) RocksDB scan + O(slots log slots); a fallocate of a new data file.
  static Result<std::unique_ptr<Tier2Store>> open(const Tier2Config& config,
                                                  Tier2OpenHooks hooks = {});
  // Persists last-use ticks (flush()), closes RocksDB. Pins and writes in flight are dropped.
  ~Tier2Store();
  Tier2Store(const Tier2Store&) = delete;
  Tier2Store& operator=(const Tier2Store&) = delete;

  // Stores `data` as block `hash` (a put_batch of one): reserve a slot (a free one, else
  // evict the LRU evictable block), write, fdatasync, synced index write; only then visible
  // (and host-cached). `duplicate` when the block is already stored (counted as a use) or
  // being written. Errors: invalid (empty or longer than block_bytes); overloaded (no free or
  // evictable slot: every slot pinned or being written; the caller drops the write, never
  // waits); failed (I/O or index error; nothing visible, the slot is free again; a block
  // evicted to make room stays evicted).
  // Cost: one pwrite of the slot-rounded length (from `data` itself when it is 4096-aligned
  // and a multiple of 4096 long or the file is buffered, else via a copy), XXH3-128 of the
  // block, one fdatasync, one RocksDB write with a WAL fsync: two device flushes (with
  // index_commits_per_sync N > 1 the WAL fsync comes with every N-th commit only).
  Result<PutOutcome> put(const BlockHash& hash, std::span<const uint8_t> data);

  // Group commit: stores up to puts_batch_max blocks with one fdatasync and one synced
  // index batch for all of them (a prompt's blocks arrive together); one result per item,
  // in order, as put's. The blocks become visible together once both flushes are done; if
  // either fails, every staged block of the batch fails. Cost: n pwrites + 2 device flushes.
  // Preconditions (asserted): items.size() <= puts_batch_max.
  std::vector<Result<PutOutcome>> put_batch(std::span<const PutItem> items);

  // Two-phase put. put_begin reserves a slot (evicting as put does) and a buffer; the block
  // is invisible and the slot unevictable until put_commit(id, length_bytes) makes it
  // durable and visible (same costs and errors as put), or put_abort(id) frees both.
  // Errors: as put, and put_begin is overloaded at writes_inflight_max; put_commit of a bad
  // length or an unknown id, put_abort of an unknown id: invalid (no effect).
  Result<PutStart> put_begin(const BlockHash& hash);
  Result<PutOutcome> put_commit(WriteId id, uint64_t length_bytes);
  Status put_abort(WriteId id);

  // Whether `hash` is visible (stored, durable, this fingerprint). No I/O, no LRU change.
  bool contains(const BlockHash& hash) const;

  // Copies the verified block into out[0, length) and returns length. On a miss, out[0,
  // out.size()) is zero-filled (never unverified bytes) and the error is not_found; see
  // last_miss(). Errors: invalid when out is smaller than the block (no effect). Cost: a host
  // cache hit is a memcpy; else one pread of the slot (straight into `out` when it is
  // 4096-aligned and holds the slot-rounded length, else into a buffer, then memcpy) plus
  // XXH3-128 of the block.
  Result<uint64_t> get(const BlockHash& hash, std::span<uint8_t> out);

  // Pins the block and returns its verified bytes, valid until unpin(id): the block is not
  // evicted while pinned. Errors: not_found (miss, as get); overloaded at pins_max.
  // Cost: as get (a disk read lands in a new buffer that the host cache also keeps).
  Result<Tier2Pin> pin(const BlockHash& hash);
  // Errors: invalid for an unknown (or already released) id.
  Status unpin(PinId id);

  // Re-reads every stored block (own and foreign; not the host cache), drops the bad ones.
  // Cost: one pread + checksum per block: the whole data file's used part.
  VerifyReport verify();

  // Drops every stored block, own and foreign (an operator's `tier2 drop`): one synced index
  // write deletes every block entry, then each block is invisible, its cached copy gone and
  // its slot free. A pinned block is dropped too: invisible at once, its pin's bytes valid
  // until unpin, its slot freed at the last unpin (not reused before). Writes in flight
  // (put_begin, not yet committed) are not blocks yet: they stay, and put_commit makes them
  // visible as usual. Durable: once it returns, no dropped block comes back after a restart
  // or a crash. Errors: failed (the index write; nothing is dropped then).
  // Cost: a key scan of the index (to count) + one synced RocksDB range delete + O(slots).
  Result<DropReport> drop_all();

  // Syncs the WAL if commits are unsynced (index_commits_per_sync > 1) and persists last-use
  // ticks (one unsynced RocksDB batch). Errors: failed (index write or sync).
  Status flush();

  // This fingerprint's visible blocks (e.g. to announce them after a restart). O(blocks).
  std::vector<BlockHash> blocks() const;
  std::vector<Tier2Event> drain_events();
  // This store's own blocks removed (evicted, dropped by a failed read check, or by drop_all)
  // since the last call, in order, for the router's precise events. At most removed_max are kept;
  // *overflowed says more went (the list is then incomplete: resend blocks() instead).
  static constexpr size_t removed_max = 65536;
  std::vector<BlockHash> drain_removed(bool* overflowed);
  Tier2Stats stats() const;
  Tier2Miss last_miss() const { return last_miss_; }  // of the latest get/pin miss
  IoMode io_mode() const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t slots_count() const { return slots_.slots_count(); }
  const FingerprintDigest& fingerprint_digest() const { return digest_; }
  const Tier2Config& config() const { return config_; }

  // O(slots) consistency check of the slot map, the cache and the pin/write records;
  // aborts (RT_ASSERT) on a violation. For tests.
  void check_invariants() const;

 private:
  struct Write {
    SlotIndex slot;
    BlockHash hash;
    std::shared_ptr<AlignedBuffer> buffer;
  };
  struct PinRecord {
    SlotIndex slot;
    SharedBytes bytes;
  };
  struct Staged {  // a block of a put whose bytes are in its slot, not yet durable
    SlotIndex slot;
    BlockHash hash;
    SlotMeta meta;
    std::shared_ptr<AlignedBuffer> cached;  // a copy for the host cache, or null
  };
  struct ReadOutcome {
    bool ok = false;
    Tier2Miss reason = Tier2Miss::absent;
    std::string detail;
  };

  Tier2Store(Tier2Config config, uint64_t slot_bytes, uint32_t slots_count);
  Status open_index();
  Status check_format();
  Status check_layout();
  Status check_fingerprint_record();
  Status load_entries();
  void load_entry(std::string_view key, std::string_view value, uint64_t* max_tick,
                  rocksdb::WriteBatch* deletes);
  Status open_data_file(Tier2OpenHooks& hooks);

  Status delete_entry(OwnerIndex owner, const BlockHash& hash);
  void record_removed(const BlockHash& hash);  // for drain_removed (own blocks only)
  std::string key_of(OwnerIndex owner, const BlockHash& hash) const;
  Result<Reservation> reserve_slot(const BlockHash& hash);
  std::optional<PutOutcome> check_duplicate(const BlockHash& hash);
  Status check_length(uint64_t length_bytes) const;
  Result<std::optional<Staged>> stage(const PutItem& item);
  Result<SlotMeta> write_data(SlotIndex slot, const BlockHash& hash,
                              std::span<const uint8_t> source, uint64_t length_bytes);
  Status make_durable(std::vector<Staged>& staged);
  Error fail_write(SlotIndex slot, const BlockHash& hash, const std::string& what);
  ReadOutcome read_slot(SlotIndex slot, std::span<uint8_t> target);
  Error miss(const BlockHash& hash, Tier2Miss reason, const std::string& detail);
  void drop_bad(SlotIndex slot, const ReadOutcome& outcome);
  void use(SlotIndex slot);  // touch + the automatic flush of last-use ticks
  std::shared_ptr<AlignedBuffer> take_buffer();
  void give_back_buffer(std::shared_ptr<AlignedBuffer> buffer);
  void note_event(Tier2EventKind kind, std::string detail);
  uint64_t next_tick() { return ++tick_; }

  Tier2Config config_;
  uint64_t slot_bytes_;
  FingerprintDigest digest_;
  std::vector<FingerprintDigest> owners_;  // [0] = ours; foreign digests seen at open
  std::unique_ptr<rocksdb::DB> db_;  // null only while a reopen after a failure failed
  Status index_ready();
  std::unique_ptr<BlockFile> file_;
  SlotTable slots_;
  HostCache cache_;
  std::unordered_map<WriteId, Write> writes_;                  // <= writes_inflight_max
  std::unordered_map<PinId, PinRecord> pins_;                  // <= pins_max
  std::vector<std::shared_ptr<AlignedBuffer>> spare_buffers_;  // <= writes_inflight_max
  AlignedBuffer read_scratch_;  // slot_bytes: reads that do not go to a caller
  WriteId next_write_id_ = 1;
  PinId next_pin_id_ = 1;
  uint64_t tick_ = 0;
  uint64_t generation_ = 0;  // of the latest write; persisted as a high-water mark
  Tier2Miss last_miss_ = Tier2Miss::absent;
  bool data_file_created_ = false;       // open created the data file (it did not exist)
  uint32_t index_commits_unsynced_ = 0;  // < index_commits_per_sync
  bool index_failed_ = false;  // the last index write failed: index_ready() reopens it
  Tier2Stats stats_;
  std::array<bool, tier2_event_kinds_count> event_reported_{};
  std::vector<Tier2Event> events_;  // <= tier2_event_kinds_count
  std::vector<BlockHash> removed_;  // <= removed_max (drain_removed)
  bool removed_overflow_ = false;
};

}  // namespace tandem::kv::tier2
