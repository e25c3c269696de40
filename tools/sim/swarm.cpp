#include "tools/sim/swarm.hpp"

#include <cstdio>
#include <random>

namespace tandem::sim {

Result<SwarmCase> make_swarm_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  auto pick = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };  // [lo, hi]
  auto chance = [&](double p) { return static_cast<double>(rng() >> 11) * 0x1.0p-53 < p; };
  SwarmCase sc;
  ClusterSimConfig& c = sc.config;
  c.seed = seed;
  c.router.seed = seed;
  c.prefill_count = chance(0.3) ? 0 : static_cast<uint32_t>(pick(1, 3));  // 0: aggregated
  c.decode_count = static_cast<uint32_t>(pick(1, 4));
  const router::Policy policies[] = {router::Policy::prefix_aware, router::Policy::round_robin,
                                     router::Policy::random};
  c.router.policy = policies[pick(0, 2)];
  const uint32_t blocks[] = {16, 64, 256};
  c.block_tokens = blocks[pick(0, 2)];
  c.max_model_tokens = 16384;
  uint32_t per_seq = (c.max_model_tokens + c.block_tokens - 1) / c.block_tokens;
  c.kv_blocks = per_seq + static_cast<uint32_t>(pick(0, 2 * per_seq));
  c.prefill_queue_max = static_cast<uint32_t>(pick(1, 32));
  c.prefill_running_max = static_cast<uint32_t>(pick(1, 8));
  c.prefill_held_max = c.prefill_running_max * static_cast<uint32_t>(pick(1, 4));
  c.prefill_step_tokens_max = static_cast<uint32_t>(pick(256, 4096));
  c.prefill_hold_timeout_ms = static_cast<uint32_t>(pick(500, 10000));
  c.decode_waiting_max = static_cast<uint32_t>(pick(1, 32));
  c.decode_seqs_max = static_cast<uint32_t>(pick(1, 16));
  c.decode_step_tokens_max = static_cast<uint32_t>(pick(64, 2048));
  c.load_report_interval_ms = chance(0.2) ? 0 : static_cast<double>(pick(50, 300));
  c.link_bytes_per_s = static_cast<double>(pick(1, 50)) * 1e9;
  c.sessions_in_flight = static_cast<uint32_t>(pick(1, 8));
  c.duration_ms = static_cast<double>(pick(10, 90)) * 1e3;
  c.heartbeat_interval_ms = static_cast<double>(pick(50, 300));
  c.heartbeat_miss_max = static_cast<uint32_t>(pick(2, 6));
  c.prefill_timeout_ms = static_cast<double>(pick(500, 10000));
  c.request_timeout_ms = static_cast<double>(pick(2000, 20000));
  // Fault mix: each kind present with probability 1/2, at 0.01 .. 0.3 per simulated second.
  for (int k = 0; k <= static_cast<int>(FaultKind::hang); ++k) {
    c.faults.random_per_s[k] = chance(0.5) ? static_cast<double>(pick(1, 30)) / 100 : 0;
  }
  if (!c.faults.has_random()) c.faults.random_per_s[static_cast<int>(FaultKind::crash)] = 0.05;
  // A small agentic workload (short prompts and outputs: many requests per simulated second).
  workload::AgenticParams w;
  w.seed = seed;
  w.sessions_in_flight = c.sessions_in_flight;
  w.sessions_count = c.sessions_in_flight * static_cast<uint32_t>(pick(2, 6));
  w.system_prompt_tokens = static_cast<uint32_t>(pick(64, 2048));
  w.repos_count = static_cast<uint32_t>(pick(1, 4));
  w.repo_context_tokens_min = 100;
  w.repo_context_tokens_max = static_cast<uint32_t>(pick(200, 4000));
  w.task_tokens_median = 100;
  w.tool_output_tokens_median = 200;
  w.tool_output_tokens_max = 2000;
  w.output_tokens_min = static_cast<uint32_t>(pick(1, 20));
  w.output_tokens_max = w.output_tokens_min + static_cast<uint32_t>(pick(0, 60));
  w.turns_min = 1;
  w.turns_max = static_cast<uint32_t>(pick(1, 10));
  w.think_time_ms_median = static_cast<double>(pick(10, 1000));
  w.session_start_stagger_ms = static_cast<double>(pick(0, 500));
  w.context_tokens_max = c.max_model_tokens;
  // Tier 2 (drawn last, so the cases without it stay as they were): on in half the P/D
  // cases, small (a few contexts), slow or fast disks, its own faults.
  if (c.prefill_count > 0 && chance(0.5)) {
    ClusterSimConfig::Tier2& t = c.tier2;
    t.enabled = true;
    t.capacity_blocks = per_seq * static_cast<uint32_t>(pick(1, 4));
    t.read_bytes_per_s = static_cast<double>(pick(1, 40)) * 1e9;
    t.write_bytes_per_s = static_cast<double>(pick(1, 40)) * 1e9;
    t.staging_blocks = static_cast<uint32_t>(pick(1, 2 * per_seq));
    t.stores_max = static_cast<uint32_t>(pick(1, 16));
    t.lookups_max = static_cast<uint32_t>(pick(1, 16));
    t.lookup_blocks_max = static_cast<uint32_t>(pick(1, per_seq));
    t.lookup_timeout_ms = static_cast<double>(pick(100, 3000));
    t.hold_timeout_ms = static_cast<double>(pick(200, 10000));
    c.router.tier2_remote_weight = c.router.tier2_weight * static_cast<double>(pick(0, 10)) / 10;
    for (FaultKind k : {FaultKind::ioerr, FaultKind::torn}) {
      c.faults.random_per_s[static_cast<int>(k)] =
          chance(0.5) ? static_cast<double>(pick(1, 30)) / 100 : 0;
    }
  }
  auto requests = workload::generate_agentic(w);
  if (!requests) return requests.error();
  sc.requests = std::move(requests).value();
  char shape[256];
  std::snprintf(shape, sizeof shape,
                "%s %up+%ud %s block %u kv %u seqs %u wait %u queue %u sessions %u %.0fs%s",
                c.prefill_count == 0 ? "agg" : "pd", c.prefill_count, c.decode_count,
                std::string(router::to_string(c.router.policy)).c_str(), c.block_tokens,
                c.kv_blocks, c.decode_seqs_max, c.decode_waiting_max, c.prefill_queue_max,
                c.sessions_in_flight, c.duration_ms / 1e3, c.tier2.enabled ? " tier2" : "");
  sc.shape = shape;
  return sc;
}

std::string swarm_line(uint64_t seed, const SwarmCase& c, const ClusterSimResult& r) {
  const auto& k = r.fault_counters;
  char line[512];
  std::snprintf(line, sizeof line,
                "seed %llu: %s | sent %llu ok %llu failed %llu | crashes %llu detections %llu "
                "retries %llu fallbacks %llu timeouts %llu lost %llu | ",
                static_cast<unsigned long long>(seed), c.shape.c_str(),
                static_cast<unsigned long long>(r.sent_count),
                static_cast<unsigned long long>(r.completed_count),
                static_cast<unsigned long long>(r.failed_count),
                static_cast<unsigned long long>(k.crashes),
                static_cast<unsigned long long>(k.detections),
                static_cast<unsigned long long>(k.retries),
                static_cast<unsigned long long>(k.fallbacks),
                static_cast<unsigned long long>(k.request_timeouts),
                static_cast<unsigned long long>(k.lost_streams));
  std::string s = line;
  if (r.tier2_enabled) {
    char t2[160];
    std::snprintf(t2, sizeof t2, "tier2 loaded %llu stored %llu corrupt %llu ioerr %llu | ",
                  static_cast<unsigned long long>(r.tier2.loaded_blocks),
                  static_cast<unsigned long long>(r.tier2.stored_blocks),
                  static_cast<unsigned long long>(r.tier2.corrupt_dropped_blocks),
                  static_cast<unsigned long long>(r.tier2.read_errors));
    s += t2;
  }
  if (r.violation.empty()) return s + "ok";
  char at[64];
  std::snprintf(at, sizeof at, "VIOLATION at %.3f ms: ", r.violation_ms);
  return s + at + r.violation;
}

}  // namespace tandem::sim
