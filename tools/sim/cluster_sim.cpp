#include "tools/sim/cluster_sim.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <unordered_map>

#include "actors/decode/decode_scheduler.hpp"
#include "actors/prefill/prefill_scheduler.hpp"
#include "kvstore/hashing.hpp"
#include "kvstore/prefix_cache.hpp"
#include "runtime/base/assert.hpp"

namespace tandem::sim {

Status ClusterSimConfig::validate() const {
  auto bad = [](std::string what) { return make_error(ErrorKind::invalid, "sim: " + what); };
  if (decode_count < 1) return bad("decode_count must be >= 1");
  if (prefill_count + decode_count > 65536) return bad("at most 65536 instances");
  if (block_tokens < 1) return bad("block_tokens must be >= 1");
  if (!(link_bytes_per_s > 0)) return bad("link_bytes_per_s must be > 0");
  if (sessions_in_flight < 1) return bad("sessions_in_flight must be >= 1");
  if (!(duration_ms > 0)) return bad("duration_ms must be > 0");
  if (max_model_tokens < 2) return bad("max_model_tokens must be >= 2");
  if (!(load_report_interval_ms >= 0) || !std::isfinite(load_report_interval_ms)) {
    return bad("load_report_interval_ms must be finite and >= 0");
  }
  if (Status s = prefill_device.validate(); !s) {
    return bad("prefill device: " + s.error().message);
  }
  if (Status s = decode_device.validate(); !s) return bad("decode device: " + s.error().message);
  return {};
}

namespace {

using Nanos = std::chrono::nanoseconds;

enum class EventKind : uint8_t { send, prefill_done, decode_done, pull_done, load_report };

struct Event {
  int64_t t_ns = 0;
  uint64_t seq = 0;  // insertion order: breaks ties deterministically
  EventKind kind = EventKind::send;
  uint32_t target = 0;  // instance index (prefill or decode), unused for send
  uint64_t arg = 0;     // request index (send, pull_done)
};

struct Later {
  bool operator()(const Event& a, const Event& b) const {
    return a.t_ns != b.t_ns ? a.t_ns > b.t_ns : a.seq > b.seq;
  }
};

// A session's block-hash chain: hashes of every full block so far plus the open block.
struct Chain {
  std::vector<kv::BlockHash> hashes;
  std::vector<kv::TokenId> tail;  // < block_tokens tokens
  uint64_t tokens_count = 0;
  size_t segments_count = 0;  // leading segments of the last prompt already hashed
};

struct PrefillInst {
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<prefill::PrefillScheduler> sched;
  uint64_t step_id = 0;
  InstanceStats stats;
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
};

struct ReqState {
  uint32_t session_index = 0;  // into Sim::sessions_
  int32_t prefill = -1;        // prefill instance index, -1 = local prefill on decode
  uint32_t decode = 0;
  bool cached_known = false;
  bool sent = false;
  bool done = false;
  uint64_t cached_tokens = 0;
};

struct Session {
  std::vector<uint32_t> requests;  // request indexes in turn order
  uint32_t next_turn = 0;
  Chain chain;
};

class Sim {
 public:
  Sim(const ClusterSimConfig& config, const std::vector<workload::Request>& requests);
  Status run();
  ClusterSimResult take_result();

 private:
  void push(int64_t t_ns, EventKind kind, uint32_t target, uint64_t arg);
  Status build_sessions();
  void start_session(uint32_t session_index, int64_t t_ns);
  void schedule_next_turn(uint32_t session_index);
  Status hash_prompt(uint32_t request_index, Chain& chain);
  void extend(Chain& chain, std::span<const uint32_t> tokens);
  void on_send(uint32_t request_index);
  bool submit_decode(uint32_t request_index, decode::KvSource source,
                     std::vector<kv::BlockHash> hashes);
  void kick_prefill(uint32_t p);
  void kick_decode(uint32_t d);
  void on_prefill_done(uint32_t p);
  void on_decode_done(uint32_t d);
  void on_pull_done(uint32_t d, uint32_t request_index);
  void apply_update(const decode::SeqUpdate& update);
  void finish(uint32_t request_index, const std::string& error_kind);
  void sync_prefill(uint32_t p);
  void sync_decode(uint32_t d);
  void on_load_report();
  void start_pulls(uint32_t d, const std::vector<decode::PullOrder>& pulls);
  double now_ms() const { return static_cast<double>(now_ns_) / 1e6; }
  router::InstanceId decode_id(uint32_t d) const { return {config_.prefill_count + d}; }

  const ClusterSimConfig& config_;
  const std::vector<workload::Request>& requests_;
  router::RouterCore router_;
  kv::BlockHasher hasher_;
  std::vector<PrefillInst> prefill_;
  std::vector<DecodeInst> decode_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  uint64_t event_seq_ = 0;
  int64_t now_ns_ = 0;
  int64_t duration_ns_ = 0;
  std::vector<Session> sessions_;
  std::deque<uint32_t> sessions_waiting_;                       // not started yet, in start order
  std::map<std::pair<uint64_t, uint64_t>, Chain> base_chains_;  // (system, repo) -> chain
  std::vector<ReqState> states_;
  std::vector<uint32_t> scratch_tokens_;
  std::vector<devices::sim::SeqShape> shapes_, prefill_shapes_;
  ClusterSimResult result_;
};

kv::BlockHasher make_hasher(uint32_t block_tokens) {
  auto hasher = kv::BlockHasher::create({"tandem-sim", "sim", ""}, block_tokens);
  RT_ASSERT(hasher.ok(), hasher.ok() ? "" : hasher.error().describe());
  return std::move(hasher).value();
}

router::RouterConfig router_config(const ClusterSimConfig& c) {
  router::RouterConfig r = c.router;
  r.block_tokens = c.block_tokens;
  r.instances_max = std::max(r.instances_max, c.prefill_count + c.decode_count);
  return r;
}

uint32_t pool_blocks(const ClusterSimConfig& c, const devices::sim::SimParams& device) {
  if (c.kv_blocks > 0) return c.kv_blocks;
  double blocks = devices::sim::kv_capacity_tokens(device) / c.block_tokens;
  return static_cast<uint32_t>(std::clamp(blocks, 1.0, 16.0e6));
}

Sim::Sim(const ClusterSimConfig& config, const std::vector<workload::Request>& requests)
    : config_(config),
      requests_(requests),
      router_(router_config(config)),
      hasher_(make_hasher(config.block_tokens)) {
  RT_ASSERT(config.validate().ok());
  RT_ASSERT(config.decode_count >= 1);
  duration_ns_ = static_cast<int64_t>(config.duration_ms * 1e6);
  prefill::PrefillConfig pc{config.block_tokens,
                            config.prefill_queue_max,
                            config.prefill_running_max,
                            config.prefill_held_max,
                            config.prefill_step_tokens_max,
                            std::chrono::milliseconds(config.prefill_hold_timeout_ms)};
  decode::DecodeConfig dc{config.block_tokens, config.decode_waiting_max, config.decode_seqs_max,
                          config.decode_step_tokens_max, config.max_model_tokens};
  prefill_.resize(config.prefill_count);
  for (uint32_t p = 0; p < config.prefill_count; ++p) {
    prefill_[p].cache = std::make_unique<kv::PrefixCache>(
        pool_blocks(config, config.prefill_device), config.block_tokens);
    prefill_[p].sched = std::make_unique<prefill::PrefillScheduler>(pc, *prefill_[p].cache);
    prefill_[p].stats.name = "prefill-" + std::to_string(p);
    RT_ASSERT(router_.add_instance({p}, router::InstanceRole::prefill).ok(), p);
  }
  decode_.resize(config.decode_count);
  for (uint32_t d = 0; d < config.decode_count; ++d) {
    decode_[d].cache = std::make_unique<kv::PrefixCache>(
        pool_blocks(config, config.decode_device), config.block_tokens);
    decode_[d].sched = std::make_unique<decode::DecodeScheduler>(dc, *decode_[d].cache);
    decode_[d].stats.name =
        (config.prefill_count > 0 ? "decode-" : "instance-") + std::to_string(d);
    RT_ASSERT(router_.add_instance(decode_id(d), router::InstanceRole::decode).ok(), d);
  }
  for (uint32_t p = 0; p < config.prefill_count; ++p) sync_prefill(p);
  for (uint32_t d = 0; d < config.decode_count; ++d) sync_decode(d);
}

void Sim::push(int64_t t_ns, EventKind kind, uint32_t target, uint64_t arg) {
  RT_ASSERT(t_ns >= now_ns_, t_ns, now_ns_);
  events_.push(Event{t_ns, event_seq_++, kind, target, arg});
}

int64_t to_ns(double seconds) {
  RT_ASSERT(seconds >= 0, seconds);
  RT_ASSERT(std::isfinite(seconds), seconds);
  return static_cast<int64_t>(std::llround(seconds * 1e9));
}

// Groups requests into sessions (turn order) and queues the sessions by first arrival.
Status Sim::build_sessions() {
  std::unordered_map<uint32_t, uint32_t> index_of;  // session id -> index
  states_.resize(requests_.size());
  result_.timelines.resize(requests_.size());
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
  while (!events_.empty()) {
    Event e = events_.top();
    events_.pop();
    RT_ASSERT(e.t_ns >= now_ns_, e.t_ns, now_ns_);
    now_ns_ = e.t_ns;
    ++result_.events_count;
    switch (e.kind) {
      case EventKind::send:
        on_send(static_cast<uint32_t>(e.arg));
        break;
      case EventKind::prefill_done:
        on_prefill_done(e.target);
        break;
      case EventKind::decode_done:
        on_decode_done(e.target);
        break;
      case EventKind::pull_done:
        on_pull_done(e.target, static_cast<uint32_t>(e.arg));
        break;
      case EventKind::load_report:
        on_load_report();
        break;
    }
  }
  result_.simulated_ms = now_ms();
  RT_ASSERT(result_.sent_count == result_.completed_count + result_.failed_count,
            result_.sent_count, result_.completed_count, result_.failed_count);
  return {};
}

// Appends tokens to the chain, hashing every block they complete.
void Sim::extend(Chain& chain, std::span<const uint32_t> tokens) {
  const uint32_t bt = config_.block_tokens;
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

void Sim::finish(uint32_t request_index, const std::string& error_kind) {
  ReqState& st = states_[request_index];
  RT_ASSERT(!st.done, request_index);
  st.done = true;
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
  auto pick = router_.pick({s.chain.hashes, t.prompt_tokens});
  if (!pick) {
    finish(request_index, "router_" + std::string(to_string(pick.error().kind)));
    return;
  }
  st.decode = pick->decode.value - config_.prefill_count;
  RT_ASSERT(st.decode < decode_.size(), st.decode);
  if (!pick->prefill) {
    if (submit_decode(request_index, decode::KvSource::local, s.chain.hashes)) {
      kick_decode(st.decode);
    }
    return;
  }
  st.prefill = static_cast<int32_t>(pick->prefill->value);
  RT_ASSERT(st.prefill >= 0 && static_cast<uint32_t>(st.prefill) < prefill_.size(), st.prefill);
  ++result_.pd_requests_count;
  prefill::PrefillRequest pr;
  pr.id = request_index;
  pr.tokens.assign(t.prompt_tokens, 0);
  pr.block_hashes = s.chain.hashes;
  PrefillInst& p = prefill_[st.prefill];
  if (Status submitted = p.sched->submit(std::move(pr)); !submitted) {
    finish(request_index, "prefill_" + std::string(to_string(submitted.error().kind)));
    return;
  }
  kick_prefill(st.prefill);
}

bool Sim::submit_decode(uint32_t request_index, decode::KvSource source,
                        std::vector<kv::BlockHash> hashes) {
  ReqState& st = states_[request_index];
  decode::DecodeRequest dr;
  dr.id = request_index;
  // Capacity for the whole sequence: the scheduler keeps this vector as its token history.
  dr.prompt.reserve(result_.timelines[request_index].prompt_tokens +
                    requests_[request_index].expected_output_tokens);
  dr.prompt.assign(result_.timelines[request_index].prompt_tokens, 0);
  dr.block_hashes = std::move(hashes);
  dr.max_tokens = requests_[request_index].expected_output_tokens;
  dr.source = source;
  if (Status submitted = decode_[st.decode].sched->submit(std::move(dr)); !submitted) {
    finish(request_index, "decode_" + std::string(to_string(submitted.error().kind)));
    return false;
  }
  sync_decode(st.decode);
  return true;
}

// Reports an instance's evictions to the router at once, and its load either at once
// (load_report_interval_ms == 0) or at the next periodic report (on_load_report), as the
// real shells do: each reports its load every 100 ms, and pick()'s own waiting + 1 on the
// chosen instances lasts until then.
void Sim::sync_prefill(uint32_t p) {
  PrefillInst& inst = prefill_[p];
  kv::CacheEvents ev = inst.cache->drain_events();
  if (!ev.removed.empty()) RT_ASSERT(router_.kv_removed({p}, ev.removed).ok(), p);
  if (config_.load_report_interval_ms > 0) return;
  router::InstanceLoad load{inst.sched->queued_count(), inst.sched->running_count(),
                            inst.cache->blocks_used_count(), inst.cache->blocks_count()};
  RT_ASSERT(router_.update_load({p}, load).ok(), p);
}

void Sim::sync_decode(uint32_t d) {
  DecodeInst& inst = decode_[d];
  kv::CacheEvents ev = inst.cache->drain_events();
  if (!ev.removed.empty()) RT_ASSERT(router_.kv_removed(decode_id(d), ev.removed).ok(), d);
  if (config_.load_report_interval_ms > 0) return;
  router::InstanceLoad load{inst.sched->waiting_count(), inst.sched->active_count(),
                            inst.cache->blocks_used_count(), inst.cache->blocks_count()};
  RT_ASSERT(router_.update_load(decode_id(d), load).ok(), d);
}

// The periodic load report of every instance; repeats while anything else is pending.
void Sim::on_load_report() {
  RT_ASSERT(config_.load_report_interval_ms > 0, config_.load_report_interval_ms);
  for (uint32_t p = 0; p < prefill_.size(); ++p) {
    const PrefillInst& inst = prefill_[p];
    router::InstanceLoad load{inst.sched->queued_count(), inst.sched->running_count(),
                              inst.cache->blocks_used_count(), inst.cache->blocks_count()};
    RT_ASSERT(router_.update_load({p}, load).ok(), p);
  }
  for (uint32_t d = 0; d < decode_.size(); ++d) {
    const DecodeInst& inst = decode_[d];
    router::InstanceLoad load{inst.sched->waiting_count(), inst.sched->active_count(),
                              inst.cache->blocks_used_count(), inst.cache->blocks_count()};
    RT_ASSERT(router_.update_load(decode_id(d), load).ok(), d);
  }
  if (!events_.empty()) {
    push(now_ns_ + to_ns(config_.load_report_interval_ms / 1e3), EventKind::load_report, 0, 0);
  }
}

void Sim::kick_prefill(uint32_t p) {
  PrefillInst& inst = prefill_[p];
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
  inst.step_id = plan->step_id;
  ++inst.stats.steps_count;
  inst.stats.busy_s += step_s;
  push(now_ns_ + to_ns(step_s), EventKind::prefill_done, p, 0);
}

void Sim::on_prefill_done(uint32_t p) {
  PrefillInst& inst = prefill_[p];
  std::vector<prefill::PrefillDone> done = inst.sched->on_step_done(inst.step_id, Nanos(now_ns_));
  for (prefill::PrefillDone& d : done) {
    auto request_index = static_cast<uint32_t>(d.request);
    ReqState& st = states_[request_index];
    RT_ASSERT(st.prefill == static_cast<int32_t>(p), st.prefill, p);
    st.cached_known = true;
    st.cached_tokens = d.cached_tokens_count;
    if (submit_decode(request_index, decode::KvSource::pull, std::move(d.block_hashes))) {
      kick_decode(st.decode);
    } else {
      RT_ASSERT(inst.sched->cancel(d.request).ok(), d.request);
    }
  }
  kick_prefill(p);
}

// One transfer per pull order; transfers into one decode instance serialize on its link.
void Sim::start_pulls(uint32_t d, const std::vector<decode::PullOrder>& pulls) {
  DecodeInst& inst = decode_[d];
  const uint64_t bt = config_.block_tokens;
  for (const decode::PullOrder& order : pulls) {
    uint64_t prompt_tokens = result_.timelines[order.seq].prompt_tokens;
    uint64_t tokens = 0;
    for (uint32_t k : order.pull_block_indexes) {
      RT_ASSERT(uint64_t{k} * bt < prompt_tokens, k, prompt_tokens);
      tokens += std::min(bt, prompt_tokens - uint64_t{k} * bt);
    }
    auto bytes =
        static_cast<uint64_t>(static_cast<double>(tokens) *
                              config_.prefill_device.kv_bytes_per_token);
    result_.kv_transfer_bytes += bytes;
    int64_t start_ns = std::max(now_ns_, inst.link_free_ns);
    inst.link_free_ns = start_ns + to_ns(static_cast<double>(bytes) / config_.link_bytes_per_s);
    push(inst.link_free_ns, EventKind::pull_done, d, order.seq);
  }
}

void Sim::kick_decode(uint32_t d) {
  DecodeInst& inst = decode_[d];
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
    ReqState& st = states_[e.seq];
    if (!running && !st.cached_known) {  // a local prefill's first chunk starts after the hit
      st.cached_known = true;
      st.cached_tokens = e.start_position;
    }
    if (e.sample) {  // reuse the entries' token vectors: no allocation once warm
      if (inst.sampled_count == inst.sampled.size()) inst.sampled.emplace_back();
      inst.sampled[inst.sampled_count].seq = e.seq;
      inst.sampled[inst.sampled_count].tokens.assign(1, 1);
      ++inst.sampled_count;
    }
  }
  // A mixed step runs its decode tokens and its prefill chunks as two passes.
  double step_s = 0;
  if (!shapes_.empty()) step_s += devices::sim::decode_step_time_s(config_.decode_device, shapes_);
  if (!prefill_shapes_.empty()) {
    step_s += devices::sim::prefill_time_s(config_.decode_device, prefill_shapes_);
  }
  RT_ASSERT(step_s > 0, step_s);
  inst.step_id = plan.step_id;
  ++inst.stats.steps_count;
  inst.stats.busy_s += step_s;
  push(now_ns_ + to_ns(step_s), EventKind::decode_done, d, 0);
}

void Sim::apply_update(const decode::SeqUpdate& update) {
  auto request_index = static_cast<uint32_t>(update.seq);
  RT_ASSERT(request_index < states_.size(), request_index);
  workload::RequestTimeline& t = result_.timelines[request_index];
  if (!update.tokens.empty()) {
    t.chunk_ms.push_back(now_ms());
    t.output_tokens += static_cast<uint32_t>(update.tokens.size());
  }
  if (!update.finished) return;
  if (*update.finished == decode::FinishReason::max_tokens) {
    RT_ASSERT(t.output_tokens == requests_[request_index].expected_output_tokens, t.output_tokens);
    finish(request_index, "");
  } else {
    finish(request_index, "decode_" + std::string(decode::to_string(*update.finished)));
  }
}

void Sim::on_decode_done(uint32_t d) {
  DecodeInst& inst = decode_[d];
  inst.sched->on_step_result(
      inst.step_id, std::span<const decode::SampledTokens>(inst.sampled.data(), inst.sampled_count),
      inst.updates);
  for (const decode::SeqUpdate& u : inst.updates) apply_update(u);
  kick_decode(d);
}

void Sim::on_pull_done(uint32_t d, uint32_t request_index) {
  ReqState& st = states_[request_index];
  RT_ASSERT(st.decode == d, st.decode, d);
  RT_ASSERT(st.prefill >= 0, request_index);
  auto p = static_cast<uint32_t>(st.prefill);
  // The hold may have expired while the request waited for decode: then the pull fails and
  // decode prefills locally (what the real decode does when prefill no longer holds it).
  bool ok = prefill_[p].sched->pull_done(request_index).ok();
  auto update = decode_[d].sched->on_pull_done(request_index, ok, 1);
  RT_ASSERT(update.ok(), update.ok() ? "" : update.error().describe());
  apply_update(*update);
  kick_prefill(p);
  kick_decode(d);
}

ClusterSimResult Sim::take_result() {
  ClusterSimResult r = std::move(result_);
  r.seed = config_.seed;
  r.mode = config_.prefill_count > 0 ? "pd" : "aggregated";
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
  decode::DecodeConfig dc{config.block_tokens, config.decode_waiting_max, config.decode_seqs_max,
                          config.decode_step_tokens_max, config.max_model_tokens};
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
  Sim sim(config, requests);
  if (Status s = sim.run(); !s) return s.error();
  ClusterSimResult result = sim.take_result();
  auto summary = workload::summarize(result.timelines, {});
  if (!summary) return summary.error();
  result.summary = std::move(summary).value();
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
  j["kv_transfer_bytes"] = r.kv_transfer_bytes;
  j["pd_requests"] = r.pd_requests_count;
  j["summary"] = summary_json(r.summary);
  nlohmann::ordered_json instances = nlohmann::ordered_json::array();
  for (const InstanceStats& s : r.instances) {
    instances.push_back({{"name", s.name},
                         {"steps", s.steps_count},
                         {"busy_s", s.busy_s},
                         {"computed_tokens", s.computed_tokens_count},
                         {"cached_tokens", s.cached_tokens_count},
                         {"preemptions", s.preemptions_count}});
  }
  j["instances"] = instances;
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
