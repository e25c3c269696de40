// `tandem bench rbln-pipeline --library LIB`: how much of a pipelined prefill's stage time the
// wavefront overlaps (devices/rbln/rbln_device.hpp). The RBLN runtime is the conformance fake
// (tests/rbln_fake, built as build/tests/librbln_fake.so) on a synthesized 12-layer model, each
// graph run waiting `--delay-ms` scaled by its stage's share of the layers (a stand-in for device
// time). One pass of 8 sequences x 128 tokens (16 chunks of 64) per pipeline depth P in 1, 2, 3,
// 4, 6, run twice: with the delay, and without it (the fake's own cpu compute, which it
// serializes). Their difference, the device time the pass took, is printed beside the wavefront's
// ideal ((chunks + P - 1) x delay / P), and the pass beside the one-graph pass of the same run.
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_rbln_pipeline_bench(cli::Args args);

}  // namespace tandem::bench
