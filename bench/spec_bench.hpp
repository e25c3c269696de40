// `tandem bench spec`: the speculative proposers offline (issue 14). For each method (n-gram,
// suffix) and workload it replays agent-like requests through the proposer as decode would
// use it: the prompt appended, then per step a draft of up to k tokens, verified greedily
// against the request's true continuation (accepted = the draft's prefix equal to it), and the
// accepted tokens plus the target's next one appended. It reports the mean accepted tokens
// per step, tokens per step, and the proposer's CPU time per step beside a baseline measured
// in the same run: one Sampler::sample over a MiniMax-M2-sized vocabulary row (200,064), the
// CPU work decode already does per token. No device: this measures what a proposer can
// accept and what it costs, not end-to-end speed.
//   repetitive: each request's prompt holds a "file" and its output rewrites it with ~2% of
//               tokens edited (coding agents echo what they were shown); requests differ in
//               their edits and share the file, so the suffix cache sees earlier outputs.
//   fresh:      outputs unrelated to the prompt and to each other (nothing to copy).
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_spec_bench(cli::Args args);

}  // namespace tandem::bench
