// Standalone runner for the router pick benchmark: `build/bench/router_bench [flags]`
// (the same flags as `tandem bench router`; --help lists them).
#include "bench/router_bench.hpp"

int main(int argc, char** argv) {
  return tandem::bench::run_router_bench_cli(tandem::cli::Args(argv + 1, argc - 1));
}
