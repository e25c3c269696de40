// `tandem bench transport --quick`: the whole bench runs end to end on loopback (fi_pingpong,
// the raw baseline, two FabricEndpoint processes, a real `tandem node`) and reports every
// figure. No performance thresholds here: the figures are checked for presence and sanity.
#include <doctest.h>

#include <cstdio>

#include "tests/support/process.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;

namespace {

// The value of `field` in the JSON row whose metric is `metric`, as text ("null" if absent).
std::string row_field(const std::string& json, const std::string& metric,
                      const std::string& field) {
  auto at = json.find("\"metric\": \"" + metric + "\"");
  if (at == std::string::npos) return "";
  auto end = json.find('}', at);
  auto key = json.find("\"" + field + "\": ", at);
  if (key == std::string::npos || key > end) return "";
  auto start = key + field.size() + 4;
  return json.substr(start, json.find_first_of(",}", start) - start);
}

bool positive_number(const std::string& text) {
  if (text.empty() || text == "null") return false;
  return std::stod(text) > 0;
}

}  // namespace

TEST_CASE("bench transport --quick measures every side and writes JSON") {
  std::string dir = make_temp_dir("bench-transport-test");
  std::string json_path = dir + "/out.json";
  auto result = run({tandem_bin(), "bench", "transport", "--quick", "--json", json_path}, 240s);
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK(result.output.find("tandem/raw") != std::string::npos);
  CHECK(result.output.find("goal: RMA read >= 0.90x raw at >= 1 MiB: 1 MiB") != std::string::npos);
  std::string json = read_file(json_path);
  REQUIRE(!json.empty());
  for (const char* metric :
       {"round trip 64 B p50", "round trip 64 B p99", "message rate, window 64", "RMA read 4 KiB",
        "RMA read 1 MiB", "node ping p50 (via CAF actor)"}) {
    CAPTURE(metric);
    CHECK(positive_number(row_field(json, metric, "tandem")));
    CHECK(positive_number(row_field(json, metric, "raw")));
  }
  // p99 is never below p50 on either side.
  for (const char* side : {"tandem", "raw"}) {
    CAPTURE(side);
    double p50 = std::stod(row_field(json, "round trip 64 B p50", side));
    double p99 = std::stod(row_field(json, "round trip 64 B p99", side));
    CHECK(p99 >= p50);
  }
  // fi_pingpong is part of the setup (libfabric-bin); its round trip must have been parsed.
  CHECK(positive_number(row_field(json, "round trip 64 B p50", "fi_pingpong")));
  std::remove(json_path.c_str());
  std::remove(dir.c_str());
}

TEST_CASE("bench transport rejects bad flags with a message naming the flag") {
  auto result = run({tandem_bin(), "bench", "transport", "--rma-inflight-max", "0"}, 30s);
  CHECK(result.exit_code == 2);
  CHECK(result.output.find("--rma-inflight-max") != std::string::npos);
  auto serve = run(
      {tandem_bin(), "bench", "transport", "--serve", "bogus", "--port", "1", "--ready", "/tmp/x"},
      30s);
  CHECK(serve.exit_code == 2);
  CHECK(serve.output.find("--serve must be 'raw' or 'tandem'") != std::string::npos);
}
