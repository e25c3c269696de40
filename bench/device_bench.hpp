// `tandem bench device`: cpu Device prefill/decode throughput at batch 1, 8, 32 beside the
// decode memory-bandwidth bound (weight bytes per step / stream bandwidth measured in the same
// run). Prints a table to stdout. Returns a process exit code.
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_device_bench(cli::Args args);

}  // namespace tandem::bench
