// `tandem bench router [--picks N] [--instances N] [--filler-blocks N] [--block-tokens N]`.
#include <cstdio>
#include <optional>

#include "bench/router_bench.hpp"

namespace tandem::bench {

int run_router_bench_cli(cli::Args args) {
  cli::Flags flags("tandem bench router",
                   "Router pick latency: 64 instances, a 200,000-token prompt with its block "
                   "hashes precomputed, a warm index. Prints per scenario the decision "
                   "(decide) and the recording (record, per pick and per new block) apart, "
                   "their sum (the whole pick) and picks/s. Goal: decide p99 <= 10 us.");
  flags.flag("picks", "N", "timed picks per scenario", "20000")
      .flag("instances", "N", "instances, half decode and half prefill (>= 2)", "64")
      .flag("filler-blocks", "N", "unrelated blocks each instance also holds", "2000")
      .flag("block-tokens", "N", "KV block size; 0 runs both 16 and 4096", "0");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  std::optional<int64_t> picks = flags.get_int("picks");
  std::optional<int64_t> instances = flags.get_int("instances");
  std::optional<int64_t> filler = flags.get_int("filler-blocks");
  std::optional<int64_t> block_tokens = flags.get_int("block-tokens");
  if (!picks || !instances || !filler || !block_tokens) return 2;
  if (*picks < 1 || *instances < 2 || *instances > 65536 || *filler < 0 || *block_tokens < 0 ||
      *picks > 100000000 || *filler > 100000000 || *block_tokens > 200000) {
    std::fprintf(stderr,
                 "tandem bench router: --picks must be >= 1, --instances in 2..65536, "
                 "--filler-blocks >= 0, --block-tokens in 0..200000\n");
    return 2;
  }
  RouterBenchOptions options;
  options.picks_count = static_cast<uint32_t>(*picks);
  options.instances_count = static_cast<uint32_t>(*instances);
  options.filler_blocks = static_cast<uint32_t>(*filler);
  std::vector<uint32_t> sizes{16, 4096};
  if (*block_tokens > 0) sizes = {static_cast<uint32_t>(*block_tokens)};
  for (uint32_t size : sizes) {
    options.block_tokens = size;
    std::fputs(describe(run_router_bench(options)).c_str(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tandem::bench
