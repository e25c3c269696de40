// tandem/actors/decode: one speculating sequence's verification, from a decode pass's output
// to the tokens it emits (issue 14). Pure: no threads, clocks or I/O.
//
// Row i of the pass (i = 0..d) predicts the token after {history, d_1..d_i}; each row is
// processed as the sampler processes it (penalties over that history, temperature, top-k/p,
// min-p: Sampler::distribution), then spec_verify's rule runs: greedy (temperature 0) or
// rejection sampling with the drafts as point masses. The coins come from the stream of the
// first emitted token's position (devices::seeded_at), so a seeded request replays exactly.
// Token-producing devices (sim) give one chosen token per row: a draft is accepted while it
// equals the row's token (the device is its own argmax).
//
// Each emitted token carries the target's logprob (and top-N when asked): what sampling that
// row alone would report for it (Sampler::score).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "devices/sampling.hpp"
#include "runtime/base/result.hpp"

namespace tandem::decode {

struct SpecRows {
  std::span<const float> logits;   // (d + 1) x vocab, or empty
  std::span<const int32_t> tokens;  // d + 1 chosen tokens (a token-producing device), or empty
};

struct Emitted {
  std::vector<devices::SampledToken> tokens;  // accepted drafts, then the target's token
  uint32_t accepted = 0;
};

// params: the request's (validated); position: the output index of the first token emitted;
// history: what the sampler penalizes before the pass (prompt + generated). Errors
// (failed): too few rows for the drafts; invalid: a bad logit or token (as the sampler's).
Result<Emitted> verify_step(const devices::SamplingParams& params, uint32_t position,
                            const SpecRows& rows, uint32_t vocab, std::span<const int32_t> drafts,
                            std::span<const int32_t> history);

}  // namespace tandem::decode
