// tandem/actors/decode: lossless verification of speculative drafts (issue 14). Pure: no
// threads, clocks or I/O; randomness comes from the caller's uniform source, so a sequence's
// own RNG keeps its stream reproducible.
//
// A decode pass over {last token, d_1 .. d_k} gives k + 1 target rows; row i is the target's
// distribution for the token after position i (after penalties, temperature and top-k/top-p/
// min-p: the same processing the sampler applies, devices/sampling.hpp). Verification emits
// the accepted drafts and then one token of the target's, so every step makes progress:
//   greedy: accept d_i while it is row i's argmax (lowest index wins ties, as the sampler);
//           then row n's argmax (n = accepted).
//   sampled, drafts with probabilities q_i (EAGLE-3): accept d_i with probability
//           min(1, p_i(d_i) / q_i(d_i)); on a rejection draw from norm(max(0, p_i - q_i)).
//   sampled, point-mass drafts (n-gram, suffix: q_i = 1 at d_i): accept with probability
//           p_i(d_i); on a rejection draw from p_i with d_i removed (norm(max(0, p_i - q_i))
//           for the point mass).
//   All accepted: the bonus token is drawn from row k.
// (Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318.) Each emitted token is
// distributed exactly as sampling the target alone would give (tests/unit/test_spec_verify
// checks it with a chi-square test that a wrong rule fails).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::decode {

struct Verified {
  uint32_t accepted = 0;  // drafts accepted (0..k)
  int32_t next = 0;       // the target's token after them (a correction or the bonus)
};

// Lowest index of the largest value. Precondition: row not empty.
int32_t argmax_of(std::span<const float> row);

// rows: (k + 1) x vocab target logits or probabilities (argmax is the same), row-major.
// invalid: rows.size() != (drafts.size() + 1) * vocab, vocab == 0, a draft outside [0, vocab).
Result<Verified> verify_greedy(std::span<const float> rows, uint32_t vocab,
                               std::span<const int32_t> drafts);

// rows: (k + 1) x vocab target probabilities (each row sums to 1, filtered tokens 0).
// draft_q: empty (point-mass drafts) or k x vocab draft probabilities. unit(): uniform in
// [0, 1). invalid as above, plus draft_q of another size, a negative or NaN probability, a row
// that sums to 0, or a draft whose q is 0 (it could not have been drawn).
Result<Verified> verify_sampled(std::span<const float> rows, uint32_t vocab,
                                std::span<const int32_t> drafts, std::span<const float> draft_q,
                                const std::function<double()>& unit);

// The same rule with the target rows made on demand: row(i) is asked for only once verification
// reaches position i (at most accepted + 1 rows; a row is a vocab-sized processed distribution,
// so computing only those a step reaches is what decode saves). row(i)'s errors are returned;
// a row is checked as above when it arrives.
using TargetRow = std::function<Result<std::span<const float>>(size_t i)>;
Result<Verified> verify_sampled_rows(const TargetRow& row, uint32_t vocab,
                                     std::span<const int32_t> drafts,
                                     std::span<const float> draft_q,
                                     const std::function<double()>& unit);

}  // namespace tandem::decode
