#include <doctest.h>

#include "tools/workload/bench_metrics.hpp"

using tandem::ErrorKind;
using tandem::workload::BenchSummary;
using tandem::workload::latency_stats;
using tandem::workload::percentile;
using tandem::workload::RequestTimeline;
using tandem::workload::summarize;
using tandem::workload::SummaryOptions;

namespace {

std::vector<RequestTimeline> hand_made() {
  std::vector<RequestTimeline> t(4);
  t[0] = {0, {100, 120, 150, 160}, 160, 4, 1000, 0, ""};  // TTFT 100, TPOT 20, ITL 20 30 10
  t[1] = {10, {60, 70}, 90, 3, 20000, 1, ""};             // TTFT 50, TPOT 15, ITL 10
  t[2] = {20, {}, 30, 0, 5000, 0, "http_503"};            // failed
  t[3] = {30, {330}, 330, 1, 9000, 1, ""};                // TTFT 300, no TPOT
  return t;
}

}  // namespace

TEST_CASE("bench metrics: percentiles interpolate linearly") {
  CHECK(percentile({1, 2, 3, 4}, 50) == doctest::Approx(2.5));
  CHECK(percentile({1, 2, 3, 4}, 0) == 1);
  CHECK(percentile({1, 2, 3, 4}, 100) == 4);
  CHECK(percentile({7}, 99) == 7);
  auto stats = latency_stats({30, 10, 20, 10});
  CHECK(stats.count == 4);
  CHECK(stats.mean == doctest::Approx(17.5));
  CHECK(stats.p50 == doctest::Approx(15));
  CHECK(stats.p90 == doctest::Approx(27));
  CHECK(stats.p99 == doctest::Approx(29.7));
  CHECK(stats.min == 10);
  CHECK(stats.max == 30);
  CHECK(latency_stats({}).count == 0);
}

TEST_CASE("bench metrics: TTFT, TPOT, ITL, E2E and throughput on hand-made timelines") {
  SummaryOptions options;
  options.context_edges_tokens = {8192, 16384};
  auto result = summarize(hand_made(), options);
  REQUIRE(result.ok());
  const BenchSummary& s = *result;
  CHECK(s.requests_count == 4);
  CHECK(s.succeeded_count == 3);
  CHECK(s.failed_count == 1);
  CHECK(s.errors_by_kind == std::map<std::string, uint64_t>{{"http_503", 1}});
  CHECK(s.duration_ms == doctest::Approx(330));
  CHECK(s.request_throughput_per_s == doctest::Approx(3 / 0.33));
  CHECK(s.output_token_throughput_per_s == doctest::Approx(8 / 0.33));
  CHECK(s.ttft_ms.count == 3);
  CHECK(s.ttft_ms.mean == doctest::Approx(150));
  CHECK(s.ttft_ms.p50 == doctest::Approx(100));
  CHECK(s.ttft_ms.p90 == doctest::Approx(260));
  CHECK(s.ttft_ms.p99 == doctest::Approx(296));
  CHECK(s.tpot_ms.count == 2);
  CHECK(s.tpot_ms.mean == doctest::Approx(17.5));
  CHECK(s.tpot_ms.p90 == doctest::Approx(19.5));
  CHECK(s.itl_ms.count == 4);
  CHECK(s.itl_ms.p50 == doctest::Approx(15));
  CHECK(s.itl_ms.max == doctest::Approx(30));
  CHECK(s.e2e_ms.mean == doctest::Approx(180));
  CHECK(s.e2e_ms.p50 == doctest::Approx(160));
  // No SLOs given: every succeeded request with a token is goodput.
  CHECK(s.goodput_count == 3);
  CHECK(s.goodput_fraction == doctest::Approx(0.75));
}

TEST_CASE("bench metrics: goodput under SLOs (DistServe)") {
  SummaryOptions options;
  options.slo.ttft_ms_max = 120;
  options.slo.tpot_ms_max = 18;
  auto s = summarize(hand_made(), options);
  REQUIRE(s.ok());
  CHECK(s->goodput_count == 1);  // only request 1 (TTFT 50, TPOT 15)
  CHECK(s->goodput_fraction == doctest::Approx(0.25));
  CHECK(s->goodput_per_s == doctest::Approx(1 / 0.33));
  options.slo = {};
  options.slo.e2e_ms_max = 160;  // inclusive bound: requests 0 and 1
  CHECK(summarize(hand_made(), options)->goodput_count == 2);
  options.duration_ms = 1000;  // a given run length replaces last end - first send
  auto fixed = summarize(hand_made(), options);
  CHECK(fixed->request_throughput_per_s == doctest::Approx(3));
  CHECK(fixed->goodput_per_s == doctest::Approx(2));
}

TEST_CASE("bench metrics: TTFT by context length and by turn") {
  SummaryOptions options;
  options.context_edges_tokens = {8192, 16384};
  auto s = summarize(hand_made(), options);
  REQUIRE(s.ok());
  REQUIRE(s->ttft_by_context.size() == 3);
  CHECK(s->ttft_by_context[0].prompt_tokens_min == 0);
  CHECK(s->ttft_by_context[0].prompt_tokens_max == 8192);
  CHECK(s->ttft_by_context[0].ttft_ms.count == 1);
  CHECK(s->ttft_by_context[0].ttft_ms.p50 == 100);
  CHECK(s->ttft_by_context[1].ttft_ms.p50 == 300);
  CHECK(s->ttft_by_context[2].prompt_tokens_min == 16384);
  CHECK(s->ttft_by_context[2].prompt_tokens_max == UINT64_MAX);
  CHECK(s->ttft_by_context[2].ttft_ms.p50 == 50);
  REQUIRE(s->ttft_by_turn.size() == 2);
  CHECK(s->ttft_by_turn.at(0).mean == 100);
  CHECK(s->ttft_by_turn.at(1).count == 2);
  CHECK(s->ttft_by_turn.at(1).p50 == doctest::Approx(175));
}

TEST_CASE("bench metrics: inconsistent timelines are errors naming the request") {
  auto expect_error = [](std::vector<RequestTimeline> t, const char* text) {
    auto s = summarize(t, SummaryOptions{});
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().kind == ErrorKind::invalid);
    CHECK_MESSAGE(s.error().message.find(text) != std::string::npos, s.error().message);
  };
  auto t = hand_made();
  t[1].chunk_ms = {5, 70};
  expect_error(t, "request 1: chunk 0 is before send_ms");
  t = hand_made();
  t[0].chunk_ms = {100, 90};
  expect_error(t, "request 0: chunk 1 is before chunk 0");
  t = hand_made();
  t[3].end_ms = 300;
  expect_error(t, "request 3: end_ms is before the last chunk");
  t = hand_made();
  t[0].output_tokens = 2;
  expect_error(t, "request 0: output_tokens 2 is below its 4 chunks");
  SummaryOptions bad_edges;
  bad_edges.context_edges_tokens = {100, 100};
  CHECK_FALSE(summarize(hand_made(), bad_edges).ok());
  auto empty = summarize({}, SummaryOptions{});
  REQUIRE(empty.ok());
  CHECK(empty->requests_count == 0);
  CHECK(empty->request_throughput_per_s == 0);
}
