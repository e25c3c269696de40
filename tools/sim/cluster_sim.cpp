#include "tools/sim/cluster_sim.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <unordered_map>

#include "actors/decode/decode_scheduler.hpp"
#include "actors/decode/pd_policy.hpp"
#include "actors/gateway/retry_policy.hpp"
#include "actors/kv_offload/offload_core.hpp"
#include "actors/prefill/prefill_scheduler.hpp"
#include "actors/prefill/tier2_policy.hpp"
#include "kvstore/hashing.hpp"
#include "kvstore/prefix_cache.hpp"
#include "kvstore/tier2/slot_table.hpp"
#include "runtime/base/assert.hpp"

namespace tandem::sim {

Status ClusterSimConfig::validate() const {
  auto bad = [](std::string what) { return make_error(ErrorKind::invalid, "sim: " + what); };
  if (decode_count < 1) return bad("decode_count must be >= 1");
  if (!(spec_acceptance >= 0 && spec_acceptance <= 1)) return bad("spec_acceptance outside [0, 1]");
  if (prefill_count + decode_count > 65536) return bad("at most 65536 instances");
  if (block_tokens < 1) return bad("block_tokens must be >= 1");
  if (hash_tokens() > block_tokens || block_tokens % hash_tokens() != 0) {
    return bad("sub_block_tokens must divide block_tokens");
  }
  if (!(link_bytes_per_s > 0)) return bad("link_bytes_per_s must be > 0");
  if (sessions_in_flight < 1) return bad("sessions_in_flight must be >= 1");
  if (!(duration_ms > 0)) return bad("duration_ms must be > 0");
  if (max_model_tokens < 2) return bad("max_model_tokens must be >= 2");
  if (!(load_report_interval_ms >= 0) || !std::isfinite(load_report_interval_ms)) {
    return bad("load_report_interval_ms must be finite and >= 0");
  }
  if (!(heartbeat_interval_ms > 0) || !std::isfinite(heartbeat_interval_ms)) {
    return bad("heartbeat_interval_ms must be finite and > 0");
  }
  if (heartbeat_miss_max < 1) return bad("heartbeat_miss_max must be >= 1");
  if (!(prefill_timeout_ms > 0) || !std::isfinite(prefill_timeout_ms)) {
    return bad("prefill_timeout_ms must be finite and > 0");
  }
  if (!(request_timeout_ms > 0) || !std::isfinite(request_timeout_ms)) {
    return bad("request_timeout_ms must be finite and > 0");
  }
  if (Status s = prefill_device.validate(); !s) {
    return bad("prefill device: " + s.error().message);
  }
  if (Status s = decode_device.validate(); !s) return bad("decode device: " + s.error().message);
  if (tier2.enabled) {
    if (prefill_count == 0) {
      return bad("tier 2 is read by prefill instances: it needs prefill_count >= 1 (not "
                 "aggregated)");
    }
    if (tier2.capacity_blocks < 1) return bad("tier2.capacity_blocks must be >= 1");
    for (auto [name, v] : {std::pair<const char*, double>{"read_bytes_per_s", tier2.read_bytes_per_s},
                           {"write_bytes_per_s", tier2.write_bytes_per_s}}) {
      if (!(v > 0) || !std::isfinite(v)) return bad(std::string("tier2.") + name + " must be > 0");
    }
    if (!(tier2.lookup_rtt_ms >= 0) || !std::isfinite(tier2.lookup_rtt_ms)) {
      return bad("tier2.lookup_rtt_ms must be finite and >= 0");
    }
    if (!(tier2.lookup_timeout_ms > 0) || !std::isfinite(tier2.lookup_timeout_ms)) {
      return bad("tier2.lookup_timeout_ms must be finite and > 0");
    }
    if (!(tier2.hold_timeout_ms > 0) || !std::isfinite(tier2.hold_timeout_ms)) {
      return bad("tier2.hold_timeout_ms must be finite and > 0");
    }
    if (tier2.staging_blocks < 1 || tier2.stores_max < 1 || tier2.lookups_max < 1 ||
        tier2.lookup_blocks_max < 1) {
      return bad("tier2 staging_blocks, stores_max, lookups_max and lookup_blocks_max must be "
                 ">= 1");
    }
  }
  return {};
}

std::vector<std::string> node_names(const ClusterSimConfig& c) {
  std::vector<std::string> names{"gateway", "router"};
  for (uint32_t p = 0; p < c.prefill_count; ++p) names.push_back("prefill-" + std::to_string(p));
  for (uint32_t d = 0; d < c.decode_count; ++d) {
    names.push_back((c.prefill_count > 0 ? "decode-" : "instance-") + std::to_string(d));
  }
  return names;
}

namespace {

using Nanos = std::chrono::nanoseconds;

enum class EventKind : uint8_t {
  send, prefill_done, decode_done, pull_done, load_report,
  // faults (issue 12)
  fault_begin, fault_end, detect_down, detect_up, detect_restart, tick, deliver,
  router_timeout, gateway_error,
  // tier 2 (issue 13): a lookup reaches its site; the site's disk reads ended; the answer
  // reaches prefill; prefill's RMA reads of the staged blocks ended; a disk write ended.
  tier2_lookup, tier2_staged, tier2_reply, tier2_read_done, tier2_written
};

// Events that are not periodic: the run goes on while one of these is pending.
bool is_work(EventKind k) { return k != EventKind::load_report && k != EventKind::tick; }

struct Event {
  int64_t t_ns = 0;
  uint64_t seq = 0;  // insertion order: breaks ties deterministically
  EventKind kind = EventKind::send;
  uint32_t target = 0;  // instance index (prefill or decode), unused for send
  uint64_t arg = 0;     // request index (send), seq id (pull_done, deliver, ...)
  uint32_t epoch = 0;   // the target instance's incarnation when pushed (steps, pulls)
};

struct Later {
  bool operator()(const Event& a, const Event& b) const {
    return a.t_ns != b.t_ns ? a.t_ns > b.t_ns : a.seq > b.seq;
  }
};

// A session's prefix-hash chain: hashes of every full sub-block so far plus the open one.
struct Chain {
  std::vector<kv::BlockHash> hashes;
  std::vector<kv::TokenId> tail;  // < sub_block_tokens tokens
  uint64_t tokens_count = 0;
  size_t segments_count = 0;  // leading segments of the last prompt already hashed
};

// A prompt waiting for tier 2 at its prefill instance (prefill_actor's Tier2Wait).
struct Tier2Wait {
  uint32_t site = 0;              // whose tier 2 it asked
  uint32_t site_incarnation = 0;  // of the site's node when asked
  prefill::PrefillRequest core;   // submitted to the scheduler when the wait ends
  std::vector<kv::BlockHash> block_hashes;  // the prompt's full blocks' (every k-th prefix hash)
  uint32_t device_hit = 0;        // whole blocks the pool held when asked
  uint32_t asked_blocks = 0;      // block positions after those asked for (a probe asks fewer)
  uint32_t lacking = 0;           // block positions the prompt could read (Tier2Lack)
  prefill::Tier2Ask ask;          // the lookup's hashes
  uint32_t gain_min = 1;          // sub-blocks a staged partial must add (tier2_partial_gain_min)
  uint32_t partial = 0;           // sub-blocks of the last staged block (0: all whole)
  double budget_s = 0;            // computing them would take this long (0: unmeasured)
  int64_t sent_ns = 0;
  std::vector<kv::BlockIndex> head, fresh;  // held while the staged blocks are read
  bool reading = false;
};

struct PrefillInst {
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<prefill::PrefillScheduler> sched;
  uint64_t step_id = 0;
  InstanceStats stats;
  // Tier 2: prompts waiting for a lookup (<= prefill_queue_max), the measured rates, and the
  // inbound link the staged blocks are read over (one transfer at a time).
  std::map<uint64_t, Tier2Wait> tier2;
  prefill::Tier2RateBook rates;
  int64_t link_free_ns = 0;
};

// A lookup at its site: the store slots it pinned while reading, and what it staged.
struct SiteLookup {
  uint32_t asker = 0;  // prefill instance
  bool refused = false;  // lookups_max in flight: answered empty, the core knows nothing of it
  std::vector<kv_offload::LookupGrant> grants;
  std::vector<std::optional<kv::tier2::SlotIndex>> pinned;  // per grant (none: not stored)
  std::vector<uint8_t> read_ok;         // per grant: the disk read succeeded (faults)
  uint32_t staged = 0;                  // the staged prefix, once every read ended
  std::vector<uint8_t> corrupt_served;  // per staged block: served though corrupt (bug only)
  bool read = false;                    // every disk read ended (pins released)
  int64_t deadline_ns = 0;              // arrival + the asker's budget (0: none)
};

// One node's tier 2: the store's slot map (capacity, LRU, pins), kv-offload's core (staging,
// beliefs) and the disk (one FIFO queue). Survives a crash of its node: the index is durable.
struct Tier2Site {
  std::unique_ptr<kv::tier2::SlotTable> slots;
  std::unique_ptr<kv_offload::OffloadCore> core;
  std::vector<uint8_t> corrupt;                      // by store slot: fails verification
  std::map<kv_offload::Slot, kv::BlockHash> writes;  // staging slot -> block being written
  std::map<uint64_t, SiteLookup> lookups;            // by seq id, <= lookups_max
  int64_t disk_free_ns = 0;
  bool disk_measured = false;  // a disk read happened: answers report the disk's read rate
  uint64_t tick = 0;        // the slot map's logical use time
  uint64_t generation = 0;  // writes so far
};

// An error a decode instance owes the gateway (pd_policy LostStreams).
struct LostItem {
  uint64_t seq = 0;
};

// Where a pull reads from: the prefill instance (and its incarnation) of the attempt.
struct PullSource {
  uint32_t prefill = 0;
  uint32_t incarnation = 0;
  uint32_t blocks = 0;  // blocks to read (set when the pull starts)
};

struct DecodeInst {
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<decode::DecodeScheduler> sched;
  uint64_t step_id = 0;
  int64_t link_free_ns = 0;  // the inbound link is busy until then (transfers serialize)
  std::vector<decode::SampledTokens> sampled;  // the step in flight's results, reused
  size_t sampled_count = 0;                    // of `sampled`, for the step in flight
  decode::DecodePlan plan;                     // the last plan, handed back for reuse
  std::vector<decode::SeqUpdate> updates;      // the last step's updates, reused
  InstanceStats stats;
  // Faults: errors owed to the gateway, and the pull source of every P/D sequence.
  decode::LostStreams<LostItem> lost{4096, 50};
  std::map<uint64_t, PullSource> pull_sources;  // <= waiting_max + seqs_max
  bool leaked = false;                          // bugs.leak_block planted here
  // eagle3: the scheduler's wants (scratch) and the draft model's time owed to the next step.
  std::vector<decode::DecodeScheduler::DraftWant> draft_wants;
  double draft_s = 0;
};

// One request as the gateway sees it; seq ids are request_index * 4 + attempt (the real
// gateway reuses its id; the duplicate it would meet is emulated, see route()).
struct ReqState {
  uint32_t session_index = 0;  // into Sim::sessions_
  int32_t prefill = -1;        // prefill instance index, -1 = local prefill on decode
  uint32_t decode = 0;
  bool cached_known = false;
  bool sent = false;
  bool done = false;
  uint64_t cached_tokens = 0;
  // Faults.
  uint32_t attempt = 0;
  uint32_t retries_left = gateway::retries_max;
  uint32_t tokens_sent = 0;      // tokens the gateway received (and streamed)
  uint32_t decode_incarnation = 0, prefill_incarnation = 0;
  int32_t tier2_site = -1;       // the router's remote tier-2 copy for this attempt, -1 none
  bool at_prefill = false;       // decode waits for the remote prefill's answer
  int64_t prefill_deadline_ns = 0;
  int64_t last_activity_ns = 0;
  bool routed = false;           // the current attempt has a decode instance
};
static_assert(gateway::retries_max < 4, "seq ids keep 2 bits for the attempt");

uint64_t seq_id(uint32_t request_index, uint32_t attempt) {
  return uint64_t{request_index} * 4 + attempt;
}
uint32_t request_of(uint64_t seq) { return static_cast<uint32_t>(seq / 4); }
uint32_t attempt_of(uint64_t seq) { return static_cast<uint32_t>(seq % 4); }

struct Session {
  std::vector<uint32_t> requests;  // request indexes in turn order
  uint32_t next_turn = 0;
  Chain chain;
};

// A node: the gateway (0), the router (1), prefill instances (2..), decode instances.
struct Node {
  std::string name;
  bool alive = true;
  uint32_t incarnation = 0;
};

// One observer's view of one peer (membership by heartbeats).
struct Detector {
  uint32_t observer = 0, peer = 0;  // node indexes
  bool down = false;
  uint32_t seen_incarnation = 0;
  int64_t unreachable_since = -1;  // -1: reachable
  bool restart_pending = false;
};

class Sim {
 public:
  Sim(const ClusterSimConfig& config, const std::vector<workload::Request>& requests,
      std::vector<Fault> faults, std::vector<std::pair<uint32_t, uint32_t>> fault_nodes);
  Status run();
  ClusterSimResult take_result();

 private:
  void push(int64_t t_ns, EventKind kind, uint32_t target, uint64_t arg, uint32_t epoch = 0);
  Status build_sessions();
  void start_session(uint32_t session_index, int64_t t_ns);
  void schedule_next_turn(uint32_t session_index);
  Status hash_prompt(uint32_t request_index, Chain& chain);
  void extend(Chain& chain, std::span<const uint32_t> tokens);
  void on_send(uint32_t request_index);
  void route(uint32_t request_index);
  void on_deliver(uint64_t seq);
  bool submit_decode(uint32_t request_index, decode::KvSource source,
                     std::vector<kv::BlockHash> hashes);
  void fallback_local(uint32_t request_index);
  void kick_prefill(uint32_t p);
  void kick_decode(uint32_t d);
  void on_prefill_done(uint32_t p);
  void on_decode_done(uint32_t d);
  void model_drafts(uint32_t d);
  void on_pull_done(uint32_t d, uint64_t seq);
  void apply_update(uint32_t d, const decode::SeqUpdate& update);
  void gateway_failure(uint32_t request_index, ErrorKind kind, const std::string& label);
  void cancel_attempt(uint32_t request_index);
  void finish(uint32_t request_index, const std::string& error_kind,
              std::optional<ErrorKind> cause = std::nullopt);
  void sync_prefill(uint32_t p);
  void apply_events(router::InstanceId id, const kv::CacheEvents& ev);
  void sync_decode(uint32_t d);
  void on_load_report();
  void start_pulls(uint32_t d, const std::vector<decode::PullOrder>& pulls);
  void submit_prefill(uint32_t p, prefill::PrefillRequest pr);
  router::InstanceLoad prefill_load(uint32_t p) const;
  // Tier 2 (issue 13).
  void reset_site(uint32_t s);
  bool ask_tier2(uint32_t p, prefill::PrefillRequest& pr, int32_t named_site);
  void on_tier2_lookup(uint32_t p, uint64_t seq);
  void on_tier2_staged(uint32_t s, uint64_t seq);
  void on_tier2_reply(uint32_t p, uint64_t seq);
  void on_tier2_read_done(uint32_t p, uint64_t seq);
  void on_tier2_written(uint32_t s, kv_offload::Slot slot);
  void end_tier2_wait(uint32_t p, uint64_t seq, bool again = false);
  void release_lookup(uint32_t s, uint64_t seq);
  void offer_tier2(uint32_t p, const prefill::PrefillDone& done);
  void announce_site(uint32_t s);  // the router's view of the site: a snapshot
  kv_offload::RequestKey tier2_key(uint32_t p, uint64_t seq) const {
    return {prefill_[p].stats.name, seq};
  }
  double fault_value(FaultKind kind, uint32_t node) const;  // an active fault's, else 0
  double now_ms() const { return static_cast<double>(now_ns_) / 1e6; }
  router::InstanceId decode_id(uint32_t d) const { return {config_.prefill_count + d}; }
  // Faults.
  uint32_t prefill_node(uint32_t p) const { return 2 + p; }
  uint32_t partial_gain_min(const prefill::Tier2Rates& rates, uint32_t k) const {
    return prefill::tier2_partial_gain_min(static_cast<uint64_t>(block_bytes_),
                                           std::max<uint32_t>(1, config_.block_tokens / k), k,
                                           rates);
  }
  uint32_t decode_node(uint32_t d) const { return 2 + config_.prefill_count + d; }
  void reset_prefill(uint32_t p);
  void reset_decode(uint32_t d);
  void on_fault(uint32_t index, bool begin);
  bool partitioned(uint32_t a, uint32_t b) const;
  bool linked(uint32_t a, uint32_t b) const;  // both alive, not partitioned
  bool lose(uint32_t a, uint32_t b);          // a message from a to b is lost (draws)
  double delay_ms(uint32_t a, uint32_t b) const;
  double slow_factor(uint32_t node) const;
  int64_t hang_end_ns(uint32_t node) const;  // > now: hung until then
  void evaluate_detectors();
  void on_detect(uint32_t index, EventKind kind, int64_t since);
  void peer_down(const Detector& det);
  void peer_up(const Detector& det);
  void on_tick();
  void violate(const std::string& what);
  void check_after_event();
  void check_at_end();
  bool stale(const Event& e) const;

  const ClusterSimConfig& config_;
  const std::vector<workload::Request>& requests_;
  router::RouterCore router_;
  kv::BlockHasher hasher_;
  prefill::PrefillConfig prefill_config_;
  decode::DecodeConfig decode_config_;
  std::vector<PrefillInst> prefill_;
  std::vector<DecodeInst> decode_;
  std::vector<Tier2Site> sites_;  // one per prefill instance when tier 2 is on
  double block_bytes_ = 0;        // a full KV block's bytes
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  uint64_t event_seq_ = 0;
  uint64_t work_pending_ = 0;  // events with is_work(kind) in events_
  int64_t now_ns_ = 0;
  int64_t duration_ns_ = 0;
  std::vector<Session> sessions_;
  std::deque<uint32_t> sessions_waiting_;                       // not started yet, in start order
  std::map<std::pair<uint64_t, uint64_t>, Chain> base_chains_;  // (system, repo) -> chain
  std::vector<ReqState> states_;
  std::vector<uint32_t> scratch_tokens_;
  std::vector<devices::sim::SeqShape> shapes_, prefill_shapes_;
  ClusterSimResult result_;
  // Faults.
  std::vector<Fault> faults_;
  std::vector<std::pair<uint32_t, uint32_t>> fault_nodes_;  // (a, b) node indexes per fault
  std::vector<int64_t> fault_end_ns_;                       // per fault (crash forever: max)
  std::vector<uint32_t> active_;                            // fault indexes in effect
  bool fault_mode_ = false;
  std::vector<Node> nodes_;
  std::vector<Detector> detectors_;
  std::vector<bool> router_down_;  // by node: the router has declared it down
  std::set<uint32_t> in_flight_;   // sent, not ended (request indexes; <= sessions_in_flight)
  std::mt19937_64 rng_;
  int64_t detect_ns_ = 0, heartbeat_ns_ = 0, tick_ns_ = 0;
  size_t events_max_ = 0;
  bool stopped_ = false;
  bool dropped_once_ = false;  // bugs.drop_end planted
};

kv::BlockHasher make_hasher(uint32_t block_tokens) {
  auto hasher = kv::BlockHasher::create({"tandem-sim", "sim", ""}, block_tokens);
  RT_ASSERT(hasher.ok(), hasher.ok() ? "" : hasher.error().describe());
  return std::move(hasher).value();
}

router::RouterConfig router_config(const ClusterSimConfig& c) {
  router::RouterConfig r = c.router;
  r.block_tokens = c.hash_tokens();
  r.sub_blocks_per_block = c.block_tokens / c.hash_tokens();
  r.instances_max = std::max(r.instances_max, c.prefill_count + c.decode_count);
  return r;
}

uint32_t pool_blocks(const ClusterSimConfig& c, const devices::sim::SimParams& device) {
  if (c.kv_blocks > 0) return c.kv_blocks;
  double blocks = devices::sim::kv_capacity_tokens(device) / c.block_tokens;
  return static_cast<uint32_t>(std::clamp(blocks, 1.0, 16.0e6));
}

int64_t to_ns(double seconds) {
  RT_ASSERT(seconds >= 0, seconds);
  RT_ASSERT(std::isfinite(seconds), seconds);
  return static_cast<int64_t>(std::llround(seconds * 1e9));
}

prefill::PrefillConfig prefill_config(const ClusterSimConfig& config) {
  return {config.block_tokens,
          config.prefill_queue_max,
          config.prefill_running_max,
          config.prefill_held_max,
          config.prefill_step_tokens_max,
          std::chrono::milliseconds(config.prefill_hold_timeout_ms)};
}

decode::DecodeConfig decode_config(const ClusterSimConfig& config) {
  return {config.block_tokens, config.decode_waiting_max, config.decode_seqs_max,
          config.decode_step_tokens_max, config.max_model_tokens, config.spec};
}

Sim::Sim(const ClusterSimConfig& config, const std::vector<workload::Request>& requests,
         std::vector<Fault> faults, std::vector<std::pair<uint32_t, uint32_t>> fault_nodes)
    : config_(config),
      requests_(requests),
      router_(router_config(config)),
      hasher_(make_hasher(config.hash_tokens())),
      prefill_config_(prefill_config(config)),
      decode_config_(decode_config(config)),
      faults_(std::move(faults)),
      fault_nodes_(std::move(fault_nodes)),
      rng_(config.seed ^ 0x5bd1e9955bd1e995ull) {
  RT_ASSERT(config.validate().ok());
  RT_ASSERT(config.decode_count >= 1);
  duration_ns_ = static_cast<int64_t>(config.duration_ms * 1e6);
  fault_mode_ = !faults_.empty();
  RT_ASSERT(fault_nodes_.size() == faults_.size(), fault_nodes_.size());
  for (const Fault& f : faults_) {
    fault_end_ns_.push_back(f.for_ms > 0 ? to_ns((f.at_ms + f.for_ms) / 1e3)
                                         : std::numeric_limits<int64_t>::max());
  }
  detect_ns_ = to_ns(config.heartbeat_interval_ms * config.heartbeat_miss_max / 1e3);
  heartbeat_ns_ = to_ns(config.heartbeat_interval_ms / 1e3);
  tick_ns_ = to_ns(0.1);  // the shells' tick (actors/common shell_tick_interval)
  for (const std::string& name : node_names(config)) nodes_.push_back({name, true, 0});
  router_down_.assign(nodes_.size(), false);
  block_bytes_ = static_cast<double>(config.block_tokens) * config.prefill_device.kv_bytes_per_token;
  prefill_.resize(config.prefill_count);
  for (uint32_t p = 0; p < config.prefill_count; ++p) {
    reset_prefill(p);
    prefill_[p].stats.name = "prefill-" + std::to_string(p);
    RT_ASSERT(router_.add_instance({p}, router::InstanceRole::prefill, p).ok(), p);
  }
  if (config.tier2.enabled) {
    sites_.resize(config.prefill_count);
    for (uint32_t site = 0; site < config.prefill_count; ++site) {
      sites_[site].slots = std::make_unique<kv::tier2::SlotTable>(config.tier2.capacity_blocks);
      sites_[site].slots->restore_finish();  // an empty store
      sites_[site].corrupt.assign(config.tier2.capacity_blocks, 0);
      reset_site(site);
    }
  }
  decode_.resize(config.decode_count);
  for (uint32_t d = 0; d < config.decode_count; ++d) {
    reset_decode(d);
    decode_[d].stats.name = nodes_[decode_node(d)].name;
    uint32_t site = config.prefill_count > 0 ? d % config.prefill_count : 0;
    RT_ASSERT(router_.add_instance(decode_id(d), router::InstanceRole::decode, site).ok(), d);
  }
  for (uint32_t p = 0; p < config.prefill_count; ++p) sync_prefill(p);
  for (uint32_t d = 0; d < config.decode_count; ++d) sync_decode(d);
  // Observers: the router watches every instance, the gateway every decode instance, each
  // decode instance every prefill instance (router first: it learns before the gateway
  // re-routes).
  const auto instances = static_cast<uint32_t>(nodes_.size());
  for (uint32_t n = 2; n < instances; ++n) detectors_.push_back({1, n});
  for (uint32_t d = 0; d < config.decode_count; ++d) detectors_.push_back({0, decode_node(d)});
  for (uint32_t d = 0; d < config.decode_count; ++d) {
    for (uint32_t p = 0; p < config.prefill_count; ++p) {
      detectors_.push_back({decode_node(d), prefill_node(p)});
    }
  }
  uint64_t crashes = 0;
  for (const Fault& f : faults_) crashes += f.kind == FaultKind::crash;
  // Pending events: a few per request in flight (send, deliver, error, timeout), a step and
  // the pulls of each instance per incarnation, two per fault, three per detector.
  events_max_ = 8 * size_t{config.sessions_in_flight} +
                (config.tier2.enabled ? size_t{config.tier2.staging_blocks} *
                                            config.prefill_count * (1 + crashes)
                                      : 0) +
                (size_t{config.decode_seqs_max} + config.decode_waiting_max + 4) *
                    (instances - 2) * (1 + crashes) +
                2 * faults_.size() + (3 + 2 * faults_.size()) * detectors_.size() + 64;
}

// A node's tier 2 after its process (re)starts: the store's index is back (durable), the
// staging, lookups and writes in flight are gone (a write not indexed yet was never visible).
void Sim::reset_site(uint32_t s) {
  Tier2Site& site = sites_[s];
  const ClusterSimConfig::Tier2& t = config_.tier2;
  kv_offload::OffloadConfig oc;
  oc.staging_blocks = t.staging_blocks;
  oc.stores_max = t.stores_max;
  oc.lookups_max = t.lookups_max;
  oc.lookup_blocks_max = t.lookup_blocks_max;
  oc.known_blocks_max = t.capacity_blocks;
  oc.hold_timeout = Nanos(to_ns(t.hold_timeout_ms / 1e3));
  site.core = std::make_unique<kv_offload::OffloadCore>(oc);
  for (auto& [seq, lookup] : site.lookups) {  // reads in flight die with the process
    if (lookup.read) continue;
    for (const auto& slot : lookup.pinned) {
      if (slot) (void)site.slots->unpin(*slot);
    }
  }
  site.lookups.clear();
  site.writes.clear();
  site.disk_free_ns = now_ns_;
  for (const kv::BlockHash& h : site.slots->visible_hashes()) site.core->note_held(h);
}

void Sim::announce_site(uint32_t s) {
  router_.tier2_clear(s);
  std::vector<kv::BlockHash> held = sites_[s].slots->visible_hashes();
  std::sort(held.begin(), held.end(), [](const kv::BlockHash& a, const kv::BlockHash& b) {
    return a.bytes < b.bytes;  // deterministic order (refusals past the bound)
  });
  (void)router_.tier2_stored(s, held);
}

void Sim::reset_prefill(uint32_t p) {
  PrefillInst& inst = prefill_[p];
  inst.sched.reset();
  inst.tier2.clear();  // the waits' blocks were in the pool that is replaced below
  inst.rates = {};
  inst.link_free_ns = now_ns_;
  inst.cache = std::make_unique<kv::PrefixCache>(pool_blocks(config_, config_.prefill_device),
                                                 config_.block_tokens, config_.hash_tokens());
  inst.sched = std::make_unique<prefill::PrefillScheduler>(prefill_config_, *inst.cache);
  inst.step_id = 0;
  // A restarted source's events start from an empty cache (the real router resyncs).
  if (config_.precise_index) (void)router_.kv_clear({p});
}

void Sim::reset_decode(uint32_t d) {
  DecodeInst& inst = decode_[d];
  inst.sched.reset();
  inst.cache = std::make_unique<kv::PrefixCache>(pool_blocks(config_, config_.decode_device),
                                                 config_.block_tokens, config_.hash_tokens());
  inst.sched = std::make_unique<decode::DecodeScheduler>(decode_config_, *inst.cache);
  inst.step_id = 0;
  if (config_.precise_index) (void)router_.kv_clear(decode_id(d));
  inst.link_free_ns = now_ns_;
  inst.sampled_count = 0;
  inst.lost = decode::LostStreams<LostItem>(4096, 50);
  inst.pull_sources.clear();
  inst.leaked = false;
}

void Sim::push(int64_t t_ns, EventKind kind, uint32_t target, uint64_t arg, uint32_t epoch) {
  RT_ASSERT(t_ns >= now_ns_, t_ns, now_ns_);
  events_.push(Event{t_ns, event_seq_++, kind, target, arg, epoch});
  if (is_work(kind)) ++work_pending_;
}

// Groups requests into sessions (turn order) and queues the sessions by first arrival.
Status Sim::build_sessions() {
  std::unordered_map<uint32_t, uint32_t> index_of;  // session id -> index
  states_.resize(requests_.size());
  result_.timelines.resize(requests_.size());
  if (requests_.size() >= (uint64_t{1} << 61)) {
    return make_error(ErrorKind::invalid, "sim: too many requests");
  }
  for (uint32_t i = 0; i < requests_.size(); ++i) {
    const workload::Request& r = requests_[i];
    if (r.segments.empty() && r.prompt_token_ids.empty()) {
      return make_error(ErrorKind::invalid, "sim: request " + std::to_string(i) + " (session " +
                                                std::to_string(r.session) +
                                                "): needs a token-id prompt, not text");
    }
    if (r.expected_output_tokens < 1) {
      return make_error(ErrorKind::invalid,
                        "sim: request " + std::to_string(i) + ": expected_output_tokens is 0");
    }
    auto [it, fresh] = index_of.try_emplace(r.session, static_cast<uint32_t>(sessions_.size()));
    if (fresh) {
      sessions_.emplace_back();
      sessions_waiting_.push_back(it->second);
    }
    Session& s = sessions_[it->second];
    if (!s.requests.empty() && requests_[s.requests.back()].turn >= r.turn) {
      return make_error(ErrorKind::invalid, "sim: request " + std::to_string(i) +
                                                ": turns of session " + std::to_string(r.session) +
                                                " out of order");
    }
    s.requests.push_back(i);
    states_[i].session_index = it->second;
  }
  return {};
}

void Sim::start_session(uint32_t session_index, int64_t t_ns) {
  Session& s = sessions_[session_index];
  RT_ASSERT(s.next_turn == 0, session_index);
  RT_ASSERT(!s.requests.empty(), session_index);
  if (t_ns >= duration_ns_) return;
  push(t_ns, EventKind::send, 0, s.requests[0]);
}

// After a turn ended: the next turn after its think time, or the next session.
void Sim::schedule_next_turn(uint32_t session_index) {
  Session& s = sessions_[session_index];
  RT_ASSERT(s.next_turn <= s.requests.size(), s.next_turn);
  if (s.next_turn < s.requests.size()) {
    const workload::Request& next = requests_[s.requests[s.next_turn]];
    int64_t t_ns = now_ns_ + to_ns(std::max(0.0, next.think_time_ms) / 1e3);
    if (t_ns < duration_ns_) {
      push(t_ns, EventKind::send, 0, s.requests[s.next_turn]);
      return;
    }
  }
  s.chain = Chain{};  // the session is over: free its hashes
  if (!sessions_waiting_.empty() && now_ns_ < duration_ns_) {
    uint32_t next = sessions_waiting_.front();
    sessions_waiting_.pop_front();
    start_session(next, now_ns_);
  }
}

// Events of an instance that crashed after they were scheduled are dropped.
bool Sim::stale(const Event& e) const {
  switch (e.kind) {
    case EventKind::prefill_done:
    case EventKind::tier2_lookup:
    case EventKind::tier2_staged:  // a site lives on its prefill instance's node
    case EventKind::tier2_written:
    case EventKind::tier2_reply:
    case EventKind::tier2_read_done:
      return nodes_[prefill_node(e.target)].incarnation != e.epoch;
    case EventKind::decode_done:
    case EventKind::pull_done: return nodes_[decode_node(e.target)].incarnation != e.epoch;
    default: return false;
  }
}

Status Sim::run() {
  if (Status s = build_sessions(); !s) return s;
  // The first sessions_in_flight sessions start at their generated (staggered) offsets.
  for (uint32_t k = 0; k < config_.sessions_in_flight && !sessions_waiting_.empty(); ++k) {
    uint32_t index = sessions_waiting_.front();
    sessions_waiting_.pop_front();
    double offset_ms = std::max(0.0, requests_[sessions_[index].requests[0]].arrival_offset_ms);
    start_session(index, to_ns(offset_ms / 1e3));
  }
  if (config_.load_report_interval_ms > 0) push(0, EventKind::load_report, 0, 0);
  for (uint32_t i = 0; i < faults_.size(); ++i) {
    const Fault& f = faults_[i];
    int64_t at = to_ns(f.at_ms / 1e3);
    push(at, EventKind::fault_begin, i, 0);
    if (f.for_ms > 0) push(fault_end_ns_[i], EventKind::fault_end, i, 0);
  }
  if (fault_mode_) push(0, EventKind::tick, 0, 0);
  while (!events_.empty() && !stopped_) {
    Event e = events_.top();
    events_.pop();
    if (is_work(e.kind)) --work_pending_;
    RT_ASSERT(e.t_ns >= now_ns_, e.t_ns, now_ns_);
    now_ns_ = e.t_ns;
    ++result_.events_count;
    if (stale(e)) {
      ++result_.fault_counters.stale_events;
      continue;
    }
    switch (e.kind) {
      case EventKind::send:
        on_send(static_cast<uint32_t>(e.arg));
        break;
      case EventKind::prefill_done:
        if (int64_t until = hang_end_ns(prefill_node(e.target)); until > now_ns_) {
          push(until, e.kind, e.target, e.arg, e.epoch);  // hung: completes when it resumes
          break;
        }
        on_prefill_done(e.target);
        break;
      case EventKind::decode_done:
        if (int64_t until = hang_end_ns(decode_node(e.target)); until > now_ns_) {
          push(until, e.kind, e.target, e.arg, e.epoch);
          break;
        }
        on_decode_done(e.target);
        break;
      case EventKind::pull_done:
        on_pull_done(e.target, e.arg);
        break;
      case EventKind::load_report:
        on_load_report();
        break;
      case EventKind::fault_begin:
      case EventKind::fault_end:
        on_fault(e.target, e.kind == EventKind::fault_begin);
        break;
      case EventKind::detect_down:
      case EventKind::detect_up:
      case EventKind::detect_restart:
        on_detect(e.target, e.kind, static_cast<int64_t>(e.arg));
        break;
      case EventKind::tick:
        on_tick();
        break;
      case EventKind::deliver:
        on_deliver(e.arg);
        break;
      case EventKind::router_timeout: {
        uint32_t i = request_of(e.arg);
        if (!states_[i].done && states_[i].attempt == attempt_of(e.arg)) {
          finish(i, "gateway_no_router");  // "the router did not answer within 5 s" (503)
        }
        break;
      }
      case EventKind::tier2_lookup:
        on_tier2_lookup(e.target, e.arg);
        break;
      case EventKind::tier2_staged:
        on_tier2_staged(e.target, e.arg);
        break;
      case EventKind::tier2_reply:
        on_tier2_reply(e.target, e.arg);
        break;
      case EventKind::tier2_read_done:
        on_tier2_read_done(e.target, e.arg);
        break;
      case EventKind::tier2_written:
        on_tier2_written(e.target, static_cast<kv_offload::Slot>(e.arg));
        break;
      case EventKind::gateway_error: {
        uint32_t i = request_of(e.arg);
        const ReqState& st = states_[i];
        if (!st.done && st.routed && st.attempt == attempt_of(e.arg) && st.decode == e.target) {
          gateway_failure(i, ErrorKind::failed, "decode_lost_tokens");
        }
        break;
      }
    }
    check_after_event();
  }
  result_.simulated_ms = now_ms();
  if (!stopped_) check_at_end();
  if (!stopped_) {
    RT_ASSERT(result_.sent_count == result_.completed_count + result_.failed_count,
              result_.sent_count, result_.completed_count, result_.failed_count);
  }
  return {};
}

// Appends tokens to the chain, hashing every sub-block they complete.
void Sim::extend(Chain& chain, std::span<const uint32_t> tokens) {
  const uint32_t bt = config_.hash_tokens();
  for (uint32_t token : tokens) {
    chain.tail.push_back(static_cast<kv::TokenId>(token));
    if (chain.tail.size() == bt) {
      const kv::BlockHash* parent = chain.hashes.empty() ? nullptr : &chain.hashes.back();
      chain.hashes.push_back(hasher_.hash_block(parent, chain.tail));
      chain.tail.clear();
    }
  }
  chain.tokens_count += tokens.size();
  RT_ASSERT(chain.hashes.size() == chain.tokens_count / bt, chain.hashes.size());
}

bool segments_extend(const std::vector<workload::Segment>& now, const workload::Request& before,
                     size_t count) {
  if (count > now.size() || before.segments.size() != count) return false;
  return std::equal(before.segments.begin(), before.segments.end(), now.begin());
}

// Brings `chain` to the request's prompt, hashing only what the chain does not hold yet:
// a session's turn extends its previous turn; a first turn starts from the memoized
// (system prompt, repository context) chain.
Status Sim::hash_prompt(uint32_t request_index, Chain& chain) {
  const workload::Request& r = requests_[request_index];
  if (!r.prompt_token_ids.empty()) {  // a replayed trace: hash the whole prompt
    chain = Chain{};
    extend(chain, r.prompt_token_ids);
    return {};
  }
  const Session& s = sessions_[states_[request_index].session_index];
  bool extends =
      s.next_turn > 0 &&
      segments_extend(r.segments, requests_[s.requests[s.next_turn - 1]], chain.segments_count);
  if (!extends) {
    chain = Chain{};
    const auto& seg = r.segments;
    if (seg.size() >= 2 && seg[0].kind == workload::SegmentKind::system &&
        seg[1].kind == workload::SegmentKind::repo) {
      auto key = std::make_pair(seg[0].seed ^ (uint64_t{seg[0].tokens_count} << 32),
                                seg[1].seed ^ (uint64_t{seg[1].tokens_count} << 32));
      auto it = base_chains_.find(key);
      if (it == base_chains_.end()) {
        Chain base;
        for (size_t k = 0; k < 2; ++k) {
          scratch_tokens_.clear();
          workload::append_token_ids(seg[k], scratch_tokens_);
          extend(base, scratch_tokens_);
        }
        base.segments_count = 2;
        it = base_chains_.emplace(key, std::move(base)).first;
      }
      chain = it->second;
    }
  }
  for (size_t k = chain.segments_count; k < r.segments.size(); ++k) {
    scratch_tokens_.clear();
    workload::append_token_ids(r.segments[k], scratch_tokens_);
    extend(chain, scratch_tokens_);
  }
  chain.segments_count = r.segments.size();
  RT_ASSERT(chain.tokens_count == r.prompt_tokens_count(), chain.tokens_count);
  return {};
}


void Sim::finish(uint32_t request_index, const std::string& error_kind,
                 std::optional<ErrorKind> cause) {
  ReqState& st = states_[request_index];
  if (st.done) return violate("request " + std::to_string(request_index) + " ended twice");
  // Invariant: a request whose instance failed before any token reached the client is
  // routed again while it has retries left; it may end with that failure only after.
  if (cause && gateway::retryable(*cause) && st.tokens_sent == 0 && st.retries_left > 0) {
    violate("request " + std::to_string(request_index) + " ended with " + error_kind +
            " before any token, with " + std::to_string(st.retries_left) +
            " retries left (it should have been retried)");
  }
  // Invariant: the workload sends only valid requests, so none may end with a client error
  // (400): an `invalid` here is the cluster's own doing (e.g. a retry refused as duplicate).
  if (cause && *cause == ErrorKind::invalid) {
    violate("request " + std::to_string(request_index) + " ended with a client error (" +
            error_kind + ") after " + std::to_string(st.attempt) + " retries");
  }
  st.done = true;
  st.at_prefill = false;
  if (!config_.bugs.unbounded) in_flight_.erase(request_index);
  workload::RequestTimeline& t = result_.timelines[request_index];
  t.end_ms = std::max(now_ms(), t.chunk_ms.empty() ? t.send_ms : t.chunk_ms.back());
  t.error_kind = error_kind;
  if (error_kind.empty()) {
    ++result_.completed_count;
  } else {
    ++result_.failed_count;
    ++result_.failed_by_kind[error_kind];
  }
  schedule_next_turn(st.session_index);
}

void Sim::on_send(uint32_t request_index) {
  const workload::Request& r = requests_[request_index];
  ReqState& st = states_[request_index];
  Session& s = sessions_[st.session_index];
  RT_ASSERT(s.requests[s.next_turn] == request_index, request_index);
  st.sent = true;
  workload::RequestTimeline& t = result_.timelines[request_index];
  t.send_ms = now_ms();
  t.chunk_ms.reserve(r.expected_output_tokens);  // one chunk per token: no regrowth
  t.turn = r.turn;
  ++result_.sent_count;
  RT_ASSERT(hash_prompt(request_index, s.chain).ok());
  ++s.next_turn;
  t.prompt_tokens = s.chain.tokens_count;
  if (t.prompt_tokens < 1 ||
      t.prompt_tokens + r.expected_output_tokens > config_.max_model_tokens) {
    finish(request_index, "context_length");
    return;
  }
  in_flight_.insert(request_index);
  route(request_index);
}

// The gateway asks the router, then sends the request to the decode instance picked (which
// asks the prefill instance, if any). Messages on a broken link are lost; the gateway's
// membership view or its no-progress timeout then fails the attempt.
void Sim::route(uint32_t request_index) {
  ReqState& st = states_[request_index];
  const Session& s = sessions_[st.session_index];
  workload::RequestTimeline& t = result_.timelines[request_index];
  st.at_prefill = false;
  st.prefill = -1;
  st.tier2_site = -1;
  st.routed = false;
  st.last_activity_ns = now_ns_;
  const uint64_t seq = seq_id(request_index, st.attempt);
  if (fault_mode_ && (!linked(0, 1) || lose(0, 1))) {  // the pick request is lost
    push(now_ns_ + to_ns(5), EventKind::router_timeout, 0, seq);
    return;
  }
  const router::PickRequest pick_request{s.chain.hashes, t.prompt_tokens};
  auto pick = config_.precise_index ? router_.decide(pick_request) : router_.pick(pick_request);
  if (!pick) {
    finish(request_index, "router_" + std::string(to_string(pick.error().kind)));
    return;
  }
  st.decode = pick->decode.value - config_.prefill_count;
  st.routed = true;
  RT_ASSERT(st.decode < decode_.size(), st.decode);
  // Invariant: the router never picks an instance it has declared down.
  if (router_down_[decode_node(st.decode)]) {
    return violate("the router picked " + nodes_[decode_node(st.decode)].name +
                   ", which it had declared down");
  }
  if (pick->prefill) {
    st.prefill = static_cast<int32_t>(pick->prefill->value);
    RT_ASSERT(st.prefill >= 0 && static_cast<uint32_t>(st.prefill) < prefill_.size(), st.prefill);
    if (router_down_[prefill_node(static_cast<uint32_t>(st.prefill))]) {
      return violate("the router picked " + nodes_[prefill_node(st.prefill)].name +
                     ", which it had declared down");
    }
    ++result_.pd_requests_count;
    if (pick->prefill_tier2_site) st.tier2_site = static_cast<int32_t>(*pick->prefill_tier2_site);
  }
  const uint32_t dn = decode_node(st.decode);
  st.decode_incarnation = nodes_[dn].incarnation;
  if (!fault_mode_) return on_deliver(seq);
  // The gateway's membership view says the node is down: the send fails at once.
  for (const Detector& det : detectors_) {
    if (det.observer == 0 && det.peer == dn && det.down) {
      return gateway_failure(request_index, ErrorKind::disconnected, "gateway_decode_down");
    }
  }
  if (!linked(0, dn) || lose(0, dn)) return;  // lost
  double delay = delay_ms(0, dn);
  if (delay > 0) return push(now_ns_ + to_ns(delay / 1e3), EventKind::deliver, st.decode, seq);
  on_deliver(seq);
}

// The request reaches its decode instance.
void Sim::on_deliver(uint64_t seq) {
  const uint32_t i = request_of(seq);
  ReqState& st = states_[i];
  if (st.done || st.attempt != attempt_of(seq)) return;
  const uint32_t dn = decode_node(st.decode);
  if (!nodes_[dn].alive || nodes_[dn].incarnation != st.decode_incarnation) return;  // lost
  DecodeInst& dec = decode_[st.decode];
  // The real gateway re-sends the same request id: an earlier attempt still on this decode
  // instance is replaced (pd_policy on_duplicate, same gateway): cancelled first; one whose
  // pull is in flight cannot go yet, and decode answers a retryable error.
  for (uint32_t a = 0; a < st.attempt; ++a) {
    const uint64_t old = seq_id(i, a);
    if (!dec.sched->stage(old)) continue;
    if (decode::on_duplicate(true) == decode::Duplicate::refuse) {
      return gateway_failure(i, ErrorKind::invalid, "decode_duplicate");
    }
    (void)dec.sched->cancel(old);
    if (!dec.sched->stage(old)) dec.pull_sources.erase(old);
    sync_decode(st.decode);
    if (dec.sched->stage(old)) return gateway_failure(i, ErrorKind::failed, "decode_duplicate");
  }
  const Session& s = sessions_[st.session_index];
  if (st.prefill < 0) {
    if (submit_decode(i, decode::KvSource::local, s.chain.hashes)) kick_decode(st.decode);
    return;
  }
  const auto p = static_cast<uint32_t>(st.prefill);
  const uint32_t pn = prefill_node(p);
  st.at_prefill = true;
  st.prefill_incarnation = nodes_[pn].incarnation;
  st.prefill_deadline_ns = now_ns_ + to_ns(config_.prefill_timeout_ms / 1e3);
  // A prefill instance this decode instance already declared down: local prefill at once.
  for (const Detector& det : detectors_) {
    if (det.observer == dn && det.peer == pn && det.down) return fallback_local(i);
  }
  if (fault_mode_ && (!linked(dn, pn) || lose(dn, pn))) return;  // waits: timeout or detection
  PrefillInst& inst = prefill_[p];
  for (uint32_t a = 0; a < st.attempt; ++a) {
    if (inst.sched->stage(seq_id(i, a))) return fallback_local(i);  // duplicate id: an error
  }
  prefill::PrefillRequest pr;
  pr.id = seq;
  pr.tokens.assign(result_.timelines[i].prompt_tokens, 0);
  pr.prefix_hashes = s.chain.hashes;
  if (!sites_.empty() && ask_tier2(p, pr, st.tier2_site)) return;
  submit_prefill(p, std::move(pr));
}

void Sim::submit_prefill(uint32_t p, prefill::PrefillRequest pr) {
  const uint32_t i = request_of(pr.id);
  if (Status submitted = prefill_[p].sched->submit(std::move(pr)); !submitted) {
    // Prefill answers with an error: decode prefills locally (decode_actor prefill_failed).
    return fallback_local(i);
  }
  kick_prefill(p);
}

// Decode gives up on the remote prefill (it failed, timed out or its node is down) and
// prefills locally; the prefill instance is told to drop the request when reachable.
void Sim::fallback_local(uint32_t request_index) {
  ReqState& st = states_[request_index];
  RT_ASSERT(st.at_prefill, request_index);
  st.at_prefill = false;
  ++result_.fault_counters.fallbacks;
  const uint64_t seq = seq_id(request_index, st.attempt);
  const auto p = static_cast<uint32_t>(st.prefill);
  if (linked(decode_node(st.decode), prefill_node(p)) &&
      nodes_[prefill_node(p)].incarnation == st.prefill_incarnation &&
      prefill_[p].sched->stage(seq)) {
    RT_ASSERT(prefill_[p].sched->cancel(seq).ok(), seq);
    sync_prefill(p);
    kick_prefill(p);
  }
  st.prefill = -1;
  if (submit_decode(request_index, decode::KvSource::local,
                    sessions_[st.session_index].chain.hashes)) {
    kick_decode(st.decode);
  }
}

bool Sim::submit_decode(uint32_t request_index, decode::KvSource source,
                        std::vector<kv::BlockHash> hashes) {
  ReqState& st = states_[request_index];
  decode::DecodeRequest dr;
  dr.id = seq_id(request_index, st.attempt);
  // Capacity for the whole sequence: the scheduler keeps this vector as its token history.
  dr.prompt.reserve(result_.timelines[request_index].prompt_tokens +
                    requests_[request_index].expected_output_tokens);
  dr.prompt.assign(result_.timelines[request_index].prompt_tokens, 0);
  dr.prefix_hashes = std::move(hashes);
  dr.max_tokens = requests_[request_index].expected_output_tokens;
  dr.source = source;
  if (Status submitted = decode_[st.decode].sched->submit(std::move(dr)); !submitted) {
    gateway_failure(request_index, submitted.error().kind,
                    "decode_" + std::string(to_string(submitted.error().kind)));
    return false;
  }
  if (source == decode::KvSource::pull) {
    RT_ASSERT(st.prefill >= 0, request_index);
    decode_[st.decode].pull_sources[seq_id(request_index, st.attempt)] =
        PullSource{static_cast<uint32_t>(st.prefill), st.prefill_incarnation, 0};
  }
  sync_decode(st.decode);
  return true;
}

// Reports an instance's evictions to the router at once, and its load either at once
// (load_report_interval_ms == 0) or at the next periodic report (on_load_report), as the
// real shells do: each reports its load every 100 ms, and pick()'s own waiting + 1 on the
// chosen instances lasts until then.
// The router's index from one cache's drained events: removed (with their subtrees), then, in
// precise mode, stored in chain order under their parents (as the router actor applies them).
void Sim::apply_events(router::InstanceId id, const kv::CacheEvents& ev) {
  if (!ev.removed.empty() && !(config_.precise_index && config_.bugs.precise_no_removed)) {
    RT_ASSERT(router_.kv_removed(id, ev.removed).ok(), id.value);
  }
  if (!config_.precise_index) return;
  for (size_t n = 0; n < ev.stored.size(); ++n) {
    RT_ASSERT(router_.kv_stored(id, ev.stored_parents[n], std::span(ev.stored).subspan(n, 1)).ok(),
              id.value);
  }
}

void Sim::sync_prefill(uint32_t p) {
  PrefillInst& inst = prefill_[p];
  apply_events({p}, inst.cache->drain_events());
  if (config_.load_report_interval_ms > 0) return;
  RT_ASSERT(router_.update_load({p}, prefill_load(p)).ok(), p);
}

// What a prefill instance reports: its queue, pool, and whether its cost rule reads tier 2.
router::InstanceLoad Sim::prefill_load(uint32_t p) const {
  const PrefillInst& inst = prefill_[p];
  router::InstanceLoad load{inst.sched->queued_count(), inst.sched->running_count(),
                            inst.cache->blocks_used_count(), inst.cache->blocks_count()};
  // As the prefill shell reports: the scheduler's pending tokens plus what the tier-2 waits
  // will compute once their blocks are read.
  uint64_t pending = inst.sched->pending_tokens();
  for (const auto& [seq, w] : inst.tier2) {
    pending += prefill::tokens_after_tier2(w.core.tokens.size(), w.device_hit + w.asked_blocks,
                                           config_.block_tokens);
  }
  load.pending_tokens = pending;
  load.kv_blocks_free = inst.cache->blocks_free_count();
  if (!sites_.empty()) {
    const auto bytes = static_cast<uint64_t>(block_bytes_);
    load.tier2_local_reads = prefill::tier2_reads_pay(bytes, config_.block_tokens, inst.rates.local);
    load.tier2_remote_reads =
        prefill::tier2_reads_pay(bytes, config_.block_tokens, inst.rates.remote);
  }
  return load;
}

void Sim::sync_decode(uint32_t d) {
  DecodeInst& inst = decode_[d];
  apply_events(decode_id(d), inst.cache->drain_events());
  if (config_.load_report_interval_ms > 0) return;
  router::InstanceLoad load{inst.sched->waiting_count(), inst.sched->active_count(),
                            inst.cache->blocks_used_count(), inst.cache->blocks_count()};
  RT_ASSERT(router_.update_load(decode_id(d), load).ok(), d);
}

// The periodic load report of every instance (a dead instance, or one the router cannot
// hear, reports nothing); repeats while anything else is pending.
void Sim::on_load_report() {
  RT_ASSERT(config_.load_report_interval_ms > 0, config_.load_report_interval_ms);
  for (uint32_t p = 0; p < prefill_.size(); ++p) {
    if (fault_mode_ && (!linked(prefill_node(p), 1) || lose(prefill_node(p), 1))) continue;
    RT_ASSERT(router_.update_load({p}, prefill_load(p)).ok(), p);
  }
  for (uint32_t d = 0; d < decode_.size(); ++d) {
    if (fault_mode_ && (!linked(decode_node(d), 1) || lose(decode_node(d), 1))) continue;
    const DecodeInst& inst = decode_[d];
    router::InstanceLoad load{inst.sched->waiting_count(), inst.sched->active_count(),
                              inst.cache->blocks_used_count(), inst.cache->blocks_count()};
    RT_ASSERT(router_.update_load(decode_id(d), load).ok(), d);
  }
  if (work_pending_ > 0 || !in_flight_.empty()) {
    push(now_ns_ + to_ns(config_.load_report_interval_ms / 1e3), EventKind::load_report, 0, 0);
  }
}

void Sim::kick_prefill(uint32_t p) {
  PrefillInst& inst = prefill_[p];
  if (!nodes_[prefill_node(p)].alive) return;
  if (inst.sched->step_in_flight()) return;
  inst.sched->expire_holds(Nanos(now_ns_));
  std::optional<prefill::PrefillPlan> plan = inst.sched->plan_step();
  sync_prefill(p);
  if (!plan) return;
  RT_ASSERT(!plan->chunks.empty(), p);
  shapes_.clear();
  for (const prefill::PrefillChunk& c : plan->chunks) {
    shapes_.push_back({c.start_position, static_cast<uint32_t>(c.tokens.size())});
  }
  double step_s = devices::sim::prefill_time_s(config_.prefill_device, shapes_);
  if (fault_mode_) step_s *= slow_factor(prefill_node(p));
  if (!sites_.empty()) {  // the cost rule's compute rate: this step's tokens over its time
    double tokens = 0;
    for (const devices::sim::SeqShape& shape : shapes_) tokens += shape.new_tokens;
    inst.rates.computed(tokens, step_s);
  }
  inst.step_id = plan->step_id;
  ++inst.stats.steps_count;
  inst.stats.busy_s += step_s;
  push(now_ns_ + to_ns(step_s), EventKind::prefill_done, p, 0,
       nodes_[prefill_node(p)].incarnation);
}

void Sim::on_prefill_done(uint32_t p) {
  PrefillInst& inst = prefill_[p];
  std::vector<prefill::PrefillDone> done = inst.sched->on_step_done(inst.step_id, Nanos(now_ns_));
  for (prefill::PrefillDone& d : done) {
    if (!sites_.empty()) offer_tier2(p, d);  // write-behind, before anything else (the shell's order)
    const uint32_t i = request_of(d.request);
    ReqState& st = states_[i];
    bool current = !st.done && st.attempt == attempt_of(d.request) && st.at_prefill &&
                   st.prefill == static_cast<int32_t>(p);
    if (!current) {  // an abandoned attempt: drop it (the real decode would pull and discard)
      RT_ASSERT(inst.sched->cancel(d.request).ok(), d.request);
      continue;
    }
    const uint32_t dn = decode_node(st.decode);
    // The answer reaches decode only over a working link to the same incarnation; else the
    // hold waits for its timeout and decode for its prefill timeout or membership.
    if (fault_mode_ && (!linked(prefill_node(p), dn) ||
                        nodes_[dn].incarnation != st.decode_incarnation ||
                        lose(prefill_node(p), dn))) {
      continue;
    }
    st.at_prefill = false;
    st.cached_known = true;
    st.cached_tokens = d.cached_tokens_count;
    if (submit_decode(i, decode::KvSource::pull, std::move(d.prefix_hashes))) {
      kick_decode(st.decode);
    } else {
      RT_ASSERT(inst.sched->cancel(d.request).ok(), d.request);
    }
  }
  sync_prefill(p);
  kick_prefill(p);
}

// One transfer per pull order; transfers into one decode instance serialize on its link.
void Sim::start_pulls(uint32_t d, const std::vector<decode::PullOrder>& pulls) {
  DecodeInst& inst = decode_[d];
  const uint64_t bt = config_.block_tokens;
  for (const decode::PullOrder& order : pulls) {
    uint64_t prompt_tokens = result_.timelines[request_of(order.seq)].prompt_tokens;
    uint64_t tokens = 0;
    for (uint32_t k : order.pull_block_indexes) {
      RT_ASSERT(uint64_t{k} * bt < prompt_tokens, k, prompt_tokens);
      tokens += std::min(bt, prompt_tokens - uint64_t{k} * bt);
    }
    auto bytes =
        static_cast<uint64_t>(static_cast<double>(tokens) *
                              config_.prefill_device.kv_bytes_per_token);
    auto source = inst.pull_sources.find(order.seq);
    RT_ASSERT(source != inst.pull_sources.end(), order.seq);
    source->second.blocks = static_cast<uint32_t>(order.pull_block_indexes.size());
    // The sim asks decode to pull only once prefill answered; a prefill instance restarted
    // since then counts as a failed prefill: the pull fails at once (pd_policy pull_start).
    bool prefill_failed =
        nodes_[prefill_node(source->second.prefill)].incarnation != source->second.incarnation;
    if (decode::pull_start(true, false, prefill_failed, false, true, true) ==
        decode::PullStart::fail) {
      push(now_ns_, EventKind::pull_done, d, order.seq, nodes_[decode_node(d)].incarnation);
      continue;
    }
    result_.kv_transfer_bytes += bytes;
    double delay_s =
        fault_mode_ ? delay_ms(prefill_node(source->second.prefill), decode_node(d)) / 1e3 : 0;
    int64_t start_ns = std::max(now_ns_, inst.link_free_ns);
    inst.link_free_ns = start_ns + to_ns(static_cast<double>(bytes) / config_.link_bytes_per_s);
    push(inst.link_free_ns + to_ns(delay_s), EventKind::pull_done, d, order.seq,
         nodes_[decode_node(d)].incarnation);
  }
}

void Sim::kick_decode(uint32_t d) {
  DecodeInst& inst = decode_[d];
  if (!nodes_[decode_node(d)].alive) return;
  if (inst.sched->step_in_flight()) return;
  inst.sched->plan_step(inst.plan);  // reuses the previous plan's buffers
  const decode::DecodePlan& plan = inst.plan;
  start_pulls(d, plan.pulls);
  inst.stats.preemptions_count += plan.preempted.size();
  sync_decode(d);
  if (plan.entries.empty()) return;
  shapes_.clear();
  prefill_shapes_.clear();
  inst.sampled_count = 0;
  for (const decode::DecodeEntry& e : plan.entries) {
    devices::sim::SeqShape shape{e.start_position, static_cast<uint32_t>(e.tokens.size())};
    bool running = inst.sched->stage(e.seq) == decode::SeqStage::running;
    (running ? shapes_ : prefill_shapes_).push_back(shape);
    ReqState& st = states_[request_of(e.seq)];
    if (!running && !st.cached_known) {  // a local prefill's first chunk starts after the hit
      st.cached_known = true;
      st.cached_tokens = e.start_position;
    }
    if (e.sample) {  // reuse the entries' token vectors: no allocation once warm
      if (inst.sampled_count == inst.sampled.size()) inst.sampled.emplace_back();
      inst.sampled[inst.sampled_count].seq = e.seq;
      auto& tokens = inst.sampled[inst.sampled_count].tokens;
      tokens.clear();
      // Drafts: accepted in order, each with probability spec_acceptance; then the target's.
      for (uint32_t i = 0; i < e.draft_tokens_count; ++i) {
        uint64_t draw = devices::sim::mix64(config_.seed ^ (e.seq * 0x9e3779b97f4a7c15ull) ^
                                            (plan.step_id << 8) ^ i);
        if (double(draw >> 11) * 0x1.0p-53 >= config_.spec_acceptance) break;
        tokens.push_back(e.tokens[1 + i]);
      }
      if (e.draft_tokens_count > 0) {
        ++inst.stats.spec_drafts_count;
        inst.stats.spec_draft_tokens_count += e.draft_tokens_count;
        inst.stats.spec_accepted_tokens_count += tokens.size();
      }
      tokens.push_back(1);
      ++inst.sampled_count;
    }
  }
  // A mixed step runs its decode tokens and its prefill chunks as two passes.
  double step_s = 0;
  if (!shapes_.empty()) step_s += devices::sim::decode_step_time_s(config_.decode_device, shapes_);
  if (!prefill_shapes_.empty()) {
    step_s += devices::sim::prefill_time_s(config_.decode_device, prefill_shapes_);
  }
  step_s += inst.draft_s;  // eagle3: the draft model ran between the steps
  inst.draft_s = 0;
  RT_ASSERT(step_s > 0, step_s);
  if (fault_mode_) step_s *= slow_factor(decode_node(d));
  inst.step_id = plan.step_id;
  ++inst.stats.steps_count;
  inst.stats.busy_s += step_s;
  push(now_ns_ + to_ns(step_s), EventKind::decode_done, d, 0, nodes_[decode_node(d)].incarnation);
}

// What decode instance d streams for one sequence: to the gateway, over their link.
void Sim::apply_update(uint32_t d, const decode::SeqUpdate& update) {
  const uint32_t i = request_of(update.seq);
  RT_ASSERT(i < states_.size(), i);
  DecodeInst& inst = decode_[d];
  if (update.finished) inst.pull_sources.erase(update.seq);
  ReqState& st = states_[i];
  if (st.done || st.attempt != attempt_of(update.seq) || st.decode != d) return;  // ignored
  if (update.tokens.empty() && !update.finished) return;
  const uint32_t dn = decode_node(d);
  if (fault_mode_ && (!linked(dn, 0) || lose(dn, 0))) {
    // Not sent: decode cancels the stream and owes the gateway an error (on_events_lost).
    ++result_.fault_counters.lost_streams;
    if (!update.finished) (void)inst.sched->cancel(update.seq);
    if (!inst.sched->stage(update.seq)) inst.pull_sources.erase(update.seq);
    if (linked(dn, 0) && !lose(dn, 0)) {
      push(now_ns_, EventKind::gateway_error, d, update.seq);
    } else {
      inst.lost.push(LostItem{update.seq});
    }
    return;
  }
  workload::RequestTimeline& t = result_.timelines[i];
  if (!update.tokens.empty()) {
    t.chunk_ms.push_back(now_ms());
    t.output_tokens += static_cast<uint32_t>(update.tokens.size());
    st.tokens_sent += static_cast<uint32_t>(update.tokens.size());
    st.last_activity_ns = now_ns_;
  }
  if (!update.finished) return;
  if (*update.finished == decode::FinishReason::max_tokens) {
    RT_ASSERT(t.output_tokens == requests_[i].expected_output_tokens, t.output_tokens);
    if (config_.bugs.leak_block && !inst.leaked) {  // test-only: a block never released
      inst.leaked = inst.cache->acquire({}, 1).ok();
    }
    if (config_.bugs.drop_end && !dropped_once_) {  // test-only: the end is lost
      dropped_once_ = true;
      in_flight_.erase(i);
      return;
    }
    bool twice = config_.bugs.double_end && result_.completed_count == 0;
    finish(i, "");
    if (twice) finish(i, "");
  } else {
    // Decode ended the sequence itself (failed, cancelled, context): the gateway fails it.
    finish(i, "decode_" + std::string(decode::to_string(*update.finished)));
  }
}

void Sim::on_decode_done(uint32_t d) {
  DecodeInst& inst = decode_[d];
  inst.sched->on_step_result(
      inst.step_id, std::span<const decode::SampledTokens>(inst.sampled.data(), inst.sampled_count),
      inst.updates);
  for (const decode::SeqUpdate& u : inst.updates) apply_update(d, u);
  if (config_.spec.method == decode::SpecMethod::eagle3) model_drafts(d);
  kick_decode(d);
}

// eagle3: the draft model's tokens for the sequences that want them (their values do not
// matter: acceptance is a coin), and its cost: per asked token, one decoder layer's share of
// a decode step of the asking sequences.
void Sim::model_drafts(uint32_t d) {
  DecodeInst& inst = decode_[d];
  inst.sched->model_draft_wants(inst.draft_wants);
  if (inst.draft_wants.empty()) return;
  uint32_t tokens_max = 0;
  shapes_.clear();
  for (const auto& want : inst.draft_wants) {
    inst.sched->set_model_drafts(want.seq, std::vector<decode::TokenId>(want.tokens, 1));
    tokens_max = std::max(tokens_max, want.tokens);
    shapes_.push_back({0, 1});
  }
  const double layer_share = 1.0 / std::max<uint32_t>(config_.decode_device.layers, 1);
  inst.draft_s += tokens_max * layer_share *
                  devices::sim::decode_step_time_s(config_.decode_device, shapes_);
}

// A pull's reads ended: each block read fails on a broken link or by loss, and all fail if
// the prefill instance restarted meanwhile (pd_policy PullReads); the hold is released when
// prefill can be told. A failed pull (or an expired hold) -> local prefill.
void Sim::on_pull_done(uint32_t d, uint64_t seq) {
  DecodeInst& inst = decode_[d];
  auto source_it = inst.pull_sources.find(seq);
  RT_ASSERT(source_it != inst.pull_sources.end(), seq);
  PullSource source = source_it->second;
  const uint32_t pn = prefill_node(source.prefill), dn = decode_node(d);
  const bool same = nodes_[pn].incarnation == source.incarnation;
  decode::PullReads reads;
  std::optional<bool> ok = reads.start(source.blocks);
  for (uint32_t k = 0; k < source.blocks; ++k) {
    bool read_ok = !fault_mode_ || (same && linked(pn, dn) && !lose(pn, dn));
    ok = reads.read_done(read_ok);
  }
  RT_ASSERT(ok.has_value(), seq);
  bool pulled = *ok;
  if (same && (!fault_mode_ || linked(dn, pn))) {
    // KvPullDone releases the hold either way; an expired hold means the KV is gone.
    pulled = prefill_[source.prefill].sched->pull_done(seq).ok() && pulled;
    sync_prefill(source.prefill);
  } else {
    pulled = false;
  }
  if (!pulled) ++result_.fault_counters.pull_failures;
  auto update = inst.sched->on_pull_done(seq, pulled, 1);
  RT_ASSERT(update.ok(), update.ok() ? "" : update.error().describe());
  if (!pulled && !update->finished) ++result_.fault_counters.fallbacks;
  apply_update(d, *update);
  if (same) kick_prefill(source.prefill);
  kick_decode(d);
}

// ---- tier 2 (issue 13) ----
// The flow of prefill_actor.cpp and kv_offload_actor.cpp, through the same pure cores: a
// prompt whose pool lacks blocks asks tier 2 when the cost rule says a read beats computing
// (its site: the router's remote copy, else its own node's); the site grants staging slots
// for the prefix it believes held (OffloadCore), reads them from its disk (pinned in the
// slot map, verified: a corrupt block or an I/O error is a miss and the corrupt entry is
// dropped) and answers; prefill reads the staged blocks into fresh pool blocks over its link,
// commits them to its prefix cache and only then submits the prompt, which finds them
// cached. Computed blocks are offered write-behind at each PrefillDone: the pool -> staging
// copy is not timed (the pool is not pinned for it); the disk write is, and a block becomes
// visible (and reported to the router) only when its write ended.

// The value of an active fault of `kind` on `node` (the largest), else 0.
double Sim::fault_value(FaultKind kind, uint32_t node) const {
  double v = 0;
  for (uint32_t a : active_) {
    if (faults_[a].kind == kind && fault_nodes_[a].first == node) v = std::max(v, faults_[a].value);
  }
  return v;
}

bool Sim::ask_tier2(uint32_t p, prefill::PrefillRequest& pr, int32_t named_site) {
  PrefillInst& inst = prefill_[p];
  auto& counters = result_.tier2;
  // Tier 2 holds whole blocks and partial ones: from the pool's whole-block hit, the blocks
  // after it, then the trailing partial one (the prefill shell's ask_tier2).
  const uint32_t k = inst.cache->sub_blocks_per_block();
  std::vector<kv::BlockHash> block_hashes = kv::block_hashes_of(pr.prefix_hashes, k);
  const prefill::Tier2Lack lack = prefill::tier2_lack(
      pr.prefix_hashes, k, inst.cache->match(pr.prefix_hashes), config_.tier2.sub_blocks);
  const uint32_t hit = lack.first;
  const uint32_t lacking = lack.positions();
  if (lacking == 0 || inst.tier2.size() >= config_.prefill_queue_max) return false;
  const uint32_t s = named_site >= 0 && static_cast<uint32_t>(named_site) < sites_.size()
                         ? static_cast<uint32_t>(named_site)
                         : p;
  const bool remote = s != p;
  prefill::Tier2Rates& rates = inst.rates.of(remote);
  ++rates.eligible_count;
  ++counters.eligible;
  uint32_t asked = 0;  // this instance's waits on this kind of source (the real shell's count)
  for (const auto& [other, w] : inst.tier2) asked += (w.site != p) == remote;
  const uint32_t ask = config_.bugs.no_cost_rule
                           ? lacking
                           : prefill::tier2_blocks_to_ask(lacking,
                                                          static_cast<uint64_t>(block_bytes_),
                                                          config_.block_tokens, rates, asked);
  if (ask == 0) {
    ++counters.declined;
    return false;
  }
  ++counters.lookups;
  counters.remote_lookups += remote;
  const uint64_t seq = pr.id;
  Tier2Wait w;
  w.site = s;
  w.site_incarnation = nodes_[prefill_node(s)].incarnation;
  w.core = std::move(pr);
  w.block_hashes = std::move(block_hashes);
  w.device_hit = hit;
  w.asked_blocks = ask;
  w.lacking = lacking;
  w.ask = prefill::tier2_ask(w.core.prefix_hashes, k, lack, ask);
  w.gain_min = partial_gain_min(rates, k);
  w.budget_s = prefill::tier2_budget_s(ask, config_.block_tokens, rates);
  w.sent_ns = now_ns_;
  inst.tier2.emplace(seq, std::move(w));
  const uint32_t pn = prefill_node(p), sn = prefill_node(s);
  if (!fault_mode_ || (linked(pn, sn) && !lose(pn, sn))) {  // else lost: the wait times out
    push(now_ns_ + to_ns(config_.tier2.lookup_rtt_ms / 2e3), EventKind::tier2_lookup, p, seq,
         nodes_[pn].incarnation);
  }
  return true;
}

void Sim::on_tier2_lookup(uint32_t p, uint64_t seq) {
  auto it = prefill_[p].tier2.find(seq);
  if (it == prefill_[p].tier2.end()) return;  // the asker gave up or restarted meanwhile
  const Tier2Wait& w = it->second;
  const uint32_t sn = prefill_node(w.site);
  if (!nodes_[sn].alive || nodes_[sn].incarnation != w.site_incarnation) return;  // lost
  Tier2Site& site = sites_[w.site];
  if (site.lookups.count(seq)) return;  // a duplicate (cannot happen: one wait per seq)
  // Only what the disk can read, behind its queue, before computing would have ended (as the
  // real kv-offload: no limit until it measured its disk).
  const double read_rate = site.disk_measured ? config_.tier2.read_bytes_per_s : 0.0;
  const double queued_bytes = static_cast<double>(std::max<int64_t>(0, site.disk_free_ns - now_ns_)) /
                              1e9 * config_.tier2.read_bytes_per_s;
  const uint32_t within =
      config_.bugs.no_lookup_budget
          ? w.asked_blocks
          : kv_offload::blocks_within_budget(w.asked_blocks, static_cast<uint64_t>(block_bytes_),
                                             w.budget_s, queued_bytes, read_rate);
  result_.tier2.over_budget_blocks += w.asked_blocks - within;
  std::vector<kv::BlockHash> asked = w.ask.block_hashes, sub = w.ask.sub_hashes;
  const uint32_t k = prefill_[p].cache->sub_blocks_per_block();
  kv_offload::truncate_ask(asked, sub, k, within);
  SiteLookup sl;
  sl.asker = p;
  if (w.budget_s > 0 && site.disk_measured) sl.deadline_ns = now_ns_ + to_ns(w.budget_s);
  auto grants = site.core->begin_lookup(tier2_key(p, seq), asked, Nanos(now_ns_),
                                        {sub, sub.empty() ? 1 : k, sub.empty() ? 0 : w.ask.held,
                                         w.gain_min});
  int64_t end_ns = now_ns_;
  if (!grants) {
    sl.refused = true;
    sl.read = true;
  } else if (!grants->empty()) {
    sl.grants = std::move(grants).value();
    const double io_error = fault_mode_ ? fault_value(FaultKind::ioerr, sn) : 0.0;
    double read_s = 0;
    for (const kv_offload::LookupGrant& g : sl.grants) {
      std::optional<kv::tier2::SlotIndex> slot = site.slots->find(g.hash);
      bool ok = slot.has_value();
      if (slot) {
        site.slots->pin(*slot);
        site.slots->touch(*slot, ++site.tick);
        read_s += block_bytes_ / config_.tier2.read_bytes_per_s;
        if (io_error > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < io_error) {
          ok = false;
          ++result_.tier2.read_errors;
        }
      }
      sl.pinned.push_back(slot);
      sl.read_ok.push_back(ok ? 1 : 0);
    }
    site.disk_free_ns = std::max(now_ns_, site.disk_free_ns) + to_ns(read_s);
    site.disk_measured |= read_s > 0;
    result_.tier2.disk_busy_s += read_s;
    end_ns = site.disk_free_ns;
  } else {
    sl.read = true;  // nothing believed held: a miss, answered at once
  }
  site.lookups.emplace(seq, std::move(sl));
  push(end_ns, EventKind::tier2_staged, w.site, seq, nodes_[sn].incarnation);
}

void Sim::on_tier2_staged(uint32_t s, uint64_t seq) {
  Tier2Site& site = sites_[s];
  auto it = site.lookups.find(seq);
  RT_ASSERT(it != site.lookups.end(), seq);  // a restart clears both (stale events dropped)
  SiteLookup& sl = it->second;
  const kv_offload::RequestKey key = tier2_key(sl.asker, seq);
  if (!sl.refused && !sl.grants.empty()) {
    std::optional<std::vector<kv_offload::LookupGrant>> staged;
    std::vector<uint8_t> corrupt_read(sl.grants.size(), 0);
    for (size_t k = 0; k < sl.grants.size(); ++k) {
      bool ok = sl.read_ok[k] != 0;
      if (sl.pinned[k]) {
        const kv::tier2::SlotIndex slot = *sl.pinned[k];
        const bool corrupt = site.corrupt[slot] != 0;
        if (ok && corrupt && !config_.bugs.serve_corrupt) {
          // The checksum fails: a miss; the entry is dropped and the router told.
          ok = false;
          kv::BlockHash hash = site.slots->hash(slot);
          if (site.slots->state(slot) == kv::tier2::SlotState::stored) (void)site.slots->drop(slot);
          site.core->note_removed(hash);
          router_.tier2_removed(s, std::span<const kv::BlockHash>(&hash, 1));
          ++result_.tier2.corrupt_dropped_blocks;
        }
        corrupt_read[k] = ok && corrupt;
        if (site.slots->unpin(*sl.pinned[k])) site.corrupt[slot] = 0;  // a doomed slot freed
      }
      auto done = site.core->lookup_read_done(key, sl.grants[k].position, ok);
      RT_ASSERT(done.ok(), done.ok() ? "" : done.error().describe());
      if (done->has_value()) staged = std::move(done).value();
    }
    RT_ASSERT(staged.has_value(), seq);
    sl.staged = static_cast<uint32_t>(staged->size());
    sl.corrupt_served.assign(corrupt_read.begin(), corrupt_read.begin() + sl.staged);
    result_.tier2.hit_blocks += sl.staged;
    if (sl.deadline_ns > 0 && now_ns_ > sl.deadline_ns + 1000) result_.tier2.late_blocks += sl.staged;
    result_.tier2.bytes_read += static_cast<uint64_t>(sl.staged * block_bytes_);
  }
  sl.read = true;
  const uint32_t asker = sl.asker;
  if (sl.refused || sl.staged == 0) site.lookups.erase(it);  // nothing staged, nothing held
  const uint32_t sn = prefill_node(s), pn = prefill_node(asker);
  if (!fault_mode_ || (linked(sn, pn) && !lose(sn, pn))) {
    push(now_ns_ + to_ns(config_.tier2.lookup_rtt_ms / 2e3), EventKind::tier2_reply, asker,
         seq, nodes_[pn].incarnation);
  }  // else the answer is lost: the asker times out, the staged hold expires (on_tick)
}

// The asker is done with the staged blocks (read, or no use): the site frees them.
void Sim::release_lookup(uint32_t s, uint64_t seq) {
  Tier2Site& site = sites_[s];
  auto it = site.lookups.find(seq);
  if (it == site.lookups.end() || !it->second.read) return;  // expired, restarted, or reading
  if (!it->second.refused && it->second.staged > 0) {
    (void)site.core->lookup_released(tier2_key(it->second.asker, seq));
  }
  site.lookups.erase(it);
}

void Sim::on_tier2_reply(uint32_t p, uint64_t seq) {
  PrefillInst& inst = prefill_[p];
  auto it = inst.tier2.find(seq);
  if (it == inst.tier2.end() || it->second.reading) {  // timed out meanwhile: free the staging
    for (uint32_t s = 0; s < sites_.size(); ++s) {
      auto l = sites_[s].lookups.find(seq);
      if (l != sites_[s].lookups.end() && l->second.asker == p) release_lookup(s, seq);
    }
    return;
  }
  Tier2Wait& w = it->second;
  Tier2Site& site = sites_[w.site];
  auto l = site.lookups.find(seq);
  const bool same = nodes_[prefill_node(w.site)].incarnation == w.site_incarnation;
  const uint32_t n = l != site.lookups.end() && same ? l->second.staged : 0;
  w.partial = n > 0 ? l->second.grants[n - 1].sub_blocks : 0;
  prefill::Tier2Rates& rates = inst.rates.of(w.site != p);
  if (!config_.bugs.no_disk_rate && site.disk_measured) {  // the answer reports the disk
    rates.read_bytes_per_s =
        prefill::at_most_disk(rates.read_bytes_per_s, config_.tier2.read_bytes_per_s);
  }
  if (n == 0) {
    rates.lookup_overhead_s = prefill::ewma(rates.lookup_overhead_s,
                                            static_cast<double>(now_ns_ - w.sent_ns) / 1e9);
    release_lookup(w.site, seq);
    return end_tier2_wait(p, seq);
  }
  // Fresh blocks for the staged ones, holding the pool's cached head of the prompt meanwhile.
  std::span<const kv::BlockHash> head(w.core.prefix_hashes.data(),
                                      size_t{w.device_hit} * inst.cache->sub_blocks_per_block());
  auto alloc = inst.cache->acquire(head, n, 0, kv::PrefixCache::Query::internal);
  if (!alloc.ok() || alloc->cached.size() < w.device_hit) {
    if (alloc.ok()) {
      inst.cache->release(alloc->cached);
      inst.cache->release(alloc->fresh);
    }
    release_lookup(w.site, seq);
    return end_tier2_wait(p, seq);
  }
  w.head = std::move(alloc->cached);
  w.fresh = std::move(alloc->fresh);
  w.reading = true;
  const double read_s = n * block_bytes_ / config_.link_bytes_per_s;
  inst.link_free_ns = std::max(now_ns_, inst.link_free_ns) + to_ns(read_s);
  push(inst.link_free_ns, EventKind::tier2_read_done, p, seq, nodes_[prefill_node(p)].incarnation);
}

void Sim::on_tier2_read_done(uint32_t p, uint64_t seq) {
  PrefillInst& inst = prefill_[p];
  auto it = inst.tier2.find(seq);
  RT_ASSERT(it != inst.tier2.end() && it->second.reading, seq);
  Tier2Wait& w = it->second;
  const uint32_t pn = prefill_node(p), sn = prefill_node(w.site);
  auto l = sites_[w.site].lookups.find(seq);
  const bool staged_there = l != sites_[w.site].lookups.end() &&
                            nodes_[sn].incarnation == w.site_incarnation;
  size_t loaded = 0;
  while (staged_there && loaded < w.fresh.size() &&
         (!fault_mode_ || (linked(pn, sn) && !lose(pn, sn)))) {
    ++loaded;
  }
  uint64_t loaded_sub_blocks = 0;
  kv::PrefixHashes q{w.core.prefix_hashes, inst.cache->sub_blocks_per_block()};
  for (size_t k = 0; k < loaded; ++k) {
    if (l->second.corrupt_served[k]) {
      return violate(inst.stats.name + " loaded a corrupt block from tier 2 (" +
                     nodes_[sn].name + "'s store served it without a passing checksum)");
    }
    const bool partial = w.partial > 0 && k + 1 == w.fresh.size();
    const uint32_t n = partial ? w.partial : q.k;
    // What is read is what the prompt asked: a block of its chain (a foreign one never is).
    const kv::BlockHash& got = l->second.grants[k].hash;
    if (got != q.q[q.k * (w.device_hit + k) + n - 1]) {
      return violate(inst.stats.name + " loaded a block from tier 2 that is not its prompt's");
    }
    (void)inst.cache->commit(w.fresh[k], q.slots(w.device_hit + k, n), q.parent(w.device_hit + k));
    loaded_sub_blocks += n;
    result_.tier2.loaded_partial_blocks += partial;
  }
  inst.cache->release(w.fresh);  // committed ones stay cached (evictable), the rest are free
  inst.cache->release(w.head);
  w.head.clear();
  w.fresh.clear();
  result_.tier2.loaded_blocks += loaded;
  result_.tier2.loaded_tokens += loaded_sub_blocks * (config_.block_tokens / q.k);
  if (loaded > 0) {
    double seconds = std::max(static_cast<double>(now_ns_ - w.sent_ns) / 1e9, 1e-9);
    prefill::Tier2Rates& rates = inst.rates.of(w.site != p);
    rates.read_bytes_per_s = prefill::ewma(rates.read_bytes_per_s, loaded * block_bytes_ / seconds);
  }
  const bool again = w.asked_blocks < w.lacking && w.partial == 0 &&
                     loaded == w.asked_blocks;  // a probe that read all it asked for
  if (staged_there) release_lookup(w.site, seq);
  end_tier2_wait(p, seq, again);
}

// The wait is over: the prompt goes to the scheduler, unless its attempt was abandoned. A
// probe that read all it asked for first asks for the rest (the prefill shell's `again`).
void Sim::end_tier2_wait(uint32_t p, uint64_t seq, bool again) {
  PrefillInst& inst = prefill_[p];
  auto it = inst.tier2.find(seq);
  RT_ASSERT(it != inst.tier2.end(), seq);
  RT_ASSERT(it->second.head.empty() && it->second.fresh.empty(), seq);
  prefill::PrefillRequest core = std::move(it->second.core);
  const uint32_t site = it->second.site;
  inst.tier2.erase(it);
  const uint32_t i = request_of(seq);
  const ReqState& st = states_[i];
  if (st.done || st.attempt != attempt_of(seq) || !st.at_prefill ||
      st.prefill != static_cast<int32_t>(p)) {
    return;
  }
  if (again && ask_tier2(p, core, static_cast<int32_t>(site))) return;
  submit_prefill(p, std::move(core));
}

// Write-behind of a finished prompt's full blocks to its node's tier 2.
void Sim::offer_tier2(uint32_t p, const prefill::PrefillDone& done) {
  const uint32_t k = prefill_[p].cache->sub_blocks_per_block();
  const std::vector<kv::BlockHash> hashes = prefill::tier2_offer_hashes(
      done, k, config_.tier2.sub_blocks ? partial_gain_min(prefill_[p].rates.of(false), k) : k);
  const size_t full = std::min(hashes.size(), done.block_table.size());
  if (full == 0) return;
  Tier2Site& site = sites_[p];
  result_.tier2.offered_blocks += full;
  const kv_offload::OffloadCounters before = site.core->counters();
  auto grants = site.core->begin_store(tier2_key(p, done.request),
                                       std::span<const kv::BlockHash>(hashes.data(), full));
  const kv_offload::OffloadCounters& after = site.core->counters();
  result_.tier2.store_dropped_blocks += after.store_dropped_blocks - before.store_dropped_blocks;
  result_.tier2.offered_held_blocks += after.store_known_blocks - before.store_known_blocks;
  if (!grants || grants->empty()) return;
  std::optional<std::vector<kv_offload::StoreWrite>> writes;
  for (const kv_offload::StoreGrant& g : *grants) {
    auto r = site.core->store_read_done(tier2_key(p, done.request), g.slot, true);
    RT_ASSERT(r.ok(), r.ok() ? "" : r.error().describe());
    if (r->has_value()) writes = std::move(r).value();
  }
  RT_ASSERT(writes.has_value(), done.request);
  const double write_s = block_bytes_ / config_.tier2.write_bytes_per_s;
  for (const kv_offload::StoreWrite& wr : *writes) {
    site.writes.emplace(wr.slot, wr.hash);
    site.disk_free_ns = std::max(now_ns_, site.disk_free_ns) + to_ns(write_s);
    result_.tier2.disk_busy_s += write_s;
    push(site.disk_free_ns, EventKind::tier2_written, p, wr.slot,
         nodes_[prefill_node(p)].incarnation);
  }
}

// A block's disk write ended: durable, then indexed and visible (the store's order), then the
// router hears of it. A torn write (fault) is indexed but fails its checksum when read.
void Sim::on_tier2_written(uint32_t s, kv_offload::Slot staging) {
  Tier2Site& site = sites_[s];
  auto it = site.writes.find(staging);
  RT_ASSERT(it != site.writes.end(), staging);
  const kv::BlockHash hash = it->second;
  site.writes.erase(it);
  if (site.slots->find(hash)) {  // held already (a restart's snapshot raced the offer)
    RT_ASSERT(site.core->store_written(staging, true).ok(), staging);
    return;
  }
  auto reserved = site.slots->reserve(hash);
  if (!reserved) {  // every slot pinned or being written: the block is dropped
    RT_ASSERT(site.core->store_written(staging, false).ok(), staging);
    ++result_.tier2.store_dropped_blocks;
    return;
  }
  if (reserved->evicted) {
    site.core->note_removed(reserved->evicted->hash);
    router_.tier2_removed(s, std::span<const kv::BlockHash>(&reserved->evicted->hash, 1));
    ++result_.tier2.evicted_blocks;
  }
  kv::tier2::SlotMeta meta;
  meta.length_bytes = 1;
  meta.generation = ++site.generation;
  meta.last_use_tick = ++site.tick;
  site.slots->commit(reserved->slot, meta);
  const double torn = fault_mode_ ? fault_value(FaultKind::torn, prefill_node(s)) : 0.0;
  site.corrupt[reserved->slot] =
      torn > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < torn ? 1 : 0;
  RT_ASSERT(site.core->store_written(staging, true).ok(), staging);
  ++result_.tier2.stored_blocks;
  result_.tier2.bytes_written += static_cast<uint64_t>(block_bytes_);
  (void)router_.tier2_stored(s, std::span<const kv::BlockHash>(&hash, 1));
}

// The gateway hears that the request's attempt failed: the retry policy decides.
void Sim::gateway_failure(uint32_t request_index, ErrorKind kind, const std::string& label) {
  ReqState& st = states_[request_index];
  if (st.done) return;
  gateway::RetryDecision decision =
      config_.bugs.no_retry ? gateway::RetryDecision{}
                            : gateway::decide_retry(kind, st.tokens_sent, st.retries_left);
  if (decision.retry) {
    --st.retries_left;
    ++st.attempt;
    ++result_.fault_counters.retries;
    return route(request_index);  // the old attempt is not cancelled (as the real gateway)
  }
  cancel_attempt(request_index);
  finish(request_index, label, kind);
}

// The gateway's fail(): Cancel to the decode instance, which cancels at prefill.
void Sim::cancel_attempt(uint32_t request_index) {
  ReqState& st = states_[request_index];
  const uint64_t seq = seq_id(request_index, st.attempt);
  const uint32_t dn = decode_node(st.decode);
  if (!st.routed || !linked(0, dn) || nodes_[dn].incarnation != st.decode_incarnation) return;
  if (decode_[st.decode].sched->stage(seq)) {
    (void)decode_[st.decode].sched->cancel(seq);
    if (decode_[st.decode].sched->stage(seq) != decode::SeqStage::pulling) {
      decode_[st.decode].pull_sources.erase(seq);
    }
    sync_decode(st.decode);
    kick_decode(st.decode);
  }
  if (st.at_prefill && st.prefill >= 0) {
    const auto p = static_cast<uint32_t>(st.prefill);
    if (linked(dn, prefill_node(p)) &&
        nodes_[prefill_node(p)].incarnation == st.prefill_incarnation &&
        prefill_[p].sched->stage(seq)) {
      RT_ASSERT(prefill_[p].sched->cancel(seq).ok(), seq);
      sync_prefill(p);
      kick_prefill(p);
    }
  }
}

// ---- faults ----

bool Sim::partitioned(uint32_t a, uint32_t b) const {
  for (uint32_t f : active_) {
    const Fault& fault = faults_[f];
    if (fault.kind != FaultKind::partition) continue;
    auto [x, y] = fault_nodes_[f];
    if ((x == a && y == b) || (x == b && y == a)) return true;
  }
  return false;
}

bool Sim::linked(uint32_t a, uint32_t b) const {
  return nodes_[a].alive && nodes_[b].alive && !partitioned(a, b);
}

bool Sim::lose(uint32_t a, uint32_t b) {
  double keep = 1;
  for (uint32_t f : active_) {
    const Fault& fault = faults_[f];
    if (fault.kind != FaultKind::loss) continue;
    auto [x, y] = fault_nodes_[f];
    if ((x == a && y == b) || (x == b && y == a)) keep *= 1 - fault.value;
  }
  if (keep >= 1) return false;
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53 >= keep;
}

double Sim::delay_ms(uint32_t a, uint32_t b) const {
  double ms = 0;
  for (uint32_t f : active_) {
    const Fault& fault = faults_[f];
    if (fault.kind != FaultKind::delay) continue;
    auto [x, y] = fault_nodes_[f];
    if ((x == a && y == b) || (x == b && y == a)) ms += fault.value;
  }
  return ms;
}

double Sim::slow_factor(uint32_t node) const {
  double factor = 1;
  for (uint32_t f : active_) {
    if (faults_[f].kind == FaultKind::slow && fault_nodes_[f].first == node) {
      factor *= faults_[f].value;
    }
  }
  return factor;
}

int64_t Sim::hang_end_ns(uint32_t node) const {
  int64_t until = 0;
  for (uint32_t f : active_) {
    const Fault& fault = faults_[f];
    if (fault.kind == FaultKind::hang && fault_nodes_[f].first == node) {
      until = std::max(until, fault_end_ns_[f]);
    }
  }
  return until;
}

void Sim::on_fault(uint32_t index, bool begin) {
  const Fault& f = faults_[index];
  const uint32_t node = fault_nodes_[index].first;
  if (begin) {
    active_.push_back(index);
  } else {
    active_.erase(std::find(active_.begin(), active_.end(), index));
  }
  if (f.kind == FaultKind::crash) {
    RT_ASSERT(node >= 2, node);
    const bool prefill = node < 2 + config_.prefill_count;
    const uint32_t k = prefill ? node - 2 : node - 2 - config_.prefill_count;
    if (begin && nodes_[node].alive) {
      // The process dies with its KV, queues and sequences; it comes back empty.
      nodes_[node].alive = false;
      ++nodes_[node].incarnation;
      ++result_.fault_counters.crashes;
      if (prefill) {
        reset_prefill(k);
        if (!sites_.empty()) reset_site(k);  // its tier 2's index survives; staging does not
      } else {
        reset_decode(k);
      }
      // An observer that dies forgets what it knew of its peers.
      for (Detector& det : detectors_) {
        if (det.observer == node) {
          det.down = false;
          det.unreachable_since = -1;
          det.restart_pending = false;
        }
      }
    } else if (!begin && !nodes_[node].alive) {
      bool still_down = false;  // an overlapping crash keeps it down
      for (uint32_t a : active_) still_down |= faults_[a].kind == FaultKind::crash &&
                                               fault_nodes_[a].first == node;
      if (!still_down) {
        nodes_[node].alive = true;
        ++result_.fault_counters.restarts;
        for (Detector& det : detectors_) {
          if (det.observer == node) det.seen_incarnation = nodes_[det.peer].incarnation;
        }
      }
    }
  }
  if (!begin && f.kind == FaultKind::hang) {  // progress resumes: let idle instances plan
    for (uint32_t p = 0; p < prefill_.size(); ++p) kick_prefill(p);
    for (uint32_t d = 0; d < decode_.size(); ++d) kick_decode(d);
  }
  evaluate_detectors();
}

// Membership: an observer declares a peer down after detect_ns_ without contact, up again
// one heartbeat after contact returns, and restarted (down, then up) when it hears a new
// incarnation.
void Sim::evaluate_detectors() {
  for (uint32_t k = 0; k < detectors_.size(); ++k) {
    Detector& det = detectors_[k];
    if (!nodes_[det.observer].alive) continue;
    bool reachable = linked(det.observer, det.peer);
    if (!reachable && det.unreachable_since < 0) {
      det.unreachable_since = now_ns_;
      push(now_ns_ + detect_ns_, EventKind::detect_down, k,
           static_cast<uint64_t>(det.unreachable_since));
    } else if (reachable && det.unreachable_since >= 0) {
      det.unreachable_since = -1;
      if (det.down) push(now_ns_ + heartbeat_ns_, EventKind::detect_up, k, 0);
    }
    if (reachable && !det.down && !det.restart_pending &&
        det.seen_incarnation != nodes_[det.peer].incarnation) {
      det.restart_pending = true;
      push(now_ns_ + heartbeat_ns_, EventKind::detect_restart, k, 0);
    }
  }
}

void Sim::on_detect(uint32_t index, EventKind kind, int64_t since) {
  Detector& det = detectors_[index];
  if (!nodes_[det.observer].alive) return;
  const bool reachable = linked(det.observer, det.peer);
  if (kind == EventKind::detect_down) {
    if (det.unreachable_since != since || det.down) return;
    det.down = true;
    ++result_.fault_counters.detections;
    peer_down(det);
  } else if (kind == EventKind::detect_up) {
    if (!det.down || !reachable || det.unreachable_since >= 0) return;
    det.down = false;
    det.seen_incarnation = nodes_[det.peer].incarnation;
    peer_up(det);
  } else {
    det.restart_pending = false;
    if (!reachable || det.down || det.seen_incarnation == nodes_[det.peer].incarnation) return;
    det.seen_incarnation = nodes_[det.peer].incarnation;
    ++result_.fault_counters.detections;
    peer_down(det);
    peer_up(det);
  }
}

void Sim::peer_down(const Detector& det) {
  const uint32_t peer = det.peer;
  if (det.observer == 1) {  // the router excludes it (and forgets its prefix index)
    router_down_[peer] = true;
    if (!config_.bugs.router_not_told) RT_ASSERT(router_.set_up({peer - 2}, false).ok(), peer);
    // The router drops a lost node's tier-2 view (kv_sequence: node lost) until its snapshot.
    if (!sites_.empty() && peer < 2 + config_.prefill_count) router_.tier2_clear(peer - 2);
    return;
  }
  std::vector<uint32_t> affected;
  if (det.observer == 0) {  // the gateway: every request on that decode node failed
    for (uint32_t i : in_flight_) {
      const ReqState& st = states_[i];
      if (!st.done && st.routed && decode_node(st.decode) == peer) affected.push_back(i);
    }
    for (uint32_t i : affected) gateway_failure(i, ErrorKind::disconnected, "gateway_decode_down");
    return;
  }
  // A decode node: its requests waiting for that prefill node prefill locally.
  for (uint32_t i : in_flight_) {
    const ReqState& st = states_[i];
    if (!st.done && st.routed && st.at_prefill && decode_node(st.decode) == det.observer &&
        st.prefill >= 0 && prefill_node(static_cast<uint32_t>(st.prefill)) == peer) {
      affected.push_back(i);
    }
  }
  for (uint32_t i : affected) {
    if (states_[i].at_prefill) fallback_local(i);
  }
}

void Sim::peer_up(const Detector& det) {
  if (det.observer != 1) return;
  router_down_[det.peer] = false;
  RT_ASSERT(router_.set_up({det.peer - 2}, true).ok(), det.peer);
  // The router asks a node it hears again for its tier-2 snapshot (KvResync).
  if (!sites_.empty() && det.peer < 2 + config_.prefill_count) announce_site(det.peer - 2);
}

// The shells' 100 ms tick: prefill holds expire, decode's prefill timeouts, the gateway's
// no-progress timeout, and decode's lost-stream errors are re-sent.
void Sim::on_tick() {
  for (uint32_t p = 0; p < prefill_.size(); ++p) {
    if (!nodes_[prefill_node(p)].alive) continue;
    if (!prefill_[p].sched->expire_holds(Nanos(now_ns_)).empty()) sync_prefill(p);
    kick_prefill(p);
  }
  // Tier 2: lookups not answered in time are computed (a late answer is released when it
  // comes); staged blocks nobody released expire at their site.
  const int64_t lookup_timeout_ns = to_ns(config_.tier2.lookup_timeout_ms / 1e3);
  for (uint32_t p = 0; p < sites_.size(); ++p) {
    if (nodes_[prefill_node(p)].alive) {
      std::vector<uint64_t> late;
      for (const auto& [seq, w] : prefill_[p].tier2) {
        if (!w.reading && now_ns_ - w.sent_ns > lookup_timeout_ns) late.push_back(seq);
      }
      for (uint64_t seq : late) {
        ++result_.tier2.lookup_timeouts;
        end_tier2_wait(p, seq);
      }
      for (const kv_offload::RequestKey& key : sites_[p].core->expire(Nanos(now_ns_))) {
        sites_[p].lookups.erase(key.request);
      }
    }
  }
  std::vector<uint32_t> late_prefill, late_request;
  const int64_t timeout_ns = to_ns(config_.request_timeout_ms / 1e3);
  for (uint32_t i : in_flight_) {
    const ReqState& st = states_[i];
    if (st.done) continue;
    bool decode_alive = st.routed && nodes_[decode_node(st.decode)].alive &&
                        nodes_[decode_node(st.decode)].incarnation == st.decode_incarnation;
    if (st.at_prefill && decode_alive &&
        decode::prefill_timed_out(true, Nanos(now_ns_), Nanos(st.prefill_deadline_ns))) {
      late_prefill.push_back(i);
    }
    if (now_ns_ - st.last_activity_ns > timeout_ns) late_request.push_back(i);
  }
  for (uint32_t i : late_prefill) {
    if (!states_[i].at_prefill || states_[i].done) continue;
    ++result_.fault_counters.prefill_timeouts;
    fallback_local(i);
  }
  for (uint32_t i : late_request) {
    if (states_[i].done || now_ns_ - states_[i].last_activity_ns <= timeout_ns) continue;
    ++result_.fault_counters.request_timeouts;
    gateway_failure(i, ErrorKind::timed_out, "gateway_timed_out");
  }
  bool lost_left = false;
  for (uint32_t d = 0; d < decode_.size(); ++d) {
    const uint32_t dn = decode_node(d);
    if (!nodes_[dn].alive) continue;
    decode_[d].lost.retry(
        [&](const LostItem& item) {
          if (!linked(dn, 0) || lose(dn, 0)) return false;
          push(now_ns_, EventKind::gateway_error, d, item.seq);
          return true;
        },
        [](const LostItem&) {});
    lost_left |= !decode_[d].lost.empty();
  }
  bool held = false;
  for (const PrefillInst& p : prefill_) held |= p.sched->held_count() > 0;
  for (const Tier2Site& site : sites_) held |= !site.lookups.empty();  // until they expire
  if (work_pending_ > 0 || !in_flight_.empty() || held || lost_left) {
    push(now_ns_ + tick_ns_, EventKind::tick, 0, 0);
  }
}

// ---- invariants ----

void Sim::violate(const std::string& what) {
  if (!result_.violation.empty()) return;
  result_.violation = what;
  result_.violation_ms = now_ms();
  stopped_ = true;
}

// After every event: bounds of every queue and map.
void Sim::check_after_event() {
  if (stopped_) return;
  auto bound = [&](const std::string& what, size_t n, size_t max) {
    if (n > max) {
      violate(what + " holds " + std::to_string(n) + ", over its bound " + std::to_string(max));
    }
  };
  bound("the gateway's in-flight map", in_flight_.size(), config_.sessions_in_flight);
  bound("the event queue", events_.size(), events_max_);
  for (uint32_t p = 0; p < prefill_.size(); ++p) {
    const auto& s = *prefill_[p].sched;
    const std::string& name = prefill_[p].stats.name;
    bound(name + " queue", s.queued_count(), config_.prefill_queue_max);
    bound(name + " running", s.running_count(), config_.prefill_running_max);
    bound(name + " holds", s.held_count(), config_.prefill_held_max);
  }
  for (uint32_t d = 0; d < decode_.size(); ++d) {
    const DecodeInst& inst = decode_[d];
    const std::string& name = inst.stats.name;
    const size_t seqs_bound = size_t{config_.decode_waiting_max} + config_.decode_seqs_max;
    bound(name + " waiting", inst.sched->waiting_count(), seqs_bound);
    bound(name + " active", inst.sched->active_count(), config_.decode_seqs_max);
    bound(name + " lost streams", inst.lost.size(), inst.lost.capacity());
    bound(name + " pull sources", inst.pull_sources.size(), seqs_bound);
  }
}

// At the end: every request ended, and every KV pool is back at its baseline (no block
// referenced; what stays is cached and evictable).
void Sim::check_at_end() {
  for (uint32_t i = 0; i < states_.size(); ++i) {
    if (states_[i].sent && !states_[i].done) {
      return violate("request " + std::to_string(i) + " never ended");
    }
  }
  auto leak = [&](const std::string& name, uint32_t used, uint32_t a, uint32_t b) {
    if (used != 0 || a != 0 || b != 0) {
      violate("KV leak: " + name + " ends with " + std::to_string(used) +
              " referenced blocks (" + std::to_string(a) + " + " + std::to_string(b) +
              " requests still held)");
    }
  };
  for (const PrefillInst& p : prefill_) {
    leak(p.stats.name, p.cache->blocks_used_count(), p.sched->queued_count() +
         p.sched->running_count() + p.tier2.size(), p.sched->held_count());
  }
  if (config_.precise_index) {  // the index built from events equals every cache
    auto same = [&](router::InstanceId id, kv::PrefixCache& cache, const std::string& name) {
      apply_events(id, cache.drain_events());
      kv::CacheEvents all = cache.snapshot();
      size_t missing = 0;
      for (const auto& hash : all.stored) missing += !router_.holds(id, hash);
      if (missing > 0 || router_.index_blocks_count(id) != all.stored.size()) {
        violate("precise index: the router holds " +
                std::to_string(router_.index_blocks_count(id)) + " entries for " + name +
                ", whose cache holds " + std::to_string(all.stored.size()) + " (" +
                std::to_string(missing) + " of them missing)");
      }
      result_.precise_checked_entries += all.stored.size();
    };
    for (uint32_t p = 0; p < prefill_.size(); ++p) same({p}, *prefill_[p].cache, prefill_[p].stats.name);
    for (uint32_t d = 0; d < decode_.size(); ++d) same(decode_id(d), *decode_[d].cache, decode_[d].stats.name);
  }
  for (uint32_t s = 0; s < sites_.size(); ++s) {  // every staging slot back, nothing pinned
    const Tier2Site& site = sites_[s];
    const auto& counts = site.slots->counts();
    if (site.core->slots_free_count() != config_.tier2.staging_blocks || counts.pinned_count != 0 ||
        !site.writes.empty()) {
      violate("tier-2 leak: " + prefill_[s].stats.name + "'s node ends with " +
              std::to_string(config_.tier2.staging_blocks - site.core->slots_free_count()) +
              " staging slots taken, " + std::to_string(counts.pinned_count) +
              " store slots pinned, " + std::to_string(site.writes.size()) + " writes");
    }
    site.slots->check_invariants();
    site.core->check_invariants();
  }
  for (const DecodeInst& d : decode_) {
    leak(d.stats.name, d.cache->blocks_used_count(), d.sched->waiting_count(),
         d.sched->active_count());
  }
}

ClusterSimResult Sim::take_result() {
  ClusterSimResult r = std::move(result_);
  r.seed = config_.seed;
  r.mode = config_.prefill_count > 0 ? "pd" : "aggregated";
  r.tier2_enabled = !sites_.empty();
  r.policy = std::string(router::to_string(config_.router.policy));
  std::vector<workload::RequestTimeline> sent;
  sent.reserve(r.sent_count);
  for (size_t i = 0; i < states_.size(); ++i) {
    if (!states_[i].sent) continue;
    r.prompt_tokens_count += r.timelines[i].prompt_tokens;
    r.prompt_cached_tokens_count += states_[i].cached_tokens;
    sent.push_back(std::move(r.timelines[i]));
    r.sent_request_indexes.push_back(static_cast<uint32_t>(i));
  }
  RT_ASSERT(sent.size() == r.sent_count, sent.size(), r.sent_count);
  r.timelines = std::move(sent);
  r.hit_rate = r.prompt_tokens_count == 0 ? 0.0
                                          : static_cast<double>(r.prompt_cached_tokens_count) /
                                                static_cast<double>(r.prompt_tokens_count);
  for (PrefillInst& p : prefill_) {
    p.stats.computed_tokens_count = p.sched->counters().computed_tokens_count;
    p.stats.cached_tokens_count = p.sched->counters().cached_tokens_count;
    r.instances.push_back(p.stats);
  }
  for (DecodeInst& d : decode_) {
    d.stats.computed_tokens_count = d.sched->counters().prefill_tokens_count;
    d.stats.cached_tokens_count = d.cache->counters().hit_tokens_count;
    r.instances.push_back(d.stats);
  }
  return r;
}

}  // namespace

Result<ClusterSimResult> run_cluster_sim(const ClusterSimConfig& config,
                                         const std::vector<workload::Request>& requests) {
  if (Status s = config.validate(); !s) return s.error();
  decode::DecodeConfig dc = decode_config(config);
  if (Status s = dc.validate(pool_blocks(config, config.decode_device)); !s) {
    return make_error(ErrorKind::invalid, "sim: decode: " + s.error().message);
  }
  prefill::PrefillConfig pc{config.block_tokens,
                            config.prefill_queue_max,
                            config.prefill_running_max,
                            config.prefill_held_max,
                            config.prefill_step_tokens_max,
                            std::chrono::milliseconds(config.prefill_hold_timeout_ms)};
  if (Status s = pc.validate(); !s) {
    return make_error(ErrorKind::invalid, "sim: prefill: " + s.error().message);
  }
  if (Status s = router::validate(router_config(config)); !s) return s.error();
  // Faults: draw the random terms, then resolve every node name (an error names the term).
  std::vector<std::string> nodes = node_names(config);
  std::vector<std::string> instances(nodes.begin() + 2, nodes.end());
  if (!config.tier2.enabled) {  // tier-2 faults act on a tier 2: without one, say so
    for (FaultKind k : {FaultKind::ioerr, FaultKind::torn}) {
      bool named = config.faults.random_per_s[static_cast<int>(k)] > 0;
      for (const Fault& f : config.faults.faults) named |= f.kind == k;
      if (named) {
        return make_error(ErrorKind::invalid, "--faults: " + std::string(to_string(k)) +
                                                  " faults act on tier 2, which is off "
                                                  "(--tier2 on, or [kv_offload] enabled)");
      }
    }
  }
  std::vector<Fault> faults =
      expand_faults(config.faults, instances, nodes, config.duration_ms, config.seed);
  std::vector<std::pair<uint32_t, uint32_t>> fault_nodes;
  auto resolve = [&](const std::string& name, uint32_t* out) {
    std::string n = name;
    if (config.prefill_count == 0 && n.rfind("decode-", 0) == 0) n = "instance-" + n.substr(7);
    auto it = std::find(nodes.begin(), nodes.end(), n);
    if (it == nodes.end()) return false;
    *out = static_cast<uint32_t>(it - nodes.begin());
    return true;
  };
  for (const Fault& f : faults) {
    uint32_t a = 0, b = 0;
    bool link = f.kind == FaultKind::partition || f.kind == FaultKind::loss ||
                f.kind == FaultKind::delay;
    if (!resolve(f.a, &a) || (link && !resolve(f.b, &b))) {
      return make_error(ErrorKind::invalid, "--faults: '" + describe(f) +
                                                "': no such node in this cluster (nodes: gateway, "
                                                "router, " + nodes[2] + " .. " + nodes.back() + ")");
    }
    if (!link && a < 2) {
      return make_error(ErrorKind::invalid, "--faults: '" + describe(f) +
                                                "': only instances crash, slow down or hang");
    }
    fault_nodes.emplace_back(a, b);
  }
  Sim sim(config, requests, faults, std::move(fault_nodes));
  if (Status s = sim.run(); !s) return s.error();
  ClusterSimResult result = sim.take_result();
  result.faults = describe(faults);
  auto summary = workload::summarize(result.timelines, {});
  if (!summary && result.violation.empty()) return summary.error();
  if (summary) result.summary = std::move(summary).value();
  return result;
}

namespace {

nlohmann::ordered_json stats_json(const workload::LatencyStats& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90},
          {"p99", s.p99},     {"min", s.min},   {"max", s.max}};
}

nlohmann::ordered_json summary_json(const workload::BenchSummary& s) {
  nlohmann::ordered_json j;
  j["requests"] = s.requests_count;
  j["succeeded"] = s.succeeded_count;
  j["failed"] = s.failed_count;
  j["duration_ms"] = s.duration_ms;
  j["request_throughput_per_s"] = s.request_throughput_per_s;
  j["output_token_throughput_per_s"] = s.output_token_throughput_per_s;
  j["ttft_ms"] = stats_json(s.ttft_ms);
  j["tpot_ms"] = stats_json(s.tpot_ms);
  j["itl_ms"] = stats_json(s.itl_ms);
  j["e2e_ms"] = stats_json(s.e2e_ms);
  j["errors_by_kind"] = s.errors_by_kind;
  nlohmann::ordered_json buckets = nlohmann::ordered_json::array();
  for (const workload::ContextBucket& b : s.ttft_by_context) {
    buckets.push_back({{"prompt_tokens_min", b.prompt_tokens_min},
                       {"prompt_tokens_max", b.prompt_tokens_max},
                       {"ttft_ms", stats_json(b.ttft_ms)}});
  }
  j["ttft_by_context"] = buckets;
  nlohmann::ordered_json turns = nlohmann::ordered_json::object();
  for (const auto& [turn, stats] : s.ttft_by_turn) turns[std::to_string(turn)] = stats_json(stats);
  j["ttft_by_turn"] = turns;
  return j;
}

}  // namespace

std::string to_json(const ClusterSimResult& r, bool with_timelines) {
  nlohmann::ordered_json j;
  j["seed"] = r.seed;
  j["mode"] = r.mode;
  j["policy"] = r.policy;
  j["sent"] = r.sent_count;
  j["completed"] = r.completed_count;
  j["failed"] = r.failed_count;
  j["failed_by_kind"] = r.failed_by_kind;
  j["events"] = r.events_count;
  j["simulated_ms"] = r.simulated_ms;
  j["prompt_tokens"] = r.prompt_tokens_count;
  j["prompt_cached_tokens"] = r.prompt_cached_tokens_count;
  j["hit_rate"] = r.hit_rate;
  if (r.precise_checked_entries > 0) j["precise_checked_entries"] = r.precise_checked_entries;
  j["kv_transfer_bytes"] = r.kv_transfer_bytes;
  j["pd_requests"] = r.pd_requests_count;
  if (r.tier2_enabled) {
    const auto& t = r.tier2;
    j["tier2"] = {{"eligible", t.eligible},
                  {"declined", t.declined},
                  {"lookups", t.lookups},
                  {"remote_lookups", t.remote_lookups},
                  {"lookup_timeouts", t.lookup_timeouts},
                  {"over_budget_blocks", t.over_budget_blocks},
                  {"late_blocks", t.late_blocks},
                  {"hit_blocks", t.hit_blocks},
                  {"loaded_blocks", t.loaded_blocks},
                  {"loaded_tokens", t.loaded_tokens},
                  {"loaded_partial_blocks", t.loaded_partial_blocks},
                  {"offered_blocks", t.offered_blocks},
                  {"offered_held_blocks", t.offered_held_blocks},
                  {"stored_blocks", t.stored_blocks},
                  {"store_dropped_blocks", t.store_dropped_blocks},
                  {"evicted_blocks", t.evicted_blocks},
                  {"corrupt_dropped_blocks", t.corrupt_dropped_blocks},
                  {"read_errors", t.read_errors},
                  {"bytes_read", t.bytes_read},
                  {"bytes_written", t.bytes_written},
                  {"disk_busy_s", t.disk_busy_s}};
  }
  j["summary"] = summary_json(r.summary);
  nlohmann::ordered_json instances = nlohmann::ordered_json::array();
  for (const InstanceStats& s : r.instances) {
    instances.push_back({{"name", s.name},
                         {"steps", s.steps_count},
                         {"busy_s", s.busy_s},
                         {"computed_tokens", s.computed_tokens_count},
                         {"cached_tokens", s.cached_tokens_count},
                         {"preemptions", s.preemptions_count},
                         {"spec_drafts", s.spec_drafts_count},
                         {"spec_draft_tokens", s.spec_draft_tokens_count},
                         {"spec_accepted_tokens", s.spec_accepted_tokens_count}});
  }
  j["instances"] = instances;
  if (!r.faults.empty() || !r.violation.empty()) {
    const auto& c = r.fault_counters;
    j["faults"] = {{"plan", r.faults},
                   {"crashes", c.crashes},
                   {"restarts", c.restarts},
                   {"detections", c.detections},
                   {"retries", c.retries},
                   {"fallbacks", c.fallbacks},
                   {"pull_failures", c.pull_failures},
                   {"prefill_timeouts", c.prefill_timeouts},
                   {"request_timeouts", c.request_timeouts},
                   {"lost_streams", c.lost_streams},
                   {"stale_events", c.stale_events}};
    j["violation"] = r.violation;
    j["violation_ms"] = r.violation_ms;
  }
  if (with_timelines) {
    nlohmann::ordered_json tl = nlohmann::ordered_json::array();
    for (const workload::RequestTimeline& t : r.timelines) {
      tl.push_back({{"send_ms", t.send_ms},
                    {"chunk_ms", t.chunk_ms},
                    {"end_ms", t.end_ms},
                    {"output_tokens", t.output_tokens},
                    {"prompt_tokens", t.prompt_tokens},
                    {"turn", t.turn},
                    {"error", t.error_kind}});
    }
    j["timelines"] = tl;
  }
  return j.dump(2) + "\n";
}

}  // namespace tandem::sim
