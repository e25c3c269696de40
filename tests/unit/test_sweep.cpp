// bench/sweep: the driver's order and error handling over a fake back-end, argument parsing,
// and the table / CSV / JSON / plots.
#include <doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/sweep.hpp"

using namespace tandem;
using namespace tandem::bench;

namespace {

// Records every call; a point's TTFT p50 = concurrency x (config index + 1).
class FakeBackend : public SweepBackend {
 public:
  std::vector<std::string> calls;
  std::string fail_begin, fail_point_config;
  uint32_t fail_point_concurrency = 0;

  Status begin_config(const SweepConfig& c) override {
    calls.push_back("begin " + c.name);
    if (c.name == fail_begin) return make_error(ErrorKind::disconnected, "no cluster");
    return {};
  }
  Result<SweepRow> run_point(const SweepConfig& c, uint32_t concurrency) override {
    calls.push_back("point " + c.name + " " + std::to_string(concurrency));
    if (c.name == fail_point_config && concurrency == fail_point_concurrency) {
      return make_error(ErrorKind::timed_out, "too slow");
    }
    workload::BenchSummary s;
    s.requests_count = 10;
    s.succeeded_count = 10;
    s.ttft_ms.p50 = concurrency * (c.spec == "a" ? 1.0 : 2.0);
    s.ttft_ms.p90 = s.ttft_ms.p50 * 3;
    s.output_token_throughput_per_s = concurrency * 100.0;
    return row_from_summary("ignored", concurrency, s, c.spec == "a" ? 0.5 : -1);
  }
  void end_config(const SweepConfig& c) override { calls.push_back("end " + c.name); }
};

}  // namespace

TEST_CASE("run_sweep: configs outer, concurrencies inner, one row per point") {
  FakeBackend b;
  auto rows = run_sweep(b, {{"A", "a"}, {"B", "b"}}, {8, 16});
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 4);
  CHECK(b.calls == std::vector<std::string>{"begin A", "point A 8", "point A 16", "end A",
                                            "begin B", "point B 8", "point B 16", "end B"});
  CHECK((*rows)[0].config == "A");  // the driver names the row
  CHECK((*rows)[3].config == "B");
  CHECK((*rows)[3].concurrency == 16);
  CHECK((*rows)[3].ttft_p50_ms == 32);
  CHECK((*rows)[0].hit_rate == 0.5);
  CHECK((*rows)[2].hit_rate == -1);
}

TEST_CASE("run_sweep: a failing point stops the sweep, ends its config and names the point") {
  FakeBackend b;
  b.fail_point_config = "A";
  b.fail_point_concurrency = 16;
  auto rows = run_sweep(b, {{"A", "a"}, {"B", "b"}}, {8, 16, 32});
  REQUIRE(!rows.ok());
  CHECK(rows.error().kind == ErrorKind::timed_out);
  CHECK(rows.error().message == "config A, concurrency 16: too slow");
  CHECK(b.calls.back() == "end A");
  CHECK(b.calls.size() == 4);

  FakeBackend c;
  c.fail_begin = "B";
  rows = run_sweep(c, {{"A", "a"}, {"B", "b"}}, {8});
  REQUIRE(!rows.ok());
  CHECK(rows.error().message == "config B: no cluster");
  CHECK(c.calls.back() == "begin B");  // not ended: it never began
}

TEST_CASE("parse_concurrency_list") {
  auto ok = parse_concurrency_list("8,16,32,64,128");
  REQUIRE(ok.ok());
  CHECK(*ok == std::vector<uint32_t>{8, 16, 32, 64, 128});
  CHECK(parse_concurrency_list("4").value() == std::vector<uint32_t>{4});
  for (const char* bad : {"", "8,", ",8", "8,x", "0", "8,8", "-1", "2000000", "8 ,16"}) {
    INFO(bad);
    auto r = parse_concurrency_list(bad);
    REQUIRE(!r.ok());
    CHECK(r.error().kind == ErrorKind::invalid);
    CHECK(r.error().message.find("--concurrency") == 0);
  }
}

TEST_CASE("parse_config_arg") {
  auto c = parse_config_arg("pd-4x4=policy:prefix-aware,prefill:4");
  REQUIRE(c.ok());
  CHECK(c->name == "pd-4x4");
  CHECK(c->spec == "policy:prefix-aware,prefill:4");
  CHECK(parse_config_arg("m=a=b").value().spec == "a=b");
  for (const char* bad : {"noequals", "=spec", "name=", "bad name=x", "a,b=x"}) {
    INFO(bad);
    auto r = parse_config_arg(bad);
    REQUIRE(!r.ok());
    CHECK(r.error().message.find(bad) != std::string::npos);
  }
}

TEST_CASE("reports: table, CSV, JSON and one plot per metric") {
  FakeBackend b;
  auto rows = run_sweep(b, {{"A", "a"}, {"B", "b"}}, {8, 16});
  REQUIRE(rows.ok());
  std::string table = sweep_table(*rows);
  CHECK(std::count(table.begin(), table.end(), '\n') == 5);
  CHECK(table.find("ttft_p50_ms") != std::string::npos);

  std::string csv = sweep_csv(*rows);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 5);
  CHECK(csv.find("\nA,8,10,10,0,8,24,") != std::string::npos);
  CHECK(csv.find(",0.5,800,") != std::string::npos);
  CHECK(csv.find("\nB,16,10,10,0,32,96,0,0,0,,1600,0\n") != std::string::npos);

  auto j = nlohmann::json::parse(sweep_json(*rows, {"sim", "agentic", 7, 30}));
  CHECK(j["meta"]["seed"] == 7);
  CHECK(j["meta"]["backend"] == "sim");
  REQUIRE(j["rows"].size() == 4);
  CHECK(j["rows"][1]["concurrency"] == 16);
  CHECK(j["rows"][1]["ttft_p90_ms"] == 48);
  CHECK(j["rows"][0]["hit_rate"] == 0.5);
  CHECK(j["rows"][2]["hit_rate"].is_null());

  auto plots = sweep_plots(*rows, "test");
  REQUIRE(plots.size() == 4);
  CHECK(plots[0].first == "ttft_p50.svg");
  CHECK(plots[2].first == "hit_rate.svg");
  for (const auto& plot : plots) {
    const auto& name = plot.first;  // clang 14: no structured binding in doctest's INFO lambda
    const auto& svg = plot.second;
    INFO(name);
    CHECK(svg.find("class=\"legend\"") != std::string::npos);  // two configurations
    CHECK(svg.find(">A</text>") != std::string::npos);
    CHECK(svg.find(">B</text>") != std::string::npos);
    CHECK(svg.find("concurrency") != std::string::npos);
  }
  // B's hit rate is unknown: only A's line in the hit-rate plot, with 2 points (one polyline
  // of 2 vertices and 2 dots).
  const std::string& hit = plots[2].second;
  size_t circles = 0;
  for (size_t at = hit.find("<circle"); at != std::string::npos; at = hit.find("<circle", at + 1)) {
    ++circles;
  }
  CHECK(circles == 2);
  CHECK(sweep_table({}).find("config") != std::string::npos);
}
