// tools/sim/cluster_sim: determinism, conservation, and prefix-aware routing beating
// round-robin on the agentic workload (issue 5).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "tools/sim/cluster_sim.hpp"
#include "tools/workload/workload.hpp"

using namespace tandem;

namespace {

std::vector<workload::Request> agentic(uint64_t seed, uint32_t in_flight, uint32_t total) {
  workload::AgenticParams p;
  p.seed = seed;
  p.sessions_in_flight = in_flight;
  p.sessions_count = total;
  p.turns_min = 4;
  p.turns_max = 10;
  auto requests = workload::generate_agentic(p);
  REQUIRE(requests.ok());
  return std::move(requests).value();
}

sim::ClusterSimConfig small_cluster(router::Policy policy, uint32_t prefill, uint32_t decode) {
  sim::ClusterSimConfig c;
  c.prefill_count = prefill;
  c.decode_count = decode;
  c.router.policy = policy;
  c.sessions_in_flight = 8;
  c.duration_ms = 600e3;
  return c;
}

}  // namespace

TEST_CASE("same config and workload give byte-identical JSON") {
  auto requests = agentic(7, 8, 16);
  auto c = small_cluster(router::Policy::prefix_aware, 2, 2);
  auto a = sim::run_cluster_sim(c, requests);
  auto b = sim::run_cluster_sim(c, requests);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->completed_count > 0);
  std::string ja = sim::to_json(*a, true);
  CHECK(ja == sim::to_json(*b, true));
  // A different router seed under the random policy changes the run.
  c.router.policy = router::Policy::random;
  c.router.seed = 1;
  auto r1 = sim::run_cluster_sim(c, requests);
  c.router.seed = 2;
  auto r2 = sim::run_cluster_sim(c, requests);
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK(sim::to_json(*r1, true) != sim::to_json(*r2, true));
}

TEST_CASE("every sent request completes or is counted failed, with its tokens") {
  auto requests = agentic(3, 8, 12);
  for (uint32_t prefill : {0u, 2u}) {
    CAPTURE(prefill);
    auto c = small_cluster(router::Policy::prefix_aware, prefill, prefill == 0 ? 4 : 2);
    c.duration_ms = 1e9;  // long enough for every session to run to its end
    auto r = sim::run_cluster_sim(c, requests);
    REQUIRE(r.ok());
    CHECK(r->sent_count == requests.size());
    CHECK(r->sent_count == r->completed_count + r->failed_count);
    CHECK(r->timelines.size() == r->sent_count);
    CHECK(r->summary.requests_count == r->sent_count);
    uint64_t expected_tokens = 0, got_tokens = 0;
    for (const auto& q : requests) expected_tokens += q.expected_output_tokens;
    for (const auto& t : r->timelines) {
      CHECK(t.end_ms >= t.send_ms);
      if (t.error_kind.empty()) CHECK(!t.chunk_ms.empty());
      got_tokens += t.output_tokens;
    }
    if (r->failed_count == 0) CHECK(got_tokens == expected_tokens);
    CHECK(r->mode == (prefill == 0 ? "aggregated" : "pd"));
    if (prefill > 0) CHECK(r->pd_requests_count > 0);
    if (prefill > 0) CHECK(r->kv_transfer_bytes > 0);
  }
}

TEST_CASE("a duration cut stops new requests but finishes those sent") {
  auto requests = agentic(5, 8, 32);
  auto c = small_cluster(router::Policy::prefix_aware, 1, 2);
  c.duration_ms = 20e3;
  auto r = sim::run_cluster_sim(c, requests);
  REQUIRE(r.ok());
  CHECK(r->sent_count > 0);
  CHECK(r->sent_count < requests.size());
  CHECK(r->sent_count == r->completed_count + r->failed_count);
  for (const auto& t : r->timelines) CHECK(t.send_ms < 20e3);
}

TEST_CASE("prefix-aware routing hits more of the prefix cache than round-robin") {
  auto requests = agentic(11, 16, 32);
  auto pa = small_cluster(router::Policy::prefix_aware, 0, 8);
  pa.sessions_in_flight = 16;
  auto rr = pa;
  rr.router.policy = router::Policy::round_robin;
  auto a = sim::run_cluster_sim(pa, requests);
  auto b = sim::run_cluster_sim(rr, requests);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  MESSAGE("hit rate prefix-aware ", a->hit_rate, " round-robin ", b->hit_rate);
  CHECK(a->hit_rate > b->hit_rate + 0.1);
  CHECK(a->hit_rate > 0.8);
  CHECK(a->summary.ttft_ms.p50 < b->summary.ttft_ms.p50);
}

TEST_CASE("bad input is an invalid error, not a crash") {
  auto requests = agentic(1, 2, 2);
  auto c = small_cluster(router::Policy::prefix_aware, 1, 1);
  c.decode_count = 0;
  auto r = sim::run_cluster_sim(c, requests);
  REQUIRE(!r.ok());
  CHECK(r.error().kind == ErrorKind::invalid);
  CHECK(r.error().message.find("decode_count") != std::string::npos);
  c.decode_count = 1;
  c.link_bytes_per_s = 0;
  CHECK(!sim::run_cluster_sim(c, requests).ok());
  c.link_bytes_per_s = 25e9;
  auto text = requests;
  text[0].segments.clear();
  text[0].prompt_text = "hello";
  auto t = sim::run_cluster_sim(c, text);
  REQUIRE(!t.ok());
  CHECK(t.error().message.find("text") != std::string::npos);
}

// The router learns load only from reports (every load_report_interval_ms, as the real
// shells send them); between reports it knows its own picks (waiting + 1). Two sessions
// starting 500 ms apart on an idle cluster: with 100 ms reports the first pick's +1 is gone
// when the second session arrives, so prefix affinity (the shared system prompt) sends both
// to the same decode instance; if the load were reported only on changes, the idle decode
// instance would still look busy and the second session would go elsewhere.
TEST_CASE("load reports every interval: a pick's waiting + 1 lasts until the next report") {
  auto requests = agentic(5, 2, 2);
  auto c = small_cluster(router::Policy::prefix_aware, 1, 2);
  c.sessions_in_flight = 2;
  c.duration_ms = 20e3;
  auto busy_decodes = [&](double interval_ms) {
    c.load_report_interval_ms = interval_ms;
    auto r = sim::run_cluster_sim(c, requests);
    REQUIRE(r.ok());
    CHECK(r->sent_count == r->completed_count);
    int busy = 0;
    for (const auto& inst : r->instances) {
      busy += inst.name.rfind("decode-", 0) == 0 && inst.busy_s > 0;
    }
    return busy;
  };
  CHECK(busy_decodes(100) == 1);
  CHECK(busy_decodes(0) == 2);
  c.load_report_interval_ms = -1;
  CHECK_FALSE(c.validate().ok());
}

TEST_CASE("prefill and decode instances each take their own device model") {
  auto requests = agentic(5, 8, 16);
  auto base = small_cluster(router::Policy::prefix_aware, 2, 2);
  auto run = [&](const sim::ClusterSimConfig& c) {
    auto r = sim::run_cluster_sim(c, requests);
    REQUIRE(r.ok());
    REQUIRE(r->completed_count > 0);
    return std::move(r).value();
  };
  auto same = run(base);
  // A decode model with a quarter of the memory bandwidth: time per output token grows.
  auto slow_decode = base;
  slow_decode.decode_device.decode_hbm_efficiency /= 4;
  auto d = run(slow_decode);
  CHECK(d.summary.tpot_ms.p50 > same.summary.tpot_ms.p50 * 2);
  // A prefill model 20x slower: first tokens come much later. (Decode's pace may change
  // too: fewer sequences reach it at once.)
  auto slow_prefill = base;
  slow_prefill.prefill_device.prefill_mfu /= 20;
  auto p = run(slow_prefill);
  CHECK(p.summary.ttft_ms.p50 > same.summary.ttft_ms.p50 * 2);
  // Each role validated on its own.
  auto bad = base;
  bad.prefill_device.prefill_mfu = 0;
  auto r = sim::run_cluster_sim(bad, requests);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("prefill device") != std::string::npos);
}

// ---- faults (issue 12) ----

#include <cstdio>

#include "tools/sim/faults.hpp"
#include "tools/sim/swarm.hpp"

namespace {

sim::ClusterSimConfig faulty_cluster(const std::string& spec, uint32_t prefill, uint32_t decode) {
  auto c = small_cluster(router::Policy::prefix_aware, prefill, decode);
  c.duration_ms = 60e3;
  c.request_timeout_ms = 10e3;
  c.prefill_timeout_ms = 3e3;
  c.prefill_hold_timeout_ms = 5000;
  auto plan = sim::parse_faults(spec);
  if (!plan.ok()) std::fprintf(stderr, "%s\n", plan.error().describe().c_str());
  REQUIRE(plan.ok());
  c.faults = std::move(plan).value();
  return c;
}

std::vector<workload::Request> short_agentic(uint64_t seed) {
  workload::AgenticParams p;
  p.seed = seed;
  p.sessions_in_flight = 6;
  p.sessions_count = 24;
  p.system_prompt_tokens = 1024;
  p.repo_context_tokens_min = 500;
  p.repo_context_tokens_max = 2000;
  p.tool_output_tokens_median = 200;
  p.tool_output_tokens_max = 2000;
  p.output_tokens_min = 20;
  p.output_tokens_max = 200;
  p.turns_min = 2;
  p.turns_max = 5;
  p.think_time_ms_median = 100;
  auto requests = workload::generate_agentic(p);
  REQUIRE(requests.ok());
  return std::move(requests).value();
}

sim::ClusterSimResult run_ok(const sim::ClusterSimConfig& c,
                             const std::vector<workload::Request>& requests) {
  auto r = sim::run_cluster_sim(c, requests);
  if (!r.ok()) std::fprintf(stderr, "%s\n", r.error().describe().c_str());
  REQUIRE(r.ok());
  return std::move(r).value();
}

}  // namespace

TEST_CASE("fault spec: every kind parses, and a bad term is named") {
  auto plan = sim::parse_faults(
      "crash:decode-1@30s+10s,partition:prefill-0/decode-2@5s+2s,slow:decode-0x4@0s+60s,"
      "loss:gateway/decode-0=0.25@1s+500ms,delay:prefill-1/decode-1=20@2s+1s,hang:prefill-0@3s+1s,"
      "crash:decode-3@1s,random:crash=0.01/s,random:partition=0.5");
  REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? std::string() : plan.error().describe()));
  REQUIRE(plan->faults.size() == 7);
  CHECK(plan->faults[0].kind == sim::FaultKind::crash);
  CHECK(plan->faults[0].a == "decode-1");
  CHECK(plan->faults[0].at_ms == 30000);
  CHECK(plan->faults[0].for_ms == 10000);
  CHECK(plan->faults[2].value == 4);
  CHECK(plan->faults[3].value == 0.25);
  CHECK(plan->faults[3].for_ms == 500);
  CHECK(plan->faults[6].for_ms < 0);  // never restarts
  CHECK(plan->random_per_s[static_cast<int>(sim::FaultKind::crash)] == 0.01);
  // The canonical form parses back to the same faults.
  auto again = sim::parse_faults(sim::describe(plan->faults));
  REQUIRE(again.ok());
  CHECK(sim::describe(again->faults) == sim::describe(plan->faults));
  for (const char* bad : {"crash:decode-1", "crash:decode-1@30", "partition:decode-1@1s+1s",
                          "loss:gateway/decode-0=2@1s+1s", "slow:decode-0@1s+1s",
                          "crash:router@1s+1s", "boom:decode-0@1s", "random:crash",
                          "hang:decode-0@1s", "partition:decode-0/decode-0@1s+1s",
                          "crash:nobody-1@1s"}) {
    CAPTURE(bad);
    std::string spec = std::string("crash:decode-0@1s,") + bad;
    auto r = sim::parse_faults(spec);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().kind == ErrorKind::invalid);
    CHECK(r.error().message.find("term 2 '" + std::string(bad) + "'") != std::string::npos);
  }
  // A node the cluster does not have: the run names the term.
  auto requests = short_agentic(1);
  auto c = faulty_cluster("crash:decode-9@1s+1s", 1, 2);
  auto r = sim::run_cluster_sim(c, requests);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("crash:decode-9@1000ms+1000ms") != std::string::npos);
}

TEST_CASE("random faults are drawn from the seed: same seed, same plan") {
  auto plan = sim::parse_faults("random:crash=0.1,random:loss=0.2,random:slow=0.1");
  REQUIRE(plan.ok());
  std::vector<std::string> instances{"prefill-0", "decode-0", "decode-1"};
  std::vector<std::string> nodes{"gateway", "router", "prefill-0", "decode-0", "decode-1"};
  auto a = sim::expand_faults(*plan, instances, nodes, 100e3, 7);
  auto b = sim::expand_faults(*plan, instances, nodes, 100e3, 7);
  auto other = sim::expand_faults(*plan, instances, nodes, 100e3, 8);
  CHECK(!a.empty());
  CHECK(sim::describe(a) == sim::describe(b));
  CHECK(sim::describe(a) != sim::describe(other));
  for (size_t i = 1; i < a.size(); ++i) CHECK(a[i - 1].at_ms <= a[i].at_ms);
}

TEST_CASE("a crashed decode: its requests are retried elsewhere, the run replays exactly") {
  auto requests = short_agentic(3);
  auto c = faulty_cluster("crash:decode-0@4s+6s,crash:decode-1@15s+3s", 1, 3);
  auto r = run_ok(c, requests);
  CHECK_MESSAGE(r.violation.empty(), r.violation);
  CHECK(r.fault_counters.crashes == 2);
  CHECK(r.fault_counters.restarts == 2);
  CHECK(r.fault_counters.detections >= 2);
  CHECK(r.fault_counters.retries > 0);
  CHECK(r.sent_count == r.completed_count + r.failed_count);
  CHECK(r.completed_count > 0);
  // Same config, same bytes (faults, retries and all).
  auto again = run_ok(c, requests);
  CHECK(sim::to_json(r, true) == sim::to_json(again, true));
  // A different seed draws differently only where randomness is used: the random policy.
  c.router.policy = router::Policy::random;
  auto x = run_ok(c, requests);
  c.seed = 99;
  c.router.seed = 99;
  auto y = run_ok(c, requests);
  CHECK(sim::to_json(x, true) != sim::to_json(y, true));
}

TEST_CASE("precise index: built from the caches' events only, it equals every cache at the "
          "end, through evictions, sub-blocks and restarts") {
  auto requests = short_agentic(5);
  auto c = faulty_cluster("crash:prefill-0@5s+4s,crash:decode-1@12s+3s", 2, 2);
  c.precise_index = true;
  c.block_tokens = 64;
  c.sub_block_tokens = 16;
  c.kv_blocks = 160;  // small pools: evictions and cascades
  c.max_model_tokens = 8192;
  auto r = run_ok(c, requests);
  CHECK_MESSAGE(r.violation.empty(), r.violation);
  CHECK(r.fault_counters.restarts == 2);
  CHECK(r.completed_count > 0);
  CHECK(r.precise_checked_entries > 100);
  CHECK(r.hit_rate > 0.5);
  // The end check catches an index that misses the caches' removals.
  c.bugs.precise_no_removed = true;
  auto bad = run_ok(c, requests);
  CHECK(bad.violation.find("precise index") != std::string::npos);
  // Approximate mode on the same run: no end check, comparable hit rate.
  c.bugs.precise_no_removed = false;
  c.precise_index = false;
  auto approx = run_ok(c, requests);
  CHECK(approx.precise_checked_entries == 0);
  MESSAGE("hit rate precise ", r.hit_rate, ", approximate ", approx.hit_rate);
}

TEST_CASE("a request that already streamed tokens ends with an explicit error when its decode dies") {
  auto requests = short_agentic(5);
  for (auto& q : requests) q.expected_output_tokens = 400;  // long streams: crashes hit mid-way
  auto c = faulty_cluster("crash:decode-0@3s+2s,crash:decode-1@9s+2s", 0, 2);
  auto r = run_ok(c, requests);
  CHECK_MESSAGE(r.violation.empty(), r.violation);
  CHECK(r.failed_by_kind["gateway_decode_down"] > 0);
  for (const auto& t : r.timelines) {
    if (t.error_kind == "gateway_decode_down") CHECK(t.output_tokens > 0);
  }
}

TEST_CASE("partitions, loss, delay, slow and hung executors: every invariant holds") {
  auto requests = short_agentic(7);
  auto c = faulty_cluster(
      "partition:prefill-0/decode-1@2s+3s,partition:router/decode-0@6s+4s,"
      "loss:gateway/decode-0=0.3@1s+8s,loss:prefill-1/decode-0=0.5@1s+10s,"
      "delay:gateway/decode-1=50@0s+20s,slow:decode-1x8@5s+5s,hang:prefill-1@8s+3s,"
      "hang:decode-0@12s+4s,partition:gateway/router@20s+1s",
      2, 2);
  auto r = run_ok(c, requests);
  CHECK_MESSAGE(r.violation.empty(), r.violation);
  CHECK(r.fault_counters.detections > 0);
  CHECK(r.fault_counters.fallbacks + r.fault_counters.pull_failures > 0);
  CHECK(r.fault_counters.lost_streams > 0);
  CHECK(r.sent_count == r.completed_count + r.failed_count);
}

TEST_CASE("each invariant checker catches its planted bug") {
  auto requests = short_agentic(3);
  auto base = faulty_cluster("crash:decode-0@4s+6s,crash:decode-1@15s+3s", 1, 3);
  auto caught = [&](auto plant, const std::string& expected) {
    auto c = base;
    plant(c.bugs);
    auto r = run_ok(c, requests);
    CAPTURE(expected);
    CHECK_MESSAGE(r.violation.find(expected) != std::string::npos, r.violation);
    CHECK(r.violation_ms >= 0);
  };
  caught([](auto& b) { b.drop_end = true; }, "never ended");
  caught([](auto& b) { b.double_end = true; }, "ended twice");
  caught([](auto& b) { b.no_retry = true; }, "should have been retried");
  caught([](auto& b) { b.leak_block = true; }, "KV leak");
  caught([](auto& b) { b.router_not_told = true; }, "which it had declared down");
  caught([](auto& b) { b.unbounded = true; }, "in-flight map");
  // Without a planted bug: no violation.
  CHECK(run_ok(base, requests).violation.empty());
}

TEST_CASE("swarm cases: same seed, same case and bytes") {
  for (uint64_t seed : {1u, 2u}) {
    auto a = sim::make_swarm_case(seed);
    auto b = sim::make_swarm_case(seed);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->shape == b->shape);
    auto ra = run_ok(a->config, a->requests);
    auto rb = run_ok(b->config, b->requests);
    CHECK(sim::to_json(ra, true) == sim::to_json(rb, true));
    CHECK(sim::swarm_line(seed, *a, ra) == sim::swarm_line(seed, *b, rb));
  }
}

// Seeds the swarm failed on, kept as regression cases. 1, 28, 57, 111, 114: a gateway retry
// after a timeout re-sent the request id to the decode instance still holding the abandoned
// attempt, which refused it as a duplicate (400 for a server-side fault); decode now replaces
// the held attempt when its own gateway re-sends it (pd_policy on_duplicate).
TEST_CASE("swarm regression seeds") {
  for (uint64_t seed : {1u, 28u, 57u, 111u, 114u}) {
    CAPTURE(seed);
    auto c = sim::make_swarm_case(seed);
    REQUIRE(c.ok());
    auto r = run_ok(c->config, c->requests);
    CHECK_MESSAGE(r.violation.empty(), r.violation);
    CHECK(r.sent_count == r.completed_count + r.failed_count);
  }
}

// ---- tier 2 (issue 13) ----

namespace {

// Sessions whose contexts do not all fit in the prefill pools: evicted prefixes come back
// from tier 2 when it is on.
struct Tier2Case {
  std::vector<workload::Request> requests;
  sim::ClusterSimConfig config;
};

Tier2Case tier2_case(uint64_t seed) {
  workload::AgenticParams p;
  p.seed = seed;
  p.sessions_in_flight = 8;
  p.sessions_count = 32;
  p.repos_count = 8;
  p.repo_context_tokens_min = 4000;
  p.repo_context_tokens_max = 12000;
  p.turns_min = 3;
  p.turns_max = 8;
  p.output_tokens_min = 20;
  p.output_tokens_max = 100;
  p.context_tokens_max = 32768;
  auto requests = workload::generate_agentic(p);
  REQUIRE(requests.ok());
  auto c = small_cluster(router::Policy::prefix_aware, 2, 2);
  c.max_model_tokens = 32768;
  c.kv_blocks = 96;  // 49,152 tokens per instance: a few sessions' contexts
  c.sessions_in_flight = 8;
  c.duration_ms = 1e9;
  c.tier2.capacity_blocks = 4096;
  c.tier2.read_bytes_per_s = 50e9;  // a disk much faster than computing: reads pay
  c.tier2.write_bytes_per_s = 50e9;
  return {std::move(requests).value(), c};
}

}  // namespace

TEST_CASE("tier 2 in the sim: evicted prefixes are read back instead of computed") {
  auto t = tier2_case(11);
  auto off = run_ok(t.config, t.requests);
  t.config.tier2.enabled = true;
  auto on = run_ok(t.config, t.requests);
  CHECK_MESSAGE(on.violation.empty(), on.violation);
  CHECK(on.tier2_enabled);
  CHECK_FALSE(off.tier2_enabled);
  CHECK(on.completed_count == on.sent_count);
  CHECK(on.tier2.lookups > 0);
  CHECK(on.tier2.stored_blocks > 0);
  CHECK(on.tier2.loaded_blocks > 0);
  CHECK(on.tier2.loaded_blocks <= on.tier2.hit_blocks);
  CHECK(on.tier2.bytes_written > 0);
  // Loaded blocks count as cached prompt tokens: a higher hit rate, fewer tokens computed.
  CHECK(on.hit_rate > off.hit_rate);
  uint64_t computed_off = 0, computed_on = 0;
  for (const auto& s : off.instances) computed_off += s.computed_tokens_count;
  for (const auto& s : on.instances) computed_on += s.computed_tokens_count;
  CHECK(computed_on < computed_off);
  // Deterministic, and the JSON says what tier 2 did.
  auto again = run_ok(t.config, t.requests);
  CHECK(sim::to_json(on, true) == sim::to_json(again, true));
  CHECK(sim::to_json(on, false).find("\"loaded_blocks\"") != std::string::npos);
  CHECK(sim::to_json(off, false).find("\"tier2\"") == std::string::npos);
}

TEST_CASE("tier 2 in the sim: with sub-blocks prompts' trailing partial blocks are read back") {
  auto t = tier2_case(11);
  t.config.block_tokens = 2048;
  t.config.sub_block_tokens = 256;
  t.config.kv_blocks = 24;  // the same 49,152 tokens per instance
  t.config.tier2.capacity_blocks = 1024;
  t.config.tier2.enabled = true;
  auto on = run_ok(t.config, t.requests);
  CHECK_MESSAGE(on.violation.empty(), on.violation);
  CHECK(on.completed_count == on.sent_count);
  CHECK(on.tier2.loaded_partial_blocks > 0);
  CHECK(on.tier2.loaded_partial_blocks <= on.tier2.loaded_blocks);
  // Fewer tokens loaded than whole blocks would hold: partial blocks are counted by sub-block.
  CHECK(on.tier2.loaded_tokens < on.tier2.loaded_blocks * 2048);
  auto whole = t.config;
  whole.tier2.sub_blocks = false;
  auto off = run_ok(whole, t.requests);
  CHECK_MESSAGE(off.violation.empty(), off.violation);
  CHECK(off.tier2.loaded_partial_blocks == 0);
  CHECK(on.tier2.loaded_tokens > off.tier2.loaded_tokens);
  CHECK(on.hit_rate > off.hit_rate);
  CHECK(sim::to_json(on, false).find("\"loaded_partial_blocks\"") != std::string::npos);
}

TEST_CASE("tier 2 in the sim: a disk slower than computing is not read (the cost rule)") {
  auto t = tier2_case(11);
  auto off = run_ok(t.config, t.requests);
  t.config.tier2.enabled = true;
  t.config.tier2.read_bytes_per_s = 0.05e9;  // 50 MB/s: 1.3 s a block, a read loses to computing
  t.config.bugs.no_lookup_budget = true;      // the cost rule alone (the budget: below)
  auto slow = run_ok(t.config, t.requests);
  CHECK_MESSAGE(slow.violation.empty(), slow.violation);
  CHECK(slow.tier2.declined > 0);
  CHECK(slow.tier2.lookups > 0);  // the probes
  // Probes of one block, one at a time, and no router credit for copies that are not read:
  // a slow disk costs (simulated, deterministic) next to nothing.
  CHECK(slow.summary.ttft_ms.mean < off.summary.ttft_ms.mean * 1.05);
  // (p99: 1.36x since prefill by work counts reported pending tokens, which do not see the
  // 1.3 s a probe waits; it was < 1.05x with load x mean. docs/benchmarks.md "Sub-blocks".)
  CHECK(slow.summary.ttft_ms.p99 < off.summary.ttft_ms.p99 * 1.4);
  // Without the rule every prompt that lacks blocks reads them all: a tail 20x longer.
  auto always = t.config;
  always.bugs.no_cost_rule = true;
  auto a = run_ok(always, t.requests);
  CHECK(a.tier2.declined == 0);
  CHECK(a.tier2.loaded_blocks > 10 * slow.tier2.loaded_blocks);
  CHECK(a.summary.ttft_ms.p99 > 5 * slow.summary.ttft_ms.p99);
  CHECK(a.summary.ttft_ms.mean > 2 * slow.summary.ttft_ms.mean);
  // The lookup budget alone protects too, once kv-offload measured its disk: it stages
  // nothing the disk cannot read before the asker would have computed it.
  auto budget_only = always;
  budget_only.bugs.no_lookup_budget = false;
  auto b = run_ok(budget_only, t.requests);
  CHECK(b.tier2.over_budget_blocks > 0);
  CHECK(b.tier2.loaded_blocks < a.tier2.loaded_blocks);  // the reads before it measured
  CHECK(b.summary.ttft_ms.p99 < a.summary.ttft_ms.p99);
}

TEST_CASE("tier 2 in the sim: torn writes and read errors are misses, never served") {
  auto t = tier2_case(11);
  t.config.tier2.enabled = true;
  t.config.duration_ms = 120e3;
  auto plan = sim::parse_faults(
      "torn:prefill-0=0.5@0s+120s,torn:prefill-1=0.5@0s+120s,ioerr:prefill-0=0.3@0s+120s,"
      "ioerr:prefill-1=0.3@0s+120s,crash:prefill-1@40s+5s");
  REQUIRE(plan.ok());
  t.config.faults = std::move(plan).value();
  auto r = run_ok(t.config, t.requests);
  CHECK_MESSAGE(r.violation.empty(), r.violation);
  CHECK(r.tier2.corrupt_dropped_blocks > 0);
  CHECK(r.tier2.read_errors > 0);
  CHECK(r.tier2.loaded_blocks > 0);  // the sound blocks still serve
  CHECK(r.fault_counters.crashes == 1);
  CHECK(r.sent_count == r.completed_count + r.failed_count);
  // The checker: a store that skips verification serves a torn block, and is caught.
  t.config.bugs.serve_corrupt = true;
  auto bad = run_ok(t.config, t.requests);
  CHECK_MESSAGE(bad.violation.find("loaded a corrupt block from tier 2") != std::string::npos,
                bad.violation);
}

TEST_CASE("tier 2 in the sim: bad config and fault terms are named") {
  auto t = tier2_case(11);
  t.config.tier2.enabled = true;
  auto agg = t.config;
  agg.decode_count += agg.prefill_count;
  agg.prefill_count = 0;
  auto r = sim::run_cluster_sim(agg, t.requests);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("prefill_count") != std::string::npos);
  auto empty = t.config;
  empty.tier2.capacity_blocks = 0;
  r = sim::run_cluster_sim(empty, t.requests);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("tier2.capacity_blocks") != std::string::npos);
  auto ok = sim::parse_faults("ioerr:prefill-0=0.25@1s+2s,torn:prefill-1=1@0ms+5s,random:torn=0.1");
  REQUIRE(ok.ok());
  REQUIRE(ok->faults.size() == 2);
  CHECK(sim::describe(ok->faults) == "ioerr:prefill-0=0.25@1000ms+2000ms,torn:prefill-1=1@0ms+5000ms");
  auto on_decode = sim::parse_faults("ioerr:decode-0=0.5@1s+1s");
  REQUIRE_FALSE(on_decode.ok());
  CHECK(on_decode.error().message.find("prefill-N") != std::string::npos);
  auto no_p = sim::parse_faults("torn:prefill-0@1s+1s");
  REQUIRE_FALSE(no_p.ok());
  CHECK(no_p.error().message.find("term 1") != std::string::npos);
  // Tier-2 faults on a cluster without tier 2 would do nothing: refused.
  for (const char* spec : {"ioerr:prefill-0=0.5@1s+1s", "random:torn=0.1"}) {
    CAPTURE(spec);
    auto off = t.config;
    off.tier2.enabled = false;
    off.faults = sim::parse_faults(spec).value();
    auto refused = sim::run_cluster_sim(off, t.requests);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message.find("act on tier 2, which is off") != std::string::npos);
  }
}

TEST_CASE("tier 2 in the sim: lookups stage only what the disk reads before computing would end") {
  auto t = tier2_case(11);
  t.config.tier2.enabled = true;
  t.config.tier2.read_bytes_per_s = 2e9;  // a block in 33 ms: reads pay alone, not behind a queue
  t.config.tier2.write_bytes_per_s = 2e9;
  auto budget = run_ok(t.config, t.requests);
  auto unbounded = t.config;
  unbounded.bugs.no_lookup_budget = true;
  auto queued = run_ok(unbounded, t.requests);
  CHECK_MESSAGE(budget.violation.empty(), budget.violation);
  CHECK(budget.tier2.over_budget_blocks > 0);
  CHECK(budget.tier2.loaded_blocks > 0);
  // With the budget no staged block is read later than computing it would have ended (the
  // sim's queue estimate is exact); without it, some are.
  CHECK(budget.tier2.late_blocks == 0);
  CHECK(queued.tier2.over_budget_blocks == 0);
  CHECK(queued.tier2.late_blocks > 0);
}

TEST_CASE("speculation: drafts accepted at the configured rate lower TPOT; none accepted costs "
          "more; replays exactly") {
  auto requests = agentic(11, 8, 16);
  auto c = small_cluster(router::Policy::prefix_aware, 2, 2);
  c.duration_ms = 1e9;
  auto off = sim::run_cluster_sim(c, requests);
  REQUIRE(off.ok());
  auto spec_stats = [](const sim::ClusterSimResult& r) {
    uint64_t drafts = 0, drafted = 0, accepted = 0;
    for (const auto& i : r.instances) {
      drafts += i.spec_drafts_count;
      drafted += i.spec_draft_tokens_count;
      accepted += i.spec_accepted_tokens_count;
    }
    return std::tuple{drafts, drafted, accepted};
  };
  CHECK(std::get<0>(spec_stats(*off)) == 0);
  c.spec.method = decode::SpecMethod::suffix;
  c.spec.row_cost = 0.05;  // an accelerator's memory-bound step: extra rows are cheap
  c.spec_acceptance = 0.9;
  auto good = sim::run_cluster_sim(c, requests);
  REQUIRE(good.ok());
  CHECK(good->completed_count == off->completed_count);
  CHECK(good->failed_count == 0);
  auto [drafts, drafted, accepted] = spec_stats(*good);
  MESSAGE("drafts ", drafts, ", drafted ", drafted, ", accepted ", accepted, "; TPOT p50 ",
          good->summary.tpot_ms.p50, " vs off ", off->summary.tpot_ms.p50);
  REQUIRE(drafts > 0);
  // Accepted in order with probability 0.9 each: a draft of d yields sum 0.9^i, i = 1..d.
  double per_token = double(accepted) / double(drafted);
  CHECK(per_token > 0.5);
  CHECK(per_token < 0.95);
  CHECK(good->summary.tpot_ms.p50 < off->summary.tpot_ms.p50);
  // Every output token still arrives (the scheduler cuts runs at max_tokens).
  uint64_t off_tokens = 0, good_tokens = 0;
  for (const auto& t : off->timelines) off_tokens += t.output_tokens;
  for (const auto& t : good->timelines) good_tokens += t.output_tokens;
  CHECK(good_tokens == off_tokens);
  auto again = sim::run_cluster_sim(c, requests);
  REQUIRE(again.ok());
  CHECK(sim::to_json(*again, true) == sim::to_json(*good, true));
  // Nothing accepted: every draft is a cost. (The sim's outputs repeat one token, so the
  // drafters' shadow check keeps finding that their proposals would have been right and they
  // keep probing: the sim models acceptance by a coin, not by the tokens.)
  c.spec_acceptance = 0.0;
  auto bad = sim::run_cluster_sim(c, requests);
  REQUIRE(bad.ok());
  auto [bad_drafts, bad_drafted, bad_accepted] = spec_stats(*bad);
  CHECK(bad_drafts > 0);
  CHECK(bad_accepted == 0);
  CHECK(bad->summary.tpot_ms.p50 >= off->summary.tpot_ms.p50);
  c.spec_acceptance = 1.5;
  CHECK_FALSE(sim::run_cluster_sim(c, requests).ok());

  SUBCASE("eagle3: the model's drafts are asked after each step and cost a layer per token") {
    c.spec.method = decode::SpecMethod::eagle3;
    c.spec_acceptance = 0.9;
    auto e3 = sim::run_cluster_sim(c, requests);
    REQUIRE(e3.ok());
    CHECK(e3->failed_count == 0);
    auto [e_drafts, e_drafted, e_accepted] = spec_stats(*e3);
    MESSAGE("eagle3: drafts ", e_drafts, ", drafted ", e_drafted, ", accepted ", e_accepted,
            "; TPOT p50 ", e3->summary.tpot_ms.p50, " vs off ", off->summary.tpot_ms.p50);
    REQUIRE(e_drafts > 0);
    CHECK(double(e_accepted) / double(e_drafted) > 0.5);
    CHECK(e3->summary.tpot_ms.p50 < off->summary.tpot_ms.p50);
    uint64_t e3_tokens = 0, off_tokens2 = 0;
    for (const auto& t : e3->timelines) e3_tokens += t.output_tokens;
    for (const auto& t : off->timelines) off_tokens2 += t.output_tokens;
    CHECK(e3_tokens == off_tokens2);
    auto e3_again = sim::run_cluster_sim(c, requests);
    REQUIRE(e3_again.ok());
    CHECK(sim::to_json(*e3_again, true) == sim::to_json(*e3, true));
  }
}
