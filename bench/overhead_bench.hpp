// `tandem bench overhead` (issue 4): the serving path's added latency per request.
//
// Starts a one-node cluster (gateway, router, prefill, decode; two `sim` executors with
// time_factor 0, so the device itself costs only its host work) as a child `tandem node`
// process with a manifest in a temp dir and free ports, then drives it with the
// `tandem bench serve` client (bench/serve_bench) using short requests (16 prompt tokens;
// 1 and 16 output tokens) at 1, 64 and 1000 concurrent streams. The baseline, measured in
// the same run, is the same sim device driven directly in-process (make_device, one
// prefill + the decode steps per request). Added latency = cluster e2e - direct e2e, per
// percentile. Goal: < 0.5 ms p99. Prints a table to stdout; returns an exit code.
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_overhead_bench(cli::Args args);

// `tandem bench isolation`: one stream's largest gap between chunks alone and while long
// prompts arrive at the gateway (count_tokens), same cluster, same run; prints both and
// their ratio per round.
int run_isolation_bench(cli::Args args);

// `tandem bench admission`: short requests' latency while long prompts are being prepared at
// the gateway, alone and during; one preparer for all requests beside the default preparers
// (a cluster each, same run).
int run_admission_bench(cli::Args args);

}  // namespace tandem::bench
