// `tandem bench sweep`: the sim back-end gives the same numbers as separate `tandem sim` runs
// with the same seed; the real back-end starts a one-node sim-device cluster from its
// manifest (`tandem up`), sweeps 2 concurrencies with zero errors, and stops it.
#include <doctest.h>

#include <cstdlib>
#include <filesystem>
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

struct SimConfig {
  std::string name;
  std::string spec;
  std::vector<std::string> sim_flags;  // the same configuration as `tandem sim` flags
};

}  // namespace

TEST_CASE("sweep --sim: 3 configs (one manifest + flags) x 2 concurrencies equal tandem sim runs") {
  std::string dir = make_temp_dir("sweep-sim");
  std::vector<SimConfig> configs = {
      {"pd-rr",
       "policy:round-robin,prefill:1,decode:2",
       {"--policy", "round-robin", "--prefill", "1", "--decode", "2"}},
      {"agg",
       "policy:prefix-aware,aggregated,prefill:1,decode:2",
       {"--policy", "prefix-aware", "--aggregated", "--prefill", "1", "--decode", "2"}},
  };
  // A manifest combined with flags (`manifest:FILE,policy:...`): the path has '/' in it.
  std::string manifest =
      std::string(std::getenv("TANDEM_SOURCE_ROOT")) + "/config/examples/target-4p4d.toml";
  configs.push_back({"mf-rr", "manifest:" + manifest + ",policy:round-robin",
                     {"--manifest", manifest, "--policy", "round-robin"}});
  std::vector<std::string> sweep = {
      tandem_bin(), "bench",      "sweep", "--sim",         "--seed", "7",     "--duration",
      "90",         "--sessions", "6",     "--concurrency", "2,4",    "--out", dir + "/out"};
  for (const SimConfig& c : configs) {
    sweep.push_back("--config");
    sweep.push_back(c.name + "=" + c.spec);
  }
  RunResult run = testing::run(sweep, 240s);
  INFO("sweep output: " << run.output);
  REQUIRE(run.exit_code == 0);
  auto table = nlohmann::json::parse(read_file(dir + "/out/sweep.json"));
  REQUIRE(table["rows"].size() == configs.size() * 2);
  CHECK(table["meta"]["backend"] == "sim");
  CHECK(table["meta"]["seed"] == 7);
  size_t row_index = 0;
  for (const SimConfig& c : configs) {
    for (const char* concurrency : {"2", "4"}) {
      std::string json_path = dir + "/" + c.name + "-" + concurrency + ".json";
      std::vector<std::string> sim = {tandem_bin(), "sim",       "--seed",           "7",
                                      "--sessions", concurrency, "--duration-s",     "90",
                                      "--workload", "agentic",   "--sessions-total", "6",
                                      "--json",     json_path};
      sim.insert(sim.end(), c.sim_flags.begin(), c.sim_flags.end());
      RunResult alone = testing::run(sim, 120s);
      INFO("sim output: " << alone.output);
      REQUIRE(alone.exit_code == 0);
      std::string expected = read_file(json_path);
      // The per-point JSON is byte-identical, and the table row carries its numbers.
      CHECK(read_file(dir + "/out/points/" + c.name + "-c" + concurrency + ".json") == expected);
      auto want = nlohmann::json::parse(expected);
      const auto& row = table["rows"][row_index++];
      CHECK(row["config"] == c.name);
      CHECK(row["concurrency"] == std::stoi(concurrency));
      CHECK(want["sent"].get<uint64_t>() > 0);
      CHECK(row["requests"] == want["summary"]["requests"]);
      CHECK(row["failed"] == want["summary"]["failed"]);
      CHECK(row["ttft_p50_ms"] == want["summary"]["ttft_ms"]["p50"]);
      CHECK(row["ttft_p90_ms"] == want["summary"]["ttft_ms"]["p90"]);
      CHECK(row["hit_rate"] == want["hit_rate"]);
      CHECK(row["output_tokens_per_s"] == want["summary"]["output_token_throughput_per_s"]);
    }
  }
  for (const char* plot :
       {"ttft_p50.svg", "ttft_p90.svg", "hit_rate.svg", "output_throughput.svg"}) {
    INFO(plot);
    std::string svg = read_file(dir + "/out/" + plot);
    CHECK(svg.find("</svg>") != std::string::npos);
    CHECK(svg.find(">pd-rr</text>") != std::string::npos);
    CHECK(svg.find(">agg</text>") != std::string::npos);
  }
  std::string csv = read_file(dir + "/out/sweep.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == static_cast<long>(configs.size() * 2 + 1));
}

TEST_CASE("sweep --sim: bad configurations are errors naming what is wrong") {
  std::string dir = make_temp_dir("sweep-bad");
  RunResult run = testing::run({tandem_bin(), "bench", "sweep", "--sim", "--config", "a=seed:3",
                                "--concurrency", "2", "--out", dir},
                               30s);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("'seed' is set by the sweep") != std::string::npos);
  run = testing::run({tandem_bin(), "bench", "sweep", "--sim", "--config", "a=policy:nope",
                      "--concurrency", "2", "--out", dir},
                     30s);
  CHECK(run.exit_code == 1);
  CHECK(run.output.find("nope") != std::string::npos);
  run = testing::run({tandem_bin(), "bench", "sweep", "--sim", "--config", "a=policy:random",
                      "--concurrency", "2,0", "--out", dir},
                     30s);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("--concurrency: 0") != std::string::npos);
  run = testing::run({tandem_bin(), "bench", "sweep", "--sim", "--concurrency", "2"}, 30s);
  CHECK(run.exit_code == 2);
  CHECK(run.output.find("--config") != std::string::npos);
}

namespace {

std::string cluster_manifest(uint16_t http_port) {
  return one_node_sim_manifest("bench-sweep-it", http_port);
}

// 3 sessions x 3 turns; each turn resends the previous prompt plus new tokens.
std::vector<workload::Request> make_trace() {
  std::vector<workload::Request> out;
  for (uint32_t s = 0; s < 3; ++s) {
    std::vector<uint32_t> prompt;
    for (uint32_t i = 0; i < 48; ++i) prompt.push_back(100 + i * 3);
    for (uint32_t turn = 0; turn < 3; ++turn) {
      for (uint32_t i = 0; i < 20; ++i) prompt.push_back(1000 + s * 300 + turn * 40 + i);
      workload::Request r;
      r.session = s;
      r.turn = turn;
      r.expected_output_tokens = 4 + turn;
      r.prompt_token_ids = prompt;
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("sweep (real): a manifest's cluster is started, swept at 2 concurrencies, stopped") {
  std::string dir = make_temp_dir("sweep-real");
  uint16_t http_port = free_port();
  write_file(dir + "/cluster.toml", cluster_manifest(http_port));
  std::vector<workload::Request> trace = make_trace();
  write_file(dir + "/trace.jsonl", workload::to_jsonl(trace));
  RunResult run = testing::run(
      {tandem_bin(), "bench", "sweep", "--config", "one=" + dir + "/cluster.toml", "--trace",
       dir + "/trace.jsonl", "--concurrency", "1,3", "--duration", "60", "--out", dir + "/out"},
      300s);
  INFO("sweep output: " << run.output);
  INFO("cluster log: " << read_file(dir + "/out/logs/one.log"));
  REQUIRE(run.exit_code == 0);
  auto table = nlohmann::json::parse(read_file(dir + "/out/sweep.json"));
  CHECK(table["meta"]["backend"] == "serve");
  REQUIRE(table["rows"].size() == 2);
  for (const auto& row : table["rows"]) {
    CHECK(row["config"] == "one");
    CHECK(row["requests"] == trace.size());
    CHECK(row["succeeded"] == trace.size());
    CHECK(row["failed"] == 0);
    CHECK(row["ttft_p50_ms"].get<double>() > 0);
    CHECK(row["output_tokens_per_s"].get<double>() > 0);
  }
  CHECK(table["rows"][0]["concurrency"] == 1);
  CHECK(table["rows"][1]["concurrency"] == 3);
  CHECK(std::filesystem::exists(dir + "/out/points/one-c1.json"));
  CHECK(std::filesystem::exists(dir + "/out/points/one-c3.json"));
  // The cluster was stopped: its gateway port no longer answers.
  RunResult probe =
      testing::run({tandem_bin(), "bench", "serve", "--target",
                    "127.0.0.1:" + std::to_string(http_port), "--requests", "1", "--no-progress"},
                   30s);
  CHECK(probe.exit_code == 1);
  CHECK(probe.output.find("cannot connect") != std::string::npos);
}

TEST_CASE("sweep --target: an already running cluster, one configuration, 2 concurrencies") {
  std::string dir = make_temp_dir("sweep-target");
  uint16_t http_port = free_port();
  write_file(dir + "/cluster.toml", cluster_manifest(http_port));
  Child node({tandem_bin(), "node", "--manifest", dir + "/cluster.toml", "--node", "local"},
             dir + "/node.log");
  std::string target = "127.0.0.1:" + std::to_string(http_port);
  bool healthy = eventually(60s, [&] {
    auto got = bench::http_get({"127.0.0.1", http_port}, "/health", 500);
    return got.ok() && got->first == 200;
  });
  INFO("node log: " << node.log());
  REQUIRE(healthy);
  std::vector<workload::Request> trace = make_trace();
  write_file(dir + "/trace.jsonl", workload::to_jsonl(trace));
  RunResult run =
      testing::run({tandem_bin(), "bench", "sweep", "--target", target, "--trace",
                    dir + "/trace.jsonl", "--concurrency", "2,1", "--out", dir + "/out"},
                   120s);
  INFO("sweep output: " << run.output);
  REQUIRE(run.exit_code == 0);
  auto table = nlohmann::json::parse(read_file(dir + "/out/sweep.json"));
  REQUIRE(table["rows"].size() == 2);
  CHECK(table["rows"][0]["config"] == "target");
  CHECK(table["rows"][0]["concurrency"] == 2);
  CHECK(table["rows"][1]["concurrency"] == 1);
  for (const auto& row : table["rows"]) {
    CHECK(row["succeeded"] == trace.size());
    CHECK(row["failed"] == 0);
  }
  CHECK(node.running());  // --target never stops the cluster

  // bench serve --svg-dir against the same cluster: the three request plots, one dot per
  // request in the scatter plots (plus one legend key each).
  RunResult serve = testing::run(
      {tandem_bin(), "bench", "serve", "--target", target, "--trace", dir + "/trace.jsonl",
       "--concurrency", "2", "--svg-dir", dir + "/plots", "--no-progress"},
      120s);
  INFO("serve output: " << serve.output);
  REQUIRE(serve.exit_code == 0);
  for (const char* name : {"ttft_cdf.svg", "ttft_over_time.svg", "ttft_vs_context.svg"}) {
    INFO(name);
    std::string svg = read_file(dir + "/plots/" + name);
    CHECK(svg.find("</svg>") != std::string::npos);
    CHECK(svg.find("TTFT (ms)") != std::string::npos);
  }
  std::string over_time = read_file(dir + "/plots/ttft_over_time.svg");
  size_t circles = 0;
  for (size_t at = over_time.find("<circle"); at != std::string::npos;
       at = over_time.find("<circle", at + 1)) {
    ++circles;
  }
  CHECK(circles == trace.size() + 1);
  node.signal(SIGTERM);
  node.wait(5000ms);
}

TEST_CASE("tandem sim --manifest: decode executors with their own sim values (DP + EP) change "
          "decode's model only; executors of one role must agree") {
  std::string dir = make_temp_dir("sim-roles");
  // The example models decode as DP + EP (its decode executors' own sim values); without
  // those lines every instance is PP ([sim] dp_ep = 0).
  std::string example = read_file(source_root() + "/config/examples/target-4p4d.toml");
  std::string base;
  std::istringstream lines(example);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("sim = { dp_ep = 1 }") == std::string::npos) base += line + "\n";
  }
  REQUIRE(base.size() < example.size());
  auto with_decode_dp_ep = [&](std::string text, int first, int last) {
    for (int i = first; i <= last; ++i) {
      std::string from = "name = \"exec-decode-" + std::to_string(i) + "\"\n  device = \"sim\"\n";
      auto at = text.find(from);
      REQUIRE(at != std::string::npos);
      text.replace(at, from.size(), from + "  sim = { dp_ep = 1 }\n");
    }
    return text;
  };
  auto run_sim = [&](const std::string& name, const std::string& text) {
    write_file(dir + "/" + name + ".toml", text);
    return testing::run({tandem_bin(), "sim", "--manifest", dir + "/" + name + ".toml", "--seed",
                         "3", "--sessions", "4", "--sessions-total", "8", "--duration-s", "3600",
                         "--workload", "agentic", "--json", dir + "/" + name + ".json"},
                        120s);
  };
  RunResult pp = run_sim("pp", base);
  INFO("pp: " << pp.output);
  REQUIRE(pp.exit_code == 0);
  RunResult dp = run_sim("dp", with_decode_dp_ep(base, 1, 4));
  INFO("dp: " << dp.output);
  REQUIRE(dp.exit_code == 0);
  auto a = nlohmann::json::parse(read_file(dir + "/pp.json"));
  auto b = nlohmann::json::parse(read_file(dir + "/dp.json"));
  // Every session ran to its end in both runs (the same requests were sent).
  CHECK(a["sent"] == b["sent"]);
  CHECK(a["completed"] == a["sent"]);
  CHECK(b["completed"] == b["sent"]);
  // Decode spread over its 4 NPUs (DP + EP) steps faster than one pipeline stage at a time:
  // per decode step and per output token, by far. Prefill's model did not move: its modelled
  // seconds per computed token stay put (they differ only by the routing and batching that
  // the faster decode shifts, a few percent). Virtual time, so the figures are exact.
  auto per = [](const nlohmann::json& run, const std::string& role, const char* over) {
    double busy = 0, count = 0;
    for (const auto& i : run["instances"]) {
      if (i["name"].get<std::string>().rfind(role, 0) != 0) continue;
      busy += i["busy_s"].get<double>();
      count += i[over].get<double>();
    }
    REQUIRE(count > 0);
    return busy / count;
  };
  double decode_ratio = per(b, "decode", "steps") / per(a, "decode", "steps");
  double prefill_ratio = per(b, "prefill", "computed_tokens") / per(a, "prefill", "computed_tokens");
  MESSAGE("dp / pp: decode s/step x", decode_ratio, ", prefill s/token x", prefill_ratio);
  CHECK(decode_ratio < 0.5);
  CHECK(b["summary"]["tpot_ms"]["p50"].get<double>() <
        0.5 * a["summary"]["tpot_ms"]["p50"].get<double>());
  CHECK(prefill_ratio > 0.9);
  CHECK(prefill_ratio < 1.1);
  // One decode executor differs from the others: refused, naming both and the key.
  RunResult mixed = run_sim("mixed", with_decode_dp_ep(base, 1, 1));
  CHECK(mixed.exit_code != 0);
  CHECK(mixed.output.find("decode instances 'decode-1' and 'decode-2'") != std::string::npos);
  CHECK(mixed.output.find("'dp_ep'") != std::string::npos);
}
