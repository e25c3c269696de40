// The cluster simulator behind `tandem sim` (issue 5): the real pure cores (RouterCore,
// PrefillScheduler, DecodeScheduler, PrefixCache) driven by one deterministic discrete-event
// loop under virtual time, with step durations from the sim device's timing model
// (devices/sim/sim_model.hpp) and KV transfer time = bytes / link bandwidth.
//
// Pure: no threads, no wall clock, no I/O. Same config and requests -> same result, byte for
// byte (events are ordered by (time, sequence number); ties never depend on addresses).
//
// Sessions are closed-loop: a session's turn k+1 is sent think_time_ms after turn k
// completed; at most `sessions_in_flight` sessions run at once and a new one starts (in
// order of its first turn's arrival offset) when one ends; a failed turn does not end its
// session. No request is sent at or after `duration_ms`; requests already sent always finish
// (completed, or counted failed with a kind: context_length, router_*, prefill_*, decode_*).
// The first turn of the first `sessions_in_flight` sessions is sent at its arrival offset.
//
// Model: every instance is one sim device (`device`); a prefill step lasts prefill_time_s of
// its chunks; a decode step lasts decode_step_time_s of its decode tokens plus prefill_time_s
// of its local prefill chunks (two passes). A P/D request's KV moves when decode pulls it:
// bytes = pulled tokens x kv_bytes_per_token, over the decode instance's inbound link (one
// transfer at a time). The router sees each instance's load every load_report_interval_ms
// (as the real shells report it; heartbeat forwarding from other nodes is not modelled) or
// after every change (interval 0), and its evictions (kv_removed) at once; pick() itself
// records where blocks go.
//
// Modes: disaggregated (prefill_count prefill instances + decode_count decode instances; the
// router decides per request whether to use a prefill instance) or aggregated (prefill_count
// == 0: every instance is a decode instance that prefills locally).
//
// Faults (issue 12; tools/sim/README.md "Faults"): `faults` (crashes and restarts of
// instances, partitions / loss / delay between two nodes, slow or hung executors) act in the
// simulated nodes and links, at their seeded times. With faults, the simulator models the
// failure handling the real nodes run, through the same pure policies: the gateway's retry
// decision (actors/gateway/retry_policy.hpp), decode's prefill timeout, pull start and pull
// reads, and lost-stream resends (actors/decode/pd_policy.hpp). Membership is modelled per
// observer: an observer (the router for every instance, the gateway for every decode
// instance, a decode instance for every prefill instance) declares a peer down after
// heartbeat_interval_ms x heartbeat_miss_max without contact, and up again one heartbeat
// after contact returns. Invariants are checked after every event (see `violation`).
//
// Cost: O(events * log events) plus the cores' own costs; block hashes are computed once per
// new block of a session (a turn's prompt extends the previous one), never per request.
// With faults, each event also costs O(instances + active faults) for the checks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "actors/decode/drafter.hpp"
#include "actors/router/router_core.hpp"
#include "devices/sim/sim_model.hpp"
#include "runtime/base/result.hpp"
#include "tools/sim/faults.hpp"
#include "tools/workload/bench_metrics.hpp"
#include "tools/workload/workload.hpp"

namespace tandem::sim {

struct ClusterSimConfig {
  uint32_t prefill_count = 4;      // 0 = aggregated mode (decode instances prefill locally)
  uint32_t decode_count = 4;       // >= 1
  router::RouterConfig router;     // policy, weights, seed; block_tokens is overwritten
  // Timing model and KV pool size of each prefill instance and of each decode instance (in
  // aggregated mode every instance is a decode instance). A manifest may give the roles'
  // executors different values (e.g. prefill PP, decode DP + EP).
  devices::sim::SimParams prefill_device, decode_device;
  uint32_t block_tokens = 512;     // KV block, tokens, >= 1
  // Prefix-hash (cache match) granularity, tokens: divides block_tokens; 0 = block_tokens.
  uint32_t sub_block_tokens = 0;
  uint32_t hash_tokens() const { return sub_block_tokens == 0 ? block_tokens : sub_block_tokens; }
  // The router's device index ([router] kv_index): false records its own picks and drops
  // what caches report removed; true builds it from the caches' events only (removed, then
  // stored with their parents), cleared when an instance restarts, and checks at the end that
  // it equals every cache (a violation otherwise).
  bool precise_index = false;
  uint32_t kv_blocks = 0;          // per instance; 0 = kv_capacity_tokens(its device) / block_tokens
  double link_bytes_per_s = 25e9;  // prefill -> decode KV transfer bandwidth, > 0
  // Scheduler limits (the manifest's [prefill] and [decode]).
  uint32_t prefill_queue_max = 256, prefill_running_max = 16, prefill_held_max = 256;
  uint32_t prefill_step_tokens_max = 512, prefill_hold_timeout_ms = 30000;
  uint32_t decode_waiting_max = 256, decode_seqs_max = 64, decode_step_tokens_max = 512;
  uint32_t max_model_tokens = 204800;  // context length, tokens
  // Speculative decoding ([speculative]): decode's scheduler drafts as a node's does (the
  // real Drafter on each request's tokens); verification is modelled: each draft token, in
  // order, is accepted with probability spec_acceptance (an independent draw per token, from
  // the seed), and the step's cost is the sim device's for the k + 1 tokens of each sequence.
  // Outputs are one repeated token, so a drafter's shadow check (drafter.hpp) always finds
  // its proposal would have been right: at a low spec_acceptance drafters keep probing, which
  // a real model's outputs would not make them do. eagle3: the drafters ask for the model's
  // drafts after each step as a node's do (DecodeScheduler::model_draft_wants); each asked
  // token costs one pass of one decoder layer (1 / layers of a decode step of the asking
  // sequences), added to the next step.
  decode::SpecConfig spec;
  double spec_acceptance = 0.5;        // [0, 1]; tandem sim defaults it to copy_probability
  // How often every instance reports its load to the router, ms; 0 = after every change.
  // The real shells report every 100 ms (prefill and decode actors' ticks); between
  // reports the router knows only its own picks (waiting + 1 on the chosen instances).
  double load_report_interval_ms = 100;
  uint32_t sessions_in_flight = 8;     // >= 1
  double duration_ms = 3600e3;         // no request is sent at or after this, > 0
  uint64_t seed = 1;                   // recorded in the result (the workload already used it)
  // Faults: explicit terms, and random ones drawn from `seed` over [0, duration_ms).
  FaultPlan faults;
  // Failure handling, as in the manifest: [fabric] heartbeats (detection = interval x misses),
  // [decode] prefill_timeout_ms, [gateway] request_timeout_ms (no progress -> timed out).
  double heartbeat_interval_ms = 200;
  uint32_t heartbeat_miss_max = 5;
  double prefill_timeout_ms = 30000;
  double request_timeout_ms = 600000;
  // Tier 2 (issue 13): one kv-offload per prefill instance's node (site p holds prefill-p,
  // as target-4p4d puts prefill-i and decode-i on node i). The real pure cores run it: the
  // store's slot map (kvstore/tier2 SlotTable: capacity, LRU eviction, pins), kv-offload's
  // staging and beliefs (OffloadCore), prefill's cost rule and rate book (tier2_policy.hpp)
  // and the router's tier-2 index and credit (RouterCore). Each site's disk is one FIFO
  // queue for reads and writes (the real kv-offload's I/O actor takes them in order).
  struct Tier2 {
    bool enabled = false;
    uint32_t capacity_blocks = 0;     // per site; >= 1 when enabled
    double read_bytes_per_s = 7e9;    // the site's disk (one NVMe Gen4 drive's sequential read)
    double write_bytes_per_s = 5e9;
    double lookup_rtt_ms = 0.2;       // a lookup's round trip with nothing to read
    uint32_t staging_blocks = 64, stores_max = 256, lookups_max = 64, lookup_blocks_max = 1024;
    double lookup_timeout_ms = 2000;  // prefill waits this long for an answer, then computes
    double hold_timeout_ms = 10000;   // staged blocks nobody released are freed after this
    // With sub-blocks (sub_block_tokens < block_tokens): prompts' trailing partial blocks are
    // written behind and read back (as the real cluster always does); off: whole blocks only,
    // for comparison.
    bool sub_blocks = true;
  } tier2;
  // Test-only: each flag plants one deliberate bug, so a test can show that the invariant
  // checker meant to catch it does (a checker that cannot fail is worthless).
  struct Bugs {
    bool drop_end = false;         // the first completed request is never ended
    bool double_end = false;       // the first completed request is ended twice
    bool no_retry = false;         // a failed request is never retried
    bool leak_block = false;       // a decode instance keeps one KV block after a completion
    bool router_not_told = false;  // the router is never told an instance is down
    bool unbounded = false;        // ended requests stay in the gateway's in-flight map
    bool serve_corrupt = false;    // tier 2 serves blocks without verifying their checksum
    bool no_cost_rule = false;     // prefill asks tier 2 even when computing is faster
    bool no_lookup_budget = false; // kv-offload stages blocks its disk queue reads too late
    bool no_disk_rate = false;     // lookup answers do not report the site's disk read rate
    bool precise_no_removed = false;  // precise_index: removed events are not applied
  } bugs;
  // Errors: invalid, naming the field.
  Status validate() const;
};

struct InstanceStats {
  std::string name;  // "prefill-0", "decode-3"
  uint64_t steps_count = 0;
  double busy_s = 0;  // modelled device time
  uint64_t computed_tokens_count = 0;
  uint64_t cached_tokens_count = 0;
  uint64_t preemptions_count = 0;
  // Speculation (decode): entries that carried drafts, their draft tokens, the accepted ones.
  uint64_t spec_drafts_count = 0, spec_draft_tokens_count = 0, spec_accepted_tokens_count = 0;
};

struct ClusterSimResult {
  uint64_t precise_checked_entries = 0;  // precise_index: cache entries the end check compared
  uint64_t seed = 0;
  std::string mode;              // "pd" | "aggregated"
  std::string policy;            // router policy
  uint64_t sent_count = 0;       // requests sent
  uint64_t completed_count = 0;  // finished with all expected output tokens
  uint64_t failed_count = 0;     // sent_count = completed_count + failed_count
  std::map<std::string, uint64_t> failed_by_kind;
  uint64_t events_count = 0;
  double simulated_ms = 0;  // time of the last event
  // Token-weighted prefix hit rate over every prefix cache: prompt tokens served from the
  // cache (not computed) / prompt tokens, as in the gateway's /metrics.
  uint64_t prompt_tokens_count = 0;
  uint64_t prompt_cached_tokens_count = 0;
  double hit_rate = 0;
  uint64_t kv_transfer_bytes = 0;
  uint64_t pd_requests_count = 0;                    // routed through a prefill instance
  bool tier2_enabled = false;
  // Tier 2 (config.tier2.enabled): what prefill asked and loaded, what the sites stored.
  struct Tier2Counters {
    uint64_t eligible = 0;          // prompts whose prefill pool lacked blocks
    uint64_t declined = 0;          // ... for which the cost rule chose to compute
    uint64_t lookups = 0;           // lookups sent (remote: to another node's tier 2)
    uint64_t remote_lookups = 0;
    uint64_t lookup_timeouts = 0;   // no answer within lookup_timeout_ms: computed
    uint64_t over_budget_blocks = 0;  // asked, but the disk's queue would read them too late
    uint64_t late_blocks = 0;       // staged after the asker could have computed them
    uint64_t hit_blocks = 0;        // staged by a site
    uint64_t loaded_blocks = 0;     // read into a prefill pool and committed to its cache
    uint64_t loaded_tokens = 0;
    uint64_t loaded_partial_blocks = 0;  // of loaded_blocks, partial (a prompt's trailing block)
    uint64_t offered_blocks = 0;    // write-behind offers
    uint64_t offered_held_blocks = 0;   // ... tier 2 held already (or was writing): skipped
    uint64_t stored_blocks = 0;     // written and indexed
    uint64_t store_dropped_blocks = 0;  // no staging slot / too many offers / no room
    uint64_t evicted_blocks = 0;
    uint64_t corrupt_dropped_blocks = 0;  // failed verification on a read: a miss
    uint64_t read_errors = 0;       // disk reads that failed (faults): a miss
    uint64_t bytes_read = 0, bytes_written = 0;
    double disk_busy_s = 0;         // over all sites
  } tier2;
  std::vector<workload::RequestTimeline> timelines;  // one per sent request, request order
  std::vector<uint32_t> sent_request_indexes;        // timelines[i] is of requests[this[i]]
  workload::BenchSummary summary;
  std::vector<InstanceStats> instances;
  // Faults: the plan as applied (explicit and drawn terms, canonical form) and what the
  // failure handling did.
  std::string faults;
  struct FaultCounters {
    uint64_t crashes = 0, restarts = 0;
    uint64_t detections = 0;           // an observer declared a peer down
    uint64_t retries = 0;              // requests routed again (retry policy)
    uint64_t fallbacks = 0;            // P/D requests prefilled locally after a failure
    uint64_t pull_failures = 0;        // KV pulls that failed (-> local prefill)
    uint64_t prefill_timeouts = 0;     // remote prefills that did not answer in time
    uint64_t request_timeouts = 0;     // the gateway's no-progress timeout fired
    uint64_t lost_streams = 0;         // streams cancelled: tokens could not reach the gateway
    uint64_t stale_events = 0;         // events of an instance that crashed meanwhile
  } fault_counters;
  // The first invariant violated ("" = none), at violation_ms; the run stops there.
  std::string violation;
  double violation_ms = 0;
};

// Runs the whole simulation. `requests`: the workload, sorted by arrival offset (as the
// generators return it); their segments or prompt_token_ids are the prompts (text prompts:
// invalid). Errors: invalid (bad config, a text prompt, a prompt the context cannot hold).
Result<ClusterSimResult> run_cluster_sim(const ClusterSimConfig& config,
                                         const std::vector<workload::Request>& requests);

// The node names of a config's cluster (gateway, router, then instances), as fault terms
// name them.
std::vector<std::string> node_names(const ClusterSimConfig& config);

// The result as JSON (deterministic: fixed key order, fixed number formatting). Timelines
// are left out unless `with_timelines`.
std::string to_json(const ClusterSimResult& result, bool with_timelines);

}  // namespace tandem::sim
