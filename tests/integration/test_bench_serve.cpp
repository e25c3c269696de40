// `tandem bench serve` against a real one-node cluster on the sim device (time factor 0):
// a short replay completes with zero errors and the JSON result's counts match the trace.
#include <doctest.h>

#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/http_stream.hpp"
#include "tests/support/process.hpp"
#include "tests/support/sim_cluster.hpp"
#include "tools/workload/workload.hpp"

using namespace tandem;
using namespace tandem::testing;
using namespace std::chrono_literals;

namespace {

std::string manifest(uint16_t http_port) {
  return one_node_sim_manifest("bench-serve-it", http_port);
}

// A trace: 3 sessions x 4 turns, each turn resending the previous prompt plus new tokens,
// every session starting with the same 64-token system prefix.
std::vector<workload::Request> make_trace() {
  std::vector<workload::Request> out;
  std::vector<uint32_t> system;
  for (uint32_t i = 0; i < 64; ++i) system.push_back(100 + i * 7);
  for (uint32_t s = 0; s < 3; ++s) {
    std::vector<uint32_t> prompt = system;
    for (uint32_t turn = 0; turn < 4; ++turn) {
      for (uint32_t i = 0; i < 20 + 5 * turn; ++i) prompt.push_back(1000 + s * 500 + turn * 50 + i);
      workload::Request r;
      r.session = s;
      r.turn = turn;
      r.think_time_ms = turn == 0 ? 0 : 5;
      r.expected_output_tokens = 3 + 2 * turn + s;
      r.prompt_token_ids = prompt;
      out.push_back(r);
    }
  }
  return out;
}

// The data rows of the markdown tables in `text`: lines starting "| ", without the header
// lines (containing `header_word`) and the "---" separators; cells in order, untrimmed.
std::vector<std::vector<std::string>> table_rows(const std::string& text,
                                                 const std::string& header_word) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| ", 0) != 0 || line.find("---") != std::string::npos ||
        line.find(header_word) != std::string::npos) {
      continue;
    }
    std::vector<std::string> cells;
    std::istringstream cols(line.substr(1));
    for (std::string cell; std::getline(cols, cell, '|');) cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

}  // namespace

TEST_CASE("bench serve replays a trace against a sim cluster with zero errors") {
  std::string dir = make_temp_dir("bench-serve");
  uint16_t http_port = free_port();
  write_file(dir + "/cluster.toml", manifest(http_port));
  Child node({tandem_bin(), "node", "--manifest", dir + "/cluster.toml", "--node", "local"},
             dir + "/node.log");
  bench::HttpEndpoint gateway{"127.0.0.1", http_port};
  bool healthy = eventually(60s, [&] {
    auto got = bench::http_get(gateway, "/health", 500);
    return got.ok() && got->first == 200;
  });
  INFO("node log: " << node.log());
  REQUIRE(healthy);

  std::vector<workload::Request> trace = make_trace();
  write_file(dir + "/trace.jsonl", workload::to_jsonl(trace));
  std::string target = "127.0.0.1:" + std::to_string(http_port);
  RunResult run = testing::run({tandem_bin(), "bench", "serve", "--target", target, "--trace",
                                dir + "/trace.jsonl", "--concurrency", "2", "--json",
                                dir + "/result.json", "--svg", dir + "/ttft.svg", "--no-progress"},
                               120s);
  INFO("bench output: " << run.output);
  REQUIRE(run.exit_code == 0);

  auto j = nlohmann::json::parse(read_file(dir + "/result.json"));
  const auto& s = j["summary"];
  CHECK(s["requests_count"] == trace.size());
  CHECK(s["succeeded_count"] == trace.size());
  CHECK(s["failed_count"] == 0);
  CHECK(s["errors_by_kind"].empty());
  CHECK(s["ttft_ms"]["count"] == trace.size());
  REQUIRE(j["requests"].size() == trace.size());
  uint64_t expected_output = 0;
  for (const auto& r : j["requests"]) {
    const workload::Request& want = trace.at(r["index"].get<size_t>());
    CHECK(r["error"] == "");
    CHECK(r["turn"] == want.turn);
    CHECK(r["prompt_tokens"] == want.prompt_token_ids.size());
    CHECK(r["output_tokens"] == want.expected_output_tokens);
    CHECK(r["first_chunk_ms"].get<double>() >= r["send_ms"].get<double>());
    CHECK(r["end_ms"].get<double>() >= r["first_chunk_ms"].get<double>());
    expected_output += want.expected_output_tokens;
  }
  // --concurrency 2 counts sessions, think times included: a session holds its slot from
  // its first turn's send to its last turn's end, so at most 2 of the 3 overlap.
  std::map<uint32_t, std::pair<double, double>> span_ms;  // session -> [first send, last end]
  for (const auto& r : j["requests"]) {
    uint32_t session = trace.at(r["index"].get<size_t>()).session;
    auto [it, fresh] = span_ms.try_emplace(session, r["send_ms"].get<double>(),
                                           r["end_ms"].get<double>());
    it->second.first = std::min(it->second.first, r["send_ms"].get<double>());
    it->second.second = std::max(it->second.second, r["end_ms"].get<double>());
  }
  REQUIRE(span_ms.size() == 3);
  for (const auto& one : span_ms) {
    // Not a structured binding: clang 14 cannot capture one in doctest's macro lambdas.
    const auto& session = one.first;
    const auto& span = one.second;
    int active = 0;
    for (const auto& entry : span_ms) {
      active += entry.second.first <= span.first && span.first < entry.second.second;
    }
    CHECK_MESSAGE(active <= 2, "session " << session << " started with " << active << " active");
  }
  double tokens = s["output_token_throughput_per_s"].get<double>() * s["duration_ms"].get<double>();
  CHECK(tokens / 1000.0 == doctest::Approx(static_cast<double>(expected_output)).epsilon(0.01));
  // Turns resend their history: the cluster's prefix caches must have seen hits.
  REQUIRE(j["prefix_cache"]["hit_rate"].is_number());
  CHECK(j["prefix_cache"]["hit_rate"].get<double>() > 0.0);
  // ... but not every prompt token: first turns are cold (a hit rate of 1 means the query
  // counters count only the blocks that hit).
  CHECK(j["prefix_cache"]["hit_rate"].get<double>() < 1.0);
  // The requests' own usage.cached_tokens give the same kind of figure (the sim's hit_rate).
  REQUIRE(j["prefix_cache"]["request_hit_rate"].is_number());
  CHECK(j["prefix_cache"]["request_hit_rate"].get<double>() > 0.0);
  CHECK(j["prefix_cache"]["request_hit_rate"].get<double>() < 1.0);
  CHECK(read_file(dir + "/ttft.svg").find("<polyline") != std::string::npos);
  node.signal(SIGTERM);
  node.wait(5000ms);
}

TEST_CASE("bench serve: a bad trace line is an error naming the line") {
  std::string dir = make_temp_dir("bench-serve-bad");
  write_file(dir + "/trace.jsonl", "{\"session\":0,\"turn\":0}\nnot json\n");
  RunResult run = testing::run({tandem_bin(), "bench", "serve", "--target", "127.0.0.1:9",
                                "--trace", dir + "/trace.jsonl", "--no-progress"},
                               30s);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("line 1") != std::string::npos);
}

TEST_CASE("bench serve: an unreachable gateway is a clear error, not a crash") {
  RunResult run = testing::run({tandem_bin(), "bench", "serve", "--target", "127.0.0.1:9",
                                "--requests", "3", "--no-progress"},
                               30s);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("cannot connect") != std::string::npos);
}

// `tandem bench overhead` end to end, small: every point has the cluster, the direct
// device baseline and the transport floor, with no failed request on either server, and
// the CPU columns measured (a floor that answered wrongly, e.g. without the usage the client
// counts tokens from, or a table that lost a column, fails here).
TEST_CASE("bench overhead: cluster, device and transport floor side by side, no errors") {
  RunResult run = testing::run({tandem_bin(), "bench", "overhead", "--concurrency", "1,4",
                                "--requests", "40", "--model-dir",
                                source_root() + "/models/stories15M"},
                               120s);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK(run.output.find("errors:") == std::string::npos);
  auto rows = table_rows(run.output, "streams");
  REQUIRE(rows.size() == 4);  // (1, 4 streams) x (1, 16 tokens)
  for (const auto& r : rows) {
    REQUIRE(r.size() == 17);
    CHECK(std::stod(r[3]) > 0);   // cluster p50
    CHECK(std::stod(r[9]) > 0);   // cluster req/s
    CHECK(std::stod(r[10]) > 0);  // floor p50
    CHECK(std::stod(r[12]) > 0);  // floor req/s
    CHECK(std::stod(r[15]) > 0);  // node CPU per request
    CHECK(std::stod(r[16]) > 0);  // client CPU per request
  }
}

// `tandem bench admission` end to end, small: a row per (gateway variant, round) with the
// short requests answered (alone and during the long prompts), then a summary row per
// variant. Timings are the benchmark's to report, not this test's to judge.
TEST_CASE("bench admission: short requests alone and during long prompts, two gateways") {
  RunResult run = testing::run({tandem_bin(), "bench", "admission", "--rounds", "2",
                                "--prompt-tokens", "20000", "--model-dir",
                                source_root() + "/models/stories15M"},
                               120s);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  size_t split = run.output.find("medians over rounds");
  REQUIRE(split != std::string::npos);
  std::map<std::string, int> rounds_by_variant;
  for (const auto& cells : table_rows(run.output.substr(0, split), "| gateway |")) {
    REQUIRE(cells.size() == 8);
    ++rounds_by_variant[cells[0]];
    CHECK(std::stod(cells[2]) > 0);                      // alone median
    CHECK(std::stod(cells[5]) >= std::stod(cells[3]));  // max >= first
    CHECK(std::stod(cells[6]) >= 1);                     // short requests answered during
    CHECK(std::stod(cells[7]) > 0);                      // the long prompts took time
  }
  int summaries = 0;
  for (const auto& cells : table_rows(run.output.substr(split), "| gateway |")) {
    REQUIRE(cells.size() == 6);
    CHECK(std::stod(cells[1]) > 0);  // short alone
    CHECK(std::stod(cells[2]) > 0);  // first short during the long prompts
    ++summaries;
  }
  CHECK(rounds_by_variant[" one preparer "] == 2);
  CHECK(rounds_by_variant[" default "] == 2);
  CHECK(summaries == 2);
  RunResult bad = testing::run({tandem_bin(), "bench", "admission", "--big", "0"}, 30s);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--big 1..64") != std::string::npos);
}

// `tandem bench spec`, small: both proposers on both workloads; on the repetitive one they
// accept drafts, on the fresh one none (a proposer that drafted garbage would still show 0
// accepted, but one that never drafted, or a replay that lost its verification, fails here).
TEST_CASE("bench spec: proposers accept on repetitive requests and nothing on fresh ones") {
  RunResult run = testing::run({tandem_bin(), "bench", "spec", "--requests", "3",
                                "--file-tokens", "400"},
                               60s);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  int rows = 0;
  std::istringstream in(run.output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream cells(line);
    std::string workload, method;
    double steps = 0, accepted = 0, per_step = 0;
    if (!(cells >> workload >> method >> steps >> accepted >> per_step)) continue;
    ++rows;
    if (workload == "repetitive") {
      CHECK(accepted > 1.0);  // ~98% of tokens are copies; k = 4
      CHECK(per_step == doctest::Approx(accepted + 1).epsilon(0.01));
    } else {
      CHECK(workload == "fresh");
      CHECK(accepted == 0.0);
      CHECK(steps == 3 * 400);
    }
  }
  CHECK(rows == 4);
  RunResult bad = testing::run({tandem_bin(), "bench", "spec", "--draft-tokens", "0"}, 30s);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("--draft-tokens 1..16") != std::string::npos);
}
