// Standalone runner for the router pick benchmark: `build/bench/router_bench [picks
// [filler_blocks]]`.
#include <cstdio>
#include <cstdlib>

#include "bench/router_bench.hpp"

int main(int argc, char** argv) {
  tandem::bench::RouterBenchOptions options;
  if (argc > 1) options.picks_count = static_cast<uint32_t>(std::strtoul(argv[1], nullptr, 10));
  if (argc > 2) options.filler_blocks = static_cast<uint32_t>(std::strtoul(argv[2], nullptr, 10));
  if (options.picks_count == 0) {
    std::fprintf(stderr, "router_bench: picks must be a positive integer\n");
    return 2;
  }
  for (uint32_t block_tokens : {16u, 4096u}) {
    options.block_tokens = block_tokens;
    std::fputs(describe(run_router_bench(options)).c_str(), stdout);
  }
  return 0;
}
