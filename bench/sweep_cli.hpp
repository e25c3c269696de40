// `tandem bench sweep` (issue 5): flags -> a back-end -> run_sweep (bench/sweep.hpp) -> the
// table on stdout and, in --out DIR: sweep.txt, sweep.json, sweep.csv, one SVG per metric
// (ttft_p50, ttft_p90, hit_rate, output_throughput) and points/NAME-cN.json per point.
//
// Back-ends:
//   --sim: each point is `tandem sim` in-process (tools/sim_setup.hpp) with --seed, --sessions
//     = the concurrency, --duration-s, the workload flags, and the configuration's spec: a
//     manifest path (ends in .toml or has a '/') or comma-separated tandem sim flags,
//     `key:value` or `switch` (e.g. `policy:round-robin,aggregated,prefill:2,decode:6`).
//   real (default): each configuration is a manifest; its cluster is started with
//     `tandem up MANIFEST` (the launcher), /health awaited on the gateway node's http_port,
//     then `tandem bench serve` runs in-process per concurrency, and the cluster is stopped
//     (SIGTERM to `tandem up`). `--target HOST:PORT`: an already running cluster, one
//     configuration (its --config spec is only a label; without --config the name is
//     "target").
// Exit: 0 every request succeeded, 3 some requests failed, 1 the sweep failed, 2 bad flags.
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_sweep_cli(cli::Args args);

}  // namespace tandem::bench
