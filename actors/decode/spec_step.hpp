// tandem/actors/decode: one speculating sequence's verification, from a decode pass's output
// to the tokens it emits (issue 14). Pure: no threads, clocks or I/O.
//
// Row i of the pass (i = 0..d) predicts the token after {history, d_1..d_i}. Greedy
// (temperature 0): row i's argmax after penalties over that history (the sampler's greedy
// choice; no softmax is computed), drafts accepted while they equal it. Sampled: each row
// reached is processed as the sampler processes it (Sampler::distribution: penalties,
// temperature, top-k/p, min-p) and spec_verify's rejection rule runs with the drafts as point
// masses; a row after the first rejection is never processed. The coins come from the stream
// of the first emitted token's position (devices::seeded_at), so a seeded request replays
// exactly. With no drafts, greedy is one argmax: the decode shell's fast path for greedy.
// Token-producing devices (sim) give one chosen token per row: a draft is accepted while it
// equals the row's token (the device is its own argmax).
//
// When the request asks for logprobs, each emitted token carries the target's logprob and top-N:
// what sampling that row alone would report for it (Sampler::score); otherwise only the token
// and is_stop.
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
  // With tokens: the emitted rows' tokens scored beside the device (DecodeSeq::logprobs_top_n),
  // the logprobs reported for them; empty: the device only chose (logprob 0, itself the top).
  std::span<const devices::SampledToken> scored;
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
