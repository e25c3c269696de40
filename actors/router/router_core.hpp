// The router core: Tandem's Endpoint Picker. For each request it picks the decode instance
// and, when the uncached part of the prompt is long enough, a prefill instance (P/D
// disaggregation); otherwise the decode instance prefills locally.
//
// Pure: no threads, clocks or I/O. One RouterCore is owned by one router actor, which calls
// it from its behaviors only (not thread-safe). Inputs are value types; nothing borrowed
// outlives a call. See actors/router/README.md for the scoring math and config keys.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/router/block_table.hpp"
#include "actors/router/held_map.hpp"
#include "actors/router/tier2_index.hpp"
#include "kvstore/block_hash.hpp"
#include "runtime/base/result.hpp"

namespace tandem::router {

struct InstanceId {
  uint32_t value = 0;
  friend auto operator<=>(const InstanceId&, const InstanceId&) = default;
};

enum class InstanceRole { prefill, decode };
enum class Policy { prefix_aware, round_robin, random };
std::string_view to_string(Policy policy);  // "prefix-aware", "round-robin", "random"

// Mirrors the manifest's [router] section (config::RouterSection) plus what the shell knows
// from elsewhere ([model] block_tokens). The core does not link the config library.
struct RouterConfig {
  Policy policy = Policy::prefix_aware;
  double weight_prefix = 1.0;                 // >= 0; not all three zero
  double weight_queue = 1.0;                  // >= 0
  double weight_kv_usage = 1.0;               // >= 0
  uint32_t prefix_index_blocks_max = 100000;  // per-instance LRU capacity, blocks, >= 1
  uint32_t disaggregate_tokens_min = 256;     // uncached tokens at/above which P/D is used
  // Tokens per prefix hash, >= 1: the manifest's [model] sub_block_tokens (hashes, match
  // lengths and the index count sub-blocks; = blocks when they are whole blocks).
  uint32_t block_tokens = 16;
  // Sub-blocks per KV block ([model] block_tokens / sub_block_tokens), >= 1: tier 2 holds
  // whole blocks, every sub_blocks_per_block-th prefix hash.
  uint32_t sub_blocks_per_block = 1;
  uint32_t instances_max = 64;                // instances known at once, 1 .. 65536
  // Bounded load (prefix-aware only): an instance whose load (waiting + running + picks
  // since its last heartbeat) is at or above (1 + load_imbalance_max) x the mean load of its
  // role's up instances (counting the request being placed) is not picked, so prefix
  // affinity cannot pile requests on one instance. >= 0; +infinity turns the bound off.
  double load_imbalance_max = 0.5;
  // The same bound for prefill instances (default: none). A prefill request's work depends
  // on its cache hit (a session's next turn computes ~1K tokens where it is cached, its
  // whole context elsewhere), so request counts misjudge prefill load and a tight bound
  // moves prefills away from their cache.
  double prefill_load_imbalance_max = std::numeric_limits<double>::infinity();
  // Prefill by work (prefix-aware only): the prefill instance with the least estimated work
  // before this prompt's first token, in tokens: load x (mean uncached tokens of recent P/D
  // picks) + this prompt's uncached tokens there. Prefix affinity and load in one unit, so
  // neither needs a weight against the other (ties: KV usage, then rotation). false: the
  // weighted score, as for decode.
  bool prefill_by_work = true;
  // Tier 2 (issue 13): a block the prefill instance's node holds in tier 2, past what its
  // device cache holds, counts as tier2_weight of a device hit (reading it back costs a
  // little; computing it costs all). In [0, 1]; 0 ignores tier 2.
  double tier2_weight = 0.8;
  // A block another node's tier 2 holds: read over the fabric (a cross-node RMA read), so
  // worth less; in [0, tier2_weight]; 0 never reads a remote tier 2.
  double tier2_remote_weight = 0.5;
  uint32_t tier2_index_blocks_max = 262144;  // per node, blocks, >= 1
  uint64_t seed = 0;                          // for the `random` policy
};

// Returns an `invalid` Error naming the first bad field, or ok.
Status validate(const RouterConfig& config);

// Load as last reported by the instance's heartbeat.
struct InstanceLoad {
  uint32_t waiting_count = 0;  // requests queued, not yet running
  uint32_t running_count = 0;  // requests in the running batch
  uint64_t kv_blocks_used = 0;
  uint64_t kv_blocks_total = 0;  // 0 = not reported yet (treated as an empty pool)
  // Prefill: whether its cost rule reads tier 2 (from its node's kv-offload / another node's)
  // rather than computing; a copy it would not read earns no credit (`tandem sim`: credit for
  // copies a slow disk's prefill then computes anyway cost 1.5x TTFT p90).
  bool tier2_local_reads = true;
  bool tier2_remote_reads = true;
  // Prefill: the prompt tokens it still has to compute (PrefillScheduler::pending_tokens),
  // when it reports them; prefill by work then counts them, plus what was picked since,
  // instead of estimating its queue as load x the mean uncached tokens of recent picks.
  std::optional<uint64_t> pending_tokens;
  // Blocks on its free list (neither referenced nor cached), when reported: a prompt whose
  // uncached tokens need more evicts cached blocks, work that comes back as misses, so
  // prefill by work counts the tokens beyond the free room twice (an idle instance with room
  // takes new sessions before a busy one's pool is churned).
  std::optional<uint64_t> kv_blocks_free;
};

struct PickRequest {
  // The prompt's full-block hashes in order (chained: hashes[i] identifies blocks 0..i).
  // Borrowed for the call only.
  std::span<const kv::BlockHash> block_hashes;
  uint64_t prompt_tokens = 0;  // >= block_hashes.size() * block_tokens (checked: invalid)
};

struct Pick {
  InstanceId decode;
  std::optional<InstanceId> prefill;  // nullopt: decode prefills locally
  uint32_t decode_cached_blocks = 0;  // leading blocks the index believes decode holds
  uint32_t prefill_cached_blocks = 0;  // same for prefill (0 when there is no prefill)
  uint32_t prefill_tier2_blocks = 0;   // blocks after those a tier 2 holds (its node's or remote)
  // The node (site) whose tier 2 holds them when it is not the prefill instance's own (the
  // copy is read over the fabric); nullopt: its own node's, or none.
  std::optional<uint32_t> prefill_tier2_site;
  uint64_t uncached_tokens = 0;       // prompt_tokens - decode_cached_blocks * block_tokens
  double decode_score = 0.0;          // weighted sum (prefix-aware policy; 0 for baselines)
};

// Per-scorer breakdown for one candidate (for tests, logs and the admin shell).
struct InstanceScore {
  InstanceId id;
  uint32_t cached_blocks = 0;
  uint32_t tier2_blocks = 0;  // prefill: blocks after cached_blocks a tier 2 holds
  bool tier2_remote = false;  // ... on another node (credited at tier2_remote_weight)
  // (cached_blocks + tier2_weight x tier2_blocks) / blocks, in [0, 1]; 0 for an empty prompt
  double prefix = 0.0;
  uint64_t load_count = 0;  // waiting + running + picks since the last heartbeat
  bool over_bound = false;  // load at/above the bounded-load cap: not eligible (prefix-aware)
  // (mean + 1) / (mean + 1 + load_count), in (0, 1]; mean: the role's mean load_count.
  double queue = 0.0;
  double kv_usage = 0.0;  // 1 - used / total, in [0, 1]; 1 when total is 0
  double total = 0.0;     // weighted sum
};

// A prefill instance's best tier-2 copy of a prompt's blocks after its device hit.
struct Tier2Run {
  uint32_t blocks = 0;
  uint32_t site = 0;     // the node that holds them
  bool remote = false;   // site is not the instance's node
  double weight = 0.0;   // tier2_weight or tier2_remote_weight
  double credit() const { return weight * blocks; }
};

class RouterCore {
 public:
  // Throws std::invalid_argument (startup fault) when validate(config) fails.
  explicit RouterCore(const RouterConfig& config);

  // `site`: the instance's node, whose tier 2 it reads (see tier2_stored).
  // Errors: invalid (id already known), overloaded (instances_max reached).
  Status add_instance(InstanceId id, InstanceRole role, uint32_t site = 0);
  // Forgets the instance and its prefix index. Error: not_found.
  Status remove_instance(InstanceId id);
  // Down instances are never picked; going down clears the instance's prefix index (its
  // process most likely died with its KV). Error: not_found.
  Status set_up(InstanceId id, bool up);
  // Draining instances (an operator's `drain`, a node stopping on SIGTERM) are never picked
  // while they are; unlike going down, their prefix index and load stay, so undraining picks
  // them again at once with their cache. When every decode instance is down or draining,
  // decide() answers overloaded. Error: not_found.
  Status set_draining(InstanceId id, bool draining);
  bool draining(InstanceId id) const;  // false for an unknown instance
  // Replaces the load view (heartbeat). Error: not_found.
  Status update_load(InstanceId id, const InstanceLoad& load);

  // KV events from an instance's prefix cache. `stored`: hashes in chain order whose first
  // block's parent is `parent` (nullopt = the first block of a prompt); blocks whose parent
  // the index does not hold for that instance are ignored (they cannot be a leading hit),
  // and so are events from a down instance.
  // `removed`: drops each block and every deeper block of the same chain for that instance.
  // Error: not_found (unknown instance). Cost: O(blocks) (removed: O(blocks dropped)).
  Status kv_stored(InstanceId id, std::optional<kv::BlockHash> parent,
                   std::span<const kv::BlockHash> hashes);
  Status kv_removed(InstanceId id, std::span<const kv::BlockHash> hashes);
  // Forgets what the index holds for the instance (a precise source out of sync: its snapshot
  // rebuilds it). Error: not_found.
  Status kv_clear(InstanceId id);

  // Tier-2 events of a node's kv-offload (`site` as given to add_instance): the prefill
  // instances of that node are credited for those blocks (RouterConfig::tier2_weight).
  // stored returns how many were refused (tier2_index_blocks_max reached).
  size_t tier2_stored(uint32_t site, std::span<const kv::BlockHash> hashes);
  void tier2_removed(uint32_t site, std::span<const kv::BlockHash> hashes);
  void tier2_clear(uint32_t site);
  const Tier2Index& tier2() const { return tier2_; }

  // The decision: picks decode (and maybe prefill) without touching the prefix index. Each
  // picked instance counts one more request in flight until its next update_load (so a
  // burst between heartbeats spreads). Errors: invalid (prompt_tokens below the blocks'
  // tokens), not_found (no decode instance known), overloaded (every decode instance down).
  // Cost: O(instances + distinct match lengths * log(blocks)); no allocation once warm.
  Result<Pick> decide(const PickRequest& request);
  // Records `request`'s blocks in the index of the instances `pick` names (decode always,
  // prefill when set), as the picked instances will hold them. Call it right after the
  // decide() that returned `pick`, with the same request (the shell replies first, then
  // records, in the same behavior). If the index changed in between, the cached lengths are
  // recomputed; an instance that is gone or down is skipped. Cost: O(1) per new block (plus
  // O(1) amortized per evicted block); no allocation once the index is warm.
  void record(const PickRequest& request, const Pick& pick);
  // decide() then record(): same decision.
  Result<Pick> pick(const PickRequest& request);

  // Scores every up instance of `role` without changing state (prefix-aware math, also
  // shown for baselines; with prefill_by_work, prefill instances are ranked by estimated
  // work instead, but their weighted terms are still shown). Errors: invalid (as pick).
  Result<std::vector<InstanceScore>> scores(const PickRequest& request, InstanceRole role) const;

  // Leading blocks of `hashes` the index holds for `id` (0 if unknown).
  uint32_t cached_blocks(InstanceId id, std::span<const kv::BlockHash> hashes) const;
  size_t index_blocks_count(InstanceId id) const;  // blocks held for id (0 if unknown)
  // Whether the index holds `hash` for `id` (false if either is unknown). O(1).
  bool holds(InstanceId id, const kv::BlockHash& hash) const;
  size_t index_nodes_count() const { return table_.size(); }  // distinct blocks
  size_t instances_count() const { return slot_of_.size(); }
  // Checks the index's internal invariants (LRU list order, leaves listed, parked stamps,
  // counts); RT_ASSERTs on a violation. O(held blocks): for tests.
  void check_invariants() const;
  const RouterConfig& config() const { return config_; }
  // Live tuning (`tandem shell` router set): replaces the policy, weights, P/D threshold, load
  // bounds and tier-2 weights; the next decide() uses them. Errors (invalid, nothing changed):
  // validate() fails, or a field fixed at construction differs (index and tier-2 capacities,
  // block_tokens, sub_blocks_per_block, instances_max, seed).
  Status set_config(const RouterConfig& config);

 private:
  static constexpr uint32_t none_ = UINT32_MAX;
  struct Node {  // one distinct block (a chain position) held by at least one instance
    kv::BlockHash hash;
    uint32_t parent = none_;
    uint32_t depth = 0;
    uint32_t first_child = none_;  // children: an intrusive doubly-linked sibling list
    uint32_t next_sibling = none_;
    uint32_t previous_sibling = none_;
  };
  // One block held by one instance. Entries live in the instance's pool; the listed ones
  // form a doubly-linked list in non-decreasing stamp order (the LRU order). Every leaf is
  // listed; an internal entry may be "parked" (unlisted) once eviction passed it: its stamp
  // is then <= every listed stamp, and it is re-listed when touched or when a child is
  // dropped (it inherits the child's stamp and list position).
  struct Held {
    uint32_t node = none_;
    uint32_t child_count = 0;  // held children (0 = a leaf of this instance's tree)
    uint64_t stamp = 0;        // last use (larger = more recent)
    uint32_t older = none_;    // list neighbours (entry indexes)
    uint32_t newer = none_;
    bool listed = false;
  };
  struct Slot {
    bool used = false;
    bool up = true;
    bool draining = false;  // up, index kept, not picked (set_draining)
    InstanceId id;
    InstanceRole role = InstanceRole::decode;
    uint32_t site = 0;  // its node (tier 2)
    InstanceLoad load;
    uint32_t inflight_count = 0;  // picks since the last update_load
    uint64_t inflight_tokens = 0;  // their uncached tokens (prefill)
    HeldMap held;                 // node -> index into entries
    std::vector<Held> entries;    // pool: grows to the capacity once, then reused
    std::vector<uint32_t> free_entries;
    uint32_t oldest = none_, newest = none_;  // the LRU list
  };
  // Load of a role's up instances, for the queue score and the bounded-load cap.
  struct RoleLoad {
    uint32_t candidates_count = 0;
    uint64_t load_sum = 0;
  };

  Status check_request(const PickRequest& request) const;
  // Leading-hit length of every slot set in `mask` (others: 0), into out[slot].
  void match_lengths(std::span<const kv::BlockHash> hashes, const std::vector<uint64_t>& mask,
                     std::vector<uint32_t>& out) const;
  // Used, up, not draining and of `role`: a slot decide() may pick.
  static bool pickable(const Slot& s, InstanceRole role) {
    return s.used && s.up && !s.draining && s.role == role;
  }
  // Slots that are pickable for `role`.
  void role_mask(InstanceRole role, std::vector<uint64_t>& mask) const;
  void probe(std::span<const kv::BlockHash> hashes) const;
  uint32_t node_of(const kv::BlockHash& hash) const;  // none_ when absent
  static uint64_t load_count(const Slot& s);
  RoleLoad role_load(InstanceRole role) const;
  InstanceScore score_slot(uint32_t slot, uint32_t cached, size_t blocks,
                           const RoleLoad& role_load, const Tier2Run& tier2 = {}) const;
  // Per slot: the tier-2 run of `hashes` after lengths[slot] worth the most credit, on the
  // slot's node or another (prefill slots only; others empty), into out.
  void tier2_runs(std::span<const kv::BlockHash> hashes, const std::vector<uint32_t>& lengths,
                  std::vector<Tier2Run>& out) const;
  std::optional<uint32_t> choose(InstanceRole role, const std::vector<uint32_t>& lengths,
                                 size_t blocks, uint32_t& cursor, double* score,
                                 const std::vector<Tier2Run>* tier2 = nullptr);
  std::optional<uint32_t> choose_best(InstanceRole role, const std::vector<uint32_t>& lengths,
                                      size_t blocks, uint32_t& cursor, double* score,
                                      const std::vector<Tier2Run>* tier2) const;
  void decide_prefill(const PickRequest& request, Pick& pick);
  std::optional<uint32_t> choose_by_work(const std::vector<uint32_t>& lengths,
                                         const std::vector<Tier2Run>& tier2,
                                         const PickRequest& request) const;
  void record_slot(uint32_t slot, std::span<const kv::BlockHash> hashes, uint32_t cached);
  uint32_t node_for(const kv::BlockHash& hash, uint32_t parent, uint32_t depth);
  uint32_t hold(uint32_t slot, uint32_t node, uint64_t stamp, uint32_t parent_entry);
  bool holds_at(uint32_t slot, std::span<const kv::BlockHash> hashes, uint32_t position) const;
  void evict_to(uint32_t slot, size_t keep);
  void touch(uint32_t slot, uint32_t node);
  void drop(uint32_t slot, uint32_t node);
  // The LRU list of one slot (entries by index).
  void link_newest(Slot& s, uint32_t entry);
  void unlink(Slot& s, uint32_t entry);
  void replace_in_list(Slot& s, uint32_t old_entry, uint32_t new_entry);
  void drop_subtree(uint32_t slot, uint32_t node);
  void evict_to_capacity(uint32_t slot);
  void clear_slot_index(uint32_t slot);
  void free_node(uint32_t node);
  bool bit(uint32_t node, uint32_t slot) const;
  Slot* find(InstanceId id);
  uint64_t next_random();

  RouterConfig config_;
  uint32_t words_ = 1;  // 64-bit words per holder bitset
  std::vector<Slot> slots_;
  std::unordered_map<uint32_t, uint32_t> slot_of_;  // InstanceId.value -> slot
  std::vector<Node> nodes_;
  std::vector<uint64_t> node_bits_;  // nodes_.size() * words_: which slots hold the node
  std::vector<uint32_t> free_nodes_;
  BlockTable table_;  // block hash -> node
  // Scratch for the level-by-level bisection (reused; no allocation once warm).
  struct Interval {
    uint32_t lo, hi;            // chain positions, lo < hi
    uint32_t lo_bits, hi_bits;  // offsets into bits_arena_: holders of lo and hi
  };
  mutable std::vector<uint64_t> bits_arena_;
  mutable std::vector<Interval> level_, next_level_;
  mutable std::vector<uint32_t> probe_positions_, probe_nodes_, probe_bits_;
  std::vector<uint64_t> pick_mask_;  // pick()'s scratch, reused
  std::vector<uint32_t> pick_lengths_, pick_prefill_lengths_;
  std::vector<Tier2Run> pick_tier2_;
  Tier2Index tier2_;
  uint64_t stamp_ = 0;
  double prefill_tokens_mean_ = -1.0;  // EWMA of P/D picks' uncached tokens; < 0: none yet
  uint32_t decode_cursor_ = 0;  // round-robin / tie-break rotation
  uint32_t prefill_cursor_ = 0;
  uint64_t random_state_;
};

}  // namespace tandem::router
