// The kv-offload role's pure core (issue 13): who holds which slot of the registered staging
// memory, and what tier 2 is believed to hold. No threads, clocks or I/O: the shell passes
// `now`, does the RMA reads and the disk I/O (on the store's own thread), and reports back.
//
// Staging is `staging_blocks` slots of one KV block each, registered with the fabric. Every
// block that enters or leaves tier 2 passes through a slot:
// - store (prefill -> tier 2): begin_store grants a slot per offered block that tier 2 does
//   not hold and is not already being stored; the shell RMA-reads the block from the
//   offering pool into it (store_read_done), and once every read of the offer ended it
//   answers OffloadStoreDone (the offerer unpins) and writes the slots to disk;
//   store_written frees each slot and records the block as stored. A block that finds no
//   free slot is dropped (counted): a write never waits, never stalls a prefill.
// - lookup (tier 2 -> prefill): begin_lookup grants slots for the longest prefix of the
//   asked hashes that tier 2 is believed to hold; the shell reads them from disk into the
//   slots (lookup_read_done; a miss or a corrupt block cuts the prefix there) and, once all
//   ended, answers with descriptors of the staged prefix; the asker RMA-reads them and says
//   done (lookup_released), or the hold expires (expire) and the slots are freed.
// The believed contents (`known`) are the store's answers fed back by the shell
// (store_written, note_removed on eviction or a dropped corrupt entry), bounded by
// known_blocks_max; a belief that turned stale only costs a miss at lookup_read_done.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "kvstore/block_hash.hpp"
#include "runtime/base/result.hpp"

namespace tandem::kv_offload {

using Slot = uint32_t;  // a staging slot: offset slot * block_bytes in the registered memory

struct OffloadConfig {
  uint32_t staging_blocks = 64;      // slots of registered host memory
  uint32_t stores_max = 256;         // store offers in flight (reading or writing)
  uint32_t lookups_max = 64;         // lookups in flight (reading from disk or staged)
  uint32_t lookup_blocks_max = 1024; // blocks one lookup may stage (also <= staging_blocks)
  uint64_t known_blocks_max = 1u << 22;  // blocks tier 2 may hold (the store's capacity)
  std::chrono::nanoseconds hold_timeout{std::chrono::seconds(30)};  // staged, never released

  // invalid naming "kv_offload.<key>" for a zero bound or a non-positive timeout.
  Status validate() const;
};

// Who asked: the requesting actor's name and its request id (ids are unique per requester).
struct RequestKey {
  std::string requester;
  uint64_t request = 0;
  friend auto operator<=>(const RequestKey&, const RequestKey&) = default;
};

struct StoreGrant {
  uint32_t offer_index = 0;  // position in the offered list
  Slot slot = 0;
};

struct StoreWrite {  // a slot read from the offerer, to be written to disk
  Slot slot = 0;
  kv::BlockHash hash;
};

struct LookupGrant {
  uint32_t position = 0;  // position in the asked hashes (0, 1, ... the staged prefix)
  Slot slot = 0;
  kv::BlockHash hash;     // what is staged there: the whole block's hash, or a partial's
  // 0: the whole block. Else a partial block (always the last grant): the first sub_blocks
  // sub-blocks of the position, under the prefix hash of the last of them (see PartialAsk).
  uint32_t sub_blocks = 0;
};

// Sub-blocks in tier 2 (issue 13). With sub_block_tokens S below block_tokens B (k = B / S),
// a prompt's last block is usually partial; prefill writes it behind too, under the prefix
// hash of its last full sub-block (that hash names exactly the tokens it holds, so it can
// never be mistaken for the whole block or another prompt's). A lookup may carry the prompt's
// prefix hashes of the asked positions (`q`: k per position, from the first asked one; the
// last position may have fewer: the prompt's trailing partial block). Where the whole blocks
// stop (a miss, or the trailing position), the longest sub-block prefix of that position held
// is staged as the lookup's last block: a prompt that shares 3,900 tokens of a 4096-token
// block reads the 3,584 of them tier 2 holds instead of computing them.
struct PartialAsk {
  std::span<const kv::BlockHash> q;  // empty: whole blocks only
  uint32_t k = 1;                    // sub-blocks per block
  uint32_t held = 0;  // sub-blocks of the first position the asker holds: a partial there must
                      // be longer
  uint32_t gain_min = 1;  // and add at least this many sub-blocks (0: 1)
};
// The positions a lookup asks for: hashes.size(), or ceil(q.size() / k) with a PartialAsk.
uint32_t lookup_positions(std::span<const kv::BlockHash> hashes, const PartialAsk& partial);
// A PartialAsk that does not describe `hashes` (q's every k-th hash must be hashes[i], and q
// may extend past them by less than one block; held below k) is invalid, naming what differs.
Status check_partial_ask(std::span<const kv::BlockHash> hashes, const PartialAsk& partial);
// Cuts an ask to its first `positions` positions (both lists).
void truncate_ask(std::vector<kv::BlockHash>& hashes, std::vector<kv::BlockHash>& q, uint32_t k,
                  uint32_t positions);

struct OffloadCounters {
  uint64_t store_offered_blocks = 0;
  uint64_t store_known_blocks = 0;     // offered but already held (or being stored): skipped
  uint64_t store_dropped_blocks = 0;   // no free slot or too many offers in flight
  uint64_t store_read_failed_blocks = 0;
  uint64_t stored_blocks = 0;          // written and indexed
  uint64_t store_write_failed_blocks = 0;
  uint64_t lookups = 0;
  uint64_t lookup_refused = 0;         // lookups_max in flight
  uint64_t lookup_hit_blocks = 0;      // staged and answered
  uint64_t lookup_partial_blocks = 0;  // of those, partial blocks (sub-blocks)
  uint64_t lookup_miss_blocks = 0;     // believed held, but the disk read missed
  uint64_t holds_expired = 0;
};

// How many of `asked` blocks a lookup may stage: those whose disk reads end within the
// asker's budget (what computing them would cost it: OffloadLookup.budgetNs), behind
// `queued_bytes` already waiting for the disk, which serves `disk_bytes_per_s`. A read that
// would end later than computing loses: the asker computes those blocks instead. No budget
// (<= 0) or an unmeasured disk (<= 0): all of them. (`tandem sim`, target-4p4d at 128
// sessions: without it, bursts of 50-block lookups queued on one disk for 20-40 s.)
uint32_t blocks_within_budget(uint32_t asked, uint64_t block_bytes, double budget_s,
                              double queued_bytes, double disk_bytes_per_s);

class OffloadCore {
 public:
  explicit OffloadCore(OffloadConfig config);  // config must validate (asserted)

  // A store offer of `offered` (in order). Grants a slot per block neither held nor in
  // flight, while slots last; the others are skipped (held) or dropped (no slot). invalid:
  // the key is already in flight; overloaded: stores_max offers in flight (all dropped).
  // An empty grant list is a valid answer (nothing to do: the shell answers at once).
  Result<std::vector<StoreGrant>> begin_store(const RequestKey& key,
                                              std::span<const kv::BlockHash> offered);
  // The RMA read into `slot` of offer `key` ended. When every read of the offer has ended,
  // returns the slots read successfully, to write to disk (failed reads' slots are freed);
  // before that, nullopt. not_found: no such offer or slot.
  Result<std::optional<std::vector<StoreWrite>>> store_read_done(const RequestKey& key, Slot slot,
                                                                 bool ok);
  // The disk write of `slot` ended: frees it; ok records the hash as held.
  Status store_written(Slot slot, bool ok);

  // A lookup of `hashes` (a prompt's chained block hashes, in order, from the first block
  // the asker lacks). Grants slots for the longest prefix believed held, capped by free
  // slots and lookup_blocks_max (an empty grant: a miss, nothing held); with `partial`
  // (checked by check_partial_ask, asserted), then the longest partial of the position where
  // the whole blocks stopped, longest first (not when slots or lookup_blocks_max stopped
  // them). invalid: the key is in flight; overloaded: lookups_max in flight.
  Result<std::vector<LookupGrant>> begin_lookup(const RequestKey& key,
                                                std::span<const kv::BlockHash> hashes,
                                                std::chrono::nanoseconds now,
                                                const PartialAsk& partial = {});
  // The disk read of grant `position` ended; ok = verified bytes are in its slot. When all
  // ended, returns the staged prefix (positions 0..n-1 that all succeeded; slots after the
  // first miss are freed and their hashes forgotten), else nullopt.
  Result<std::optional<std::vector<LookupGrant>>> lookup_read_done(const RequestKey& key,
                                                                   uint32_t position, bool ok);
  // The asker read the staged blocks (or gave up): frees the lookup's slots. not_found.
  Status lookup_released(const RequestKey& key);
  // Lookups staged longer than hold_timeout: their slots are freed; returns their keys.
  std::vector<RequestKey> expire(std::chrono::nanoseconds now);

  // Tier 2 dropped the block (evicted, or found corrupt on a read or by verify).
  void note_removed(const kv::BlockHash& hash);
  // What the store held at startup (its index came back from disk).
  void note_held(const kv::BlockHash& hash);
  bool believed_held(const kv::BlockHash& hash) const { return known_.count(hash) > 0; }

  uint32_t slots_free_count() const { return static_cast<uint32_t>(free_.size()); }
  size_t known_count() const { return known_.size(); }
  size_t stores_in_flight() const { return stores_.size(); }
  size_t lookups_in_flight() const { return lookups_.size(); }
  const OffloadCounters& counters() const { return counters_; }
  const OffloadConfig& config() const { return config_; }
  // Every slot is free, or owned by exactly one store, write or lookup (asserted).
  void check_invariants() const;

 private:
  struct Store {
    std::map<Slot, kv::BlockHash> reading;  // slot -> hash, RMA read in flight
    std::vector<StoreWrite> read;           // read successfully, waiting for the others
  };
  struct Lookup {
    std::vector<LookupGrant> grants;
    std::vector<kv::BlockHash> hashes;  // of the grants, by position
    std::vector<uint8_t> state;         // per grant: 0 reading, 1 ok, 2 miss
    uint32_t reading_count = 0;
    bool staged = false;                // every read ended; waiting for release
    std::chrono::nanoseconds since{0};
  };
  std::optional<Slot> take_slot();
  void free_slot(Slot slot);
  void remember(const kv::BlockHash& hash);

  OffloadConfig config_;
  std::vector<Slot> free_;
  std::map<RequestKey, Store> stores_;
  std::map<Slot, kv::BlockHash> writing_;  // slot -> hash, disk write in flight
  std::unordered_set<kv::BlockHash, kv::BlockHashHasher> in_flight_;  // being stored
  std::map<RequestKey, Lookup> lookups_;
  std::unordered_set<kv::BlockHash, kv::BlockHashHasher> known_;
  OffloadCounters counters_;
};

}  // namespace tandem::kv_offload
