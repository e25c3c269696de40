// `tandem sim`: the cluster under virtual time (issue 5). Flags or a manifest give the
// cluster; a generated workload or a JSONL trace gives the requests; tools/sim/cluster_sim
// runs them. Prints the seed first; --seed N replays a run byte for byte (the wall time goes
// to stderr). --faults injects faults; an invariant violation is printed with its seed and
// virtual time and exits 1. --swarm K runs K random cases (tools/sim/swarm.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "bench/plot_files.hpp"
#include "bench/request_plots.hpp"
#include "tools/commands.hpp"
#include "runtime/base/assert.hpp"
#include "tools/sim/cluster_sim.hpp"
#include "tools/sim/hit_bound.hpp"
#include "tools/sim/swarm.hpp"
#include "tools/sim_setup.hpp"
#include "tools/workload/workload.hpp"

namespace tandem::tools {
namespace {

void print_stats(const char* name, const workload::LatencyStats& s) {
  std::printf("  %-5s ms  p50 %10.1f  p90 %10.1f  p99 %10.1f  mean %10.1f\n", name, s.p50, s.p90,
              s.p99, s.mean);
}

void print_result(const sim::ClusterSimResult& r) {
  const workload::BenchSummary& s = r.summary;
  std::printf("mode %s, policy %s: sent %llu, completed %llu, failed %llu\n", r.mode.c_str(),
              r.policy.c_str(), static_cast<unsigned long long>(r.sent_count),
              static_cast<unsigned long long>(r.completed_count),
              static_cast<unsigned long long>(r.failed_count));
  for (const auto& [kind, n] : r.failed_by_kind) {
    std::printf("  failed %s: %llu\n", kind.c_str(), static_cast<unsigned long long>(n));
  }
  print_stats("TTFT", s.ttft_ms);
  print_stats("TPOT", s.tpot_ms);
  print_stats("ITL", s.itl_ms);
  print_stats("E2E", s.e2e_ms);
  std::printf("  throughput %.2f req/s, %.0f output tok/s; prefix hit rate %.4f (token-weighted)\n",
              s.request_throughput_per_s, s.output_token_throughput_per_s, r.hit_rate);
  uint64_t drafts = 0, drafted = 0, accepted = 0, steps = 0;
  for (const auto& i : r.instances) {
    if (i.name.rfind("decode", 0) != 0) continue;
    drafts += i.spec_drafts_count;
    drafted += i.spec_draft_tokens_count;
    accepted += i.spec_accepted_tokens_count;
    steps += i.steps_count;
  }
  if (drafts > 0) {
    std::printf("  speculation: %llu drafts of %.2f tokens, %.2f accepted per draft (%.0f%%); "
                "%llu decode steps\n",
                static_cast<unsigned long long>(drafts), double(drafted) / double(drafts),
                double(accepted) / double(drafts), 100.0 * double(accepted) / double(drafted),
                static_cast<unsigned long long>(steps));
  }
  std::printf(
      "  simulated %.1f s (%llu events); P/D requests %llu, KV moved "
      "%.3f GB\n",
      r.simulated_ms / 1e3, static_cast<unsigned long long>(r.events_count),
      static_cast<unsigned long long>(r.pd_requests_count),
      static_cast<double>(r.kv_transfer_bytes) / 1e9);
  if (r.tier2_enabled) {
    const auto& t = r.tier2;
    auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
    double share = r.prompt_tokens_count == 0 ? 0.0
                                              : static_cast<double>(t.loaded_tokens) /
                                                    static_cast<double>(r.prompt_tokens_count);
    std::printf(
        "  tier 2: %llu prompts lacked blocks, cost rule declined %llu; %llu lookups (%llu "
        "remote, %llu timed out, %llu blocks over budget); %llu blocks loaded (%.4f of prompt "
        "tokens); %llu blocks "
        "offered: %llu held already, %llu stored, %llu dropped; evicted %llu; corrupt dropped "
        "%llu, read errors %llu; disk %.1f GB read, %.1f GB written, busy %.1f s\n",
        u(t.eligible), u(t.declined), u(t.lookups), u(t.remote_lookups), u(t.lookup_timeouts),
        u(t.over_budget_blocks), u(t.loaded_blocks), share, u(t.offered_blocks), u(t.offered_held_blocks),
        u(t.stored_blocks), u(t.store_dropped_blocks), u(t.evicted_blocks), u(t.corrupt_dropped_blocks),
        u(t.read_errors), static_cast<double>(t.bytes_read) / 1e9,
        static_cast<double>(t.bytes_written) / 1e9, t.disk_busy_s);
  }
  if (!r.faults.empty()) {
    const auto& k = r.fault_counters;
    std::printf(
        "  faults: crashes %llu, restarts %llu, detections %llu, retries %llu, fallbacks %llu, "
        "pull failures %llu, prefill timeouts %llu, request timeouts %llu, lost streams %llu\n",
        static_cast<unsigned long long>(k.crashes), static_cast<unsigned long long>(k.restarts),
        static_cast<unsigned long long>(k.detections), static_cast<unsigned long long>(k.retries),
        static_cast<unsigned long long>(k.fallbacks),
        static_cast<unsigned long long>(k.pull_failures),
        static_cast<unsigned long long>(k.prefill_timeouts),
        static_cast<unsigned long long>(k.request_timeouts),
        static_cast<unsigned long long>(k.lost_streams));
  }
}

// The first invariant violation, with what replays it; true when there was one.
bool print_violation(const sim::ClusterSimResult& r, const std::string& replay) {
  if (r.violation.empty()) return false;
  std::printf("INVARIANT VIOLATED (seed %llu, t = %.3f ms): %s\n  replay: %s\n",
              static_cast<unsigned long long>(r.seed), r.violation_ms, r.violation.c_str(),
              replay.c_str());
  return true;
}

std::string seed_text(uint64_t seed) { return std::to_string(seed); }

// --swarm K: seeds seed .. seed + K - 1, one line each, then a summary.
int run_swarm(uint64_t seed, uint64_t count) {
  std::vector<uint64_t> failed;
  uint64_t sent = 0, crashes = 0, retries = 0;
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t s = seed + k;
    auto c = sim::make_swarm_case(s);
    if (!c) {
      std::printf("seed %llu: cannot build the case: %s\n", static_cast<unsigned long long>(s),
                  c.error().describe().c_str());
      failed.push_back(s);
      continue;
    }
    auto r = sim::run_cluster_sim(c->config, c->requests);
    if (!r) {
      std::printf("seed %llu: %s | error: %s\n", static_cast<unsigned long long>(s),
                  c->shape.c_str(), r.error().describe().c_str());
      failed.push_back(s);
      continue;
    }
    std::printf("%s\n", sim::swarm_line(s, *c, *r).c_str());
    std::fflush(stdout);
    sent += r->sent_count;
    crashes += r->fault_counters.crashes;
    retries += r->fault_counters.retries;
    if (!r->violation.empty()) {
      std::printf("  replay: tandem sim --swarm-case --seed %llu\n",
                  static_cast<unsigned long long>(s));
      failed.push_back(s);
    }
  }
  std::printf("swarm: %llu seeds from %llu, %zu failed; %llu requests, %llu crashes, %llu "
              "retries\n",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(seed),
              failed.size(), static_cast<unsigned long long>(sent),
              static_cast<unsigned long long>(crashes), static_cast<unsigned long long>(retries));
  for (uint64_t s : failed) {
    std::printf("  failed: tandem sim --swarm-case --seed %llu\n",
                static_cast<unsigned long long>(s));
  }
  return failed.empty() ? 0 : 1;
}

// The trace's hit-rate ceiling over the requests this run sent, in send order.
void print_hit_bound(const sim::ClusterSimResult& r,
                     const std::vector<workload::Request>& requests, uint32_t block_tokens) {
  RT_ASSERT(r.timelines.size() == r.sent_request_indexes.size(), r.timelines.size());
  std::vector<std::pair<double, uint32_t>> by_send;
  for (size_t i = 0; i < r.timelines.size(); ++i) {
    by_send.emplace_back(r.timelines[i].send_ms, r.sent_request_indexes[i]);
  }
  std::stable_sort(by_send.begin(), by_send.end());
  std::vector<uint32_t> order;
  for (const auto& entry : by_send) order.push_back(entry.second);
  sim::HitBound b = sim::prefix_hit_bound(requests, order, block_tokens);
  double first = b.first_turn_tokens_count == 0
                     ? 0.0
                     : static_cast<double>(b.first_turn_reusable_count) /
                           static_cast<double>(b.first_turn_tokens_count);
  std::printf(
      "  prefix hit rate ceiling %.4f (infinite caches, ideal routing; first turns %.4f of "
      "%.1f%% of the tokens)\n",
      b.hit_rate_max, first,
      b.prompt_tokens_count == 0 ? 0.0
                                 : 100.0 * static_cast<double>(b.first_turn_tokens_count) /
                                       static_cast<double>(b.prompt_tokens_count));
}

}  // namespace

int cmd_sim(cli::Args args) {
  cli::Flags f = sim_flags();
  int exit_code = 0;
  if (!f.parse(args, &exit_code)) return exit_code;
  uint64_t seed = 0;
  if (f.has("seed")) {
    auto given = f.get_int("seed");
    if (!given || *given < 0) return 2;
    seed = static_cast<uint64_t>(*given);
  } else {
    seed = std::random_device{}() & 0x7fffffffu;
  }
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  if (f.has("swarm")) {
    auto count = f.get_int("swarm");
    if (!count || *count < 1) {
      std::fprintf(stderr, "tandem sim: --swarm: expected a count >= 1\n");
      return 2;
    }
    return run_swarm(seed, static_cast<uint64_t>(*count));
  }
  std::optional<SimRun> run;
  std::string replay;
  if (f.has("swarm-case")) {
    auto c = sim::make_swarm_case(seed);
    if (!c) {
      std::fprintf(stderr, "tandem sim: %s\n", c.error().describe().c_str());
      return 2;
    }
    std::printf("case: %s\n", c->shape.c_str());
    run = SimRun{std::move(c->config), std::move(c->requests)};
    replay = "tandem sim --swarm-case --seed " + seed_text(seed);
  } else {
    run = prepare_sim(f, seed);
    if (!run) return 2;
    replay = "tandem sim";
    for (char* const arg : args) replay += " '" + std::string(arg) + "'";
    if (!f.has("seed")) replay += " --seed " + seed_text(seed);
  }
  auto started = std::chrono::steady_clock::now();
  auto result = sim::run_cluster_sim(run->config, run->requests);
  double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!result) {
    std::fprintf(stderr, "tandem sim: %s\n", result.error().describe().c_str());
    return result.error().kind == ErrorKind::invalid ? 2 : 1;
  }
  std::fprintf(stderr, "tandem sim: %.2f s wall\n", wall_s);
  if (!result->faults.empty()) std::printf("faults: %s\n", result->faults.c_str());
  print_result(*result);
  bool violated = print_violation(*result, replay);
  print_hit_bound(*result, run->requests, run->config.hash_tokens());
  if (f.has("json")) {
    std::ofstream out(f.get("json"), std::ios::binary);
    out << sim::to_json(*result, f.has("timelines"));
    if (!out) {
      std::fprintf(stderr, "tandem sim: --json: cannot write %s\n", f.get("json").c_str());
      return 1;
    }
  }
  if (f.has("svg-dir")) {
    std::string subtitle = result->mode + ", " + result->policy;
    Status wrote = bench::write_files(f.get("svg-dir"),
                                      bench::request_plots(result->timelines, subtitle));
    if (!wrote) {
      std::fprintf(stderr, "tandem sim: --svg-dir: %s\n", wrote.error().message.c_str());
      return 1;
    }
  }
  return violated ? 1 : 0;
}

}  // namespace tandem::tools
