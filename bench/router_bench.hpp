// Router pick benchmark (issue 4): 64 instances, a 200,000-token prompt with its block hashes
// precomputed, a warm index; reports pick latency p50/p99 and picks/s. The lead wires
// run_router_bench_cli() into `tandem bench router`; bench/router_bench_main.cpp runs it alone.
// Not a core: it reads the steady clock. Single-threaded; allocates the index (~100 MB).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/cli.hpp"

namespace tandem::bench {

struct RouterBenchOptions {
  uint32_t instances_count = 64;  // half decode, half prefill
  uint64_t prompt_tokens = 200000;
  uint32_t block_tokens = 16;     // 16 -> 12,500 hashes; 4096 -> 48
  uint32_t picks_count = 20000;   // timed picks per scenario
  uint32_t filler_blocks = 2000;  // unrelated blocks each instance also holds
};

struct RouterBenchScenario {
  // typical: every instance holds the system prompt, four decode instances all of it;
  // spread: each instance holds a different leading length (the bisection's worst case);
  // turn+N: agent turns, each adding N new blocks (~1,250 tokens) to a growing history.
  std::string name;
  uint32_t match_lengths_distinct = 0;  // distinct leading-hit lengths among instances
  double decide_p50_us = 0, decide_p99_us = 0;  // RouterCore::decide (the reply waits on it)
  double record_p50_us = 0, record_p99_us = 0;  // RouterCore::record (after the reply)
  double record_ns_per_block = 0;  // summed record time / blocks newly recorded (0: none)
  uint64_t recorded_blocks_count = 0;
  double p50_us = 0, p99_us = 0, max_us = 0;  // decide + record (= pick), per pick
  double picks_per_s = 0;  // picks_count / summed pick time
  // The machine's reference, timed between this scenario's picks: a chain of
  // kReferenceLoads dependent loads at random places in 64 MiB (each a cache and usually a
  // TLB miss, like a bisection probe). Its p99 next to decide's shows how much of decide's
  // tail is this machine's memory latency and preemption at that minute.
  double reference_p50_us = 0, reference_p99_us = 0;
};

// Dependent loads per reference chain (about the misses of a 12,500-block bisection).
inline constexpr uint32_t kReferenceLoads = 32;

struct RouterBenchResult {
  uint32_t block_tokens = 0;
  uint32_t blocks_count = 0;     // hashes per prompt
  size_t index_nodes_count = 0;  // distinct blocks in the index after warm-up
  double cold_pick_us = 0;       // mean pick of a never-seen prompt (inserts every block)
  double cold_decide_us = 0;     // its decide part
  double cold_record_ns_per_block = 0;  // its record part, per block recorded
  std::vector<RouterBenchScenario> scenarios;
};

RouterBenchResult run_router_bench(const RouterBenchOptions& options);
std::string describe(const RouterBenchResult& result);  // a small text table

// `tandem bench router` (flags: --picks, --instances, --filler-blocks, --block-tokens);
// prints describe() per block size. Returns a process exit code (2 for bad flags).
int run_router_bench_cli(cli::Args args);

}  // namespace tandem::bench
