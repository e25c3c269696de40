// tandem/actors/decode: the drafter a decode sequence speculates with (issue 14). Pure: no
// threads, clocks or I/O. It wraps one proposer (n-gram prompt lookup or suffix decoding),
// fed the sequence's context token by token, and sizes its drafts:
//
//   k (the draft length asked for) starts at draft_tokens_max and follows the sequence's
//   recent acceptance: after a step that accepted a of d drafted tokens, k = d + 1 when all
//   were accepted (at most draft_tokens_max), else a + 1. A draft that misses costs one
//   pass's extra rows; a sequence whose drafts keep missing drafts 1 token a step.
//
// The instance's shared state (the suffix cache of recent outputs) is SpecShared; a drafter
// only reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "actors/decode/ngram_proposer.hpp"
#include "actors/decode/suffix_tree.hpp"
#include "runtime/base/result.hpp"

namespace tandem::decode {

enum class SpecMethod { none, ngram, suffix };
std::string_view to_string(SpecMethod method);

struct SpecConfig {
  SpecMethod method = SpecMethod::none;
  uint32_t draft_tokens_max = 4;  // 1..16: k, at most
  // Speculation is off for a step when more sequences than this run: a large batch is
  // compute-bound, so extra rows cost about what they save. Drafts also use only the step's
  // token budget left after every running sequence's one token (DecodeScheduler).
  uint32_t batch_max = 32;        // >= 1
  NgramConfig ngram;
  SuffixConfig suffix;
  // invalid, naming the key (speculative.<key>), its value and its rule.
  Status validate() const;
};

// What the instance's drafters share: the suffix cache of recent outputs.
class SpecShared {
 public:
  explicit SpecShared(const SpecConfig& config);
  // A finished sequence's generated tokens (suffix only; others ignore it).
  void add_output(std::vector<int32_t> output);
  const SuffixCache* suffix_cache() const { return cache_.get(); }

 private:
  std::unique_ptr<SuffixCache> cache_;
};

class Drafter {
 public:
  // Precondition (asserted): config.validate() ok and method != none; `shared` outlives it.
  Drafter(const SpecConfig& config, const SpecShared& shared);

  void append(std::span<const int32_t> tokens);
  // At most min(k, limit) tokens; may be empty.
  std::vector<int32_t> propose(uint32_t limit) const;
  // After verification: `accepted` of `drafted` (> 0) drafts were accepted.
  void on_verified(uint32_t drafted, uint32_t accepted);
  uint32_t k() const { return k_; }
  size_t context_size() const;

 private:
  uint32_t k_max_;
  uint32_t k_;
  std::variant<NgramProposer, SuffixProposer> proposer_;
};

}  // namespace tandem::decode
