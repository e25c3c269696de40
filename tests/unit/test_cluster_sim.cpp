// tools/sim/cluster_sim: determinism, conservation, and prefix-aware routing beating
// round-robin on the agentic workload (issue 5).
#include <doctest/doctest.h>

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
