// Smoke test of the router benchmark at a tiny size (the real run: build/bench/router_bench).
#include <doctest.h>

#include "bench/router_bench.hpp"

TEST_CASE("router bench: runs every scenario and reports consistent numbers") {
  tandem::bench::RouterBenchOptions options;
  options.instances_count = 6;
  options.prompt_tokens = 16 * 700;
  options.picks_count = 50;
  options.filler_blocks = 30;
  auto result = tandem::bench::run_router_bench(options);
  CHECK(result.blocks_count == 700);
  CHECK(result.index_nodes_count >= 700);
  REQUIRE(result.scenarios.size() == 3);
  CHECK(result.scenarios[0].name == "typical");
  CHECK(result.scenarios[1].name == "turn+78");
  CHECK(result.scenarios[2].name == "spread");
  CHECK(result.scenarios[2].match_lengths_distinct == 6);
  for (const auto& s : result.scenarios) {
    CHECK(s.p50_us > 0);
    CHECK(s.p50_us <= s.p99_us);
    CHECK(s.p99_us <= s.max_us);
    CHECK(s.picks_per_s > 0);
    CHECK(s.decide_p50_us > 0);
    CHECK(s.decide_p50_us <= s.decide_p99_us);
    CHECK(s.record_p50_us <= s.record_p99_us);
    CHECK(s.decide_p50_us <= s.p99_us);
    CHECK(s.reference_p50_us > 0);
    CHECK(s.reference_p50_us <= s.reference_p99_us);
  }
  // typical resends one prompt (nothing new to record); turns add 78 blocks per instance.
  CHECK(result.scenarios[0].recorded_blocks_count == 0);
  CHECK(result.scenarios[1].recorded_blocks_count >= 50 * 78);
  CHECK(result.scenarios[1].record_ns_per_block > 0);
  CHECK(result.cold_pick_us > 0);
  CHECK(result.cold_decide_us > 0);
  CHECK(result.cold_decide_us < result.cold_pick_us);
  CHECK(result.cold_record_ns_per_block > 0);
  CHECK(describe(result).find("spread") != std::string::npos);
  CHECK(describe(result).find("reference") != std::string::npos);
}
