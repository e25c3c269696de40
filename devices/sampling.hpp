// tandem/devices: the sampling core. Pure: no threads, clocks or I/O.
//
// Turns one row of logits (one position of one sequence) into a token. The pipeline, in
// order (the same one every backend uses, so cpu and sim sample alike):
//   1. repetition_penalty (HF): for each distinct token in `history`,
//        logit > 0 ? logit / penalty : logit * penalty
//   2. presence/frequency penalty (OpenAI): for each token with count c > 0 in `history`,
//        logit -= presence_penalty + frequency_penalty * c
//   3. temperature == 0: greedy. The token is the argmax of the penalized logits (lowest
//      index wins ties); logprobs are the log-softmax of the penalized logits (no filters).
//   4. otherwise logits / temperature, softmax, then filters on the probabilities:
//        top_k  (keep the k most probable; 0 = off),
//        top_p  (keep the smallest most-probable head whose mass reaches top_p; 1 = off),
//        min_p  (drop tokens with p < min_p * p_max; 0 = off),
//      renormalize over the kept tokens and draw one with the sequence's own RNG.
// Logprobs (the chosen token's and the top-N) are the log-softmax of that processed
// distribution: filtered tokens have probability 0 and never appear in the top-N.
//
// `history` is whatever the caller wants penalized: the serving path passes the prompt
// plus the generated tokens (as HF does for repetition_penalty). Penalties are off at their
// defaults, so passing a history costs nothing then.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::devices {

inline constexpr int32_t logprobs_top_n_max = 20;

struct SamplingParams {
  float temperature = 1.0f;          // >= 0; 0 = greedy
  int32_t top_k = 0;                 // >= 0; 0 = off
  float top_p = 1.0f;                // (0, 1]; 1 = off
  float min_p = 0.0f;                // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;   // > 0; 1 = off
  float presence_penalty = 0.0f;     // [-2, 2]
  float frequency_penalty = 0.0f;    // [-2, 2]
  std::vector<int32_t> stop_token_ids;  // each >= 0 (and < vocab when a vocab is given)
  uint64_t seed = 0;
  int32_t logprobs_top_n = 0;        // [0, 20]
  // The caller reports logprobs (the sampled token's; plus logprobs_top_n alternatives).
  // The sampler always computes the sampled token's logprob; this only travels with the
  // request so shells know whether to send it.
  bool logprobs = false;

  // Checks every field. vocab_count > 0 also checks stop_token_ids < vocab_count.
  // Error (invalid) names the parameter, the value and the allowed range, e.g.
  // "sampling: top_p = 1.5 is outside (0, 1]".
  Status validate(int64_t vocab_count = 0) const;

  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

// Same check, returning the params for chaining.
Result<SamplingParams> validate(SamplingParams params, int64_t vocab_count = 0);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;  // natural log; <= 0
  friend bool operator==(const TokenLogprob&, const TokenLogprob&) = default;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;           // of `token` under the processed distribution
  std::vector<TokenLogprob> top;  // the logprobs_top_n most probable, descending
  bool is_stop = false;           // token is one of stop_token_ids
};

// One per sequence. Owns the RNG (std::mt19937_64 seeded with params.seed; uniform draws
// built from its raw 64-bit output, so streams are identical across runs and toolchains).
// Same params + same logits + same history, call for call -> the same tokens.
class Sampler {
 public:
  // Precondition (asserted): params.validate() is ok.
  explicit Sampler(SamplingParams params);

  // logits: one row, vocab-sized (its size is the vocab). history: token ids < logits.size().
  // Errors (invalid): empty logits, a NaN logit, a history token outside [0, vocab).
  // Cost: O(vocab) plus a sort of the kept head when top_k / top_p are on.
  Result<SampledToken> sample(std::span<const float> logits, std::span<const int32_t> history);
  // The processed distribution `sample` draws from (steps 1-4), one probability per token
  // into `out` (resized to the vocab): filtered tokens 0; greedy: 1 at the argmax (whose
  // reported logprob stays the unfiltered log-softmax, step 3). What
  // speculative verification tests drafts against (actors/decode/spec_verify.hpp). Errors as
  // sample's. Draws nothing from the RNG.
  Status distribution(std::span<const float> logits, std::span<const int32_t> history,
                      std::vector<float>& out);
  // What `sample` would report had it drawn `token` from this row: its logprob under the
  // processed distribution (greedy: the unfiltered log-softmax, as sample_greedy reports),
  // the top-N and is_stop. A token the filters drop gets -inf. Speculation reports the
  // target's logprobs of accepted drafts with it. Errors as sample's, plus a token outside
  // the vocabulary. Draws nothing from the RNG.
  Result<SampledToken> score(std::span<const float> logits, std::span<const int32_t> history,
                             int32_t token);
  // A uniform draw in [0, 1) from this sequence's stream (verification's coins).
  double unit() { return next_unit(); }

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;          // penalized logits, reused between calls
  std::vector<double> weight_;       // exp((logit - max) / temperature), reused
  std::vector<int32_t> order_;       // indices sorted by probability, reused
  std::vector<uint32_t> counts_;     // history counts, reused (cleared after each call)

  double next_unit();  // uniform in [0, 1)
  // Checks the row and history, then work_ (penalized) and weight_ (exp((l - max) / T)).
  Status prepare(std::span<const float> logits, std::span<const int32_t> history);
  void keep_filtered();  // order_: the tokens the filters keep (top-k / top-p, then min-p)
  void fill_top(SampledToken& out, std::span<const int32_t> kept, bool kept_sorted,
                double log_total);
  SampledToken sample_greedy();
  SampledToken sample_random();
  void keep_head();  // top_k / top_p over order_ (sorted by weight, descending)
};

// The params of the sampler that draws output token `position` of a request: its own stream
// per position, so a token does not depend on how many draws came before it (a retry, a
// preemption or a speculative step cannot shift later tokens' streams).
SamplingParams seeded_at(const SamplingParams& params, uint32_t position);

// Exposed for tests and other backends: steps 1-2 in place (logits is the row to modify).
// Precondition (asserted): every history token is in [0, logits.size()).
void apply_penalties(const SamplingParams& params, std::span<float> logits,
                     std::span<const int32_t> history, std::vector<uint32_t>& counts_scratch);

}  // namespace tandem::devices
