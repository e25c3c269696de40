// tandem/actors/decode: the n-gram (prompt lookup) proposer for speculative decoding (issue
// 14). Pure: no threads, clocks or I/O.
//
// A sequence's context (prompt, then each generated token) is appended token by token. A
// proposal is the tokens that followed the most recent earlier occurrence of the context's
// longest suffix whose length is in [match_tokens_min, match_tokens_max] (vLLM's prompt
// lookup: coding agents repeat what they were shown, so the continuation of an earlier copy
// is often the next thing written). At most `draft_tokens` tokens; fewer when the earlier
// occurrence is close to the end of the context; none when no suffix of at least
// match_tokens_min tokens occurred before.
//
// Index: every position's match_tokens_min-gram, by a 64-bit hash, chained to the previous
// position with the same hash (head_: hash -> latest end, prev_: end -> the end before it).
// A proposal walks at most candidates_max of the chain, newest first, and measures each
// candidate's match length backwards token by token, so a hash collision never proposes.
// Cost: append O(1) amortized; propose O(candidates_max x match_tokens_max + draft_tokens).
// Memory: 4 bytes per context token plus one map entry per distinct gram, bounded by the
// context (itself bounded by the model's max tokens).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::decode {

struct NgramConfig {
  uint32_t match_tokens_min = 2;  // >= 1
  uint32_t match_tokens_max = 8;  // >= match_tokens_min
  uint32_t candidates_max = 8;    // earlier occurrences a proposal considers, newest first; >= 1
  // invalid, naming the key and its value.
  Status validate() const;
};

class NgramProposer {
 public:
  // Precondition (asserted): config.validate() is ok.
  explicit NgramProposer(NgramConfig config);

  void append(int32_t token);
  void append(std::span<const int32_t> tokens);
  // Up to `draft_tokens` tokens (see above); empty when nothing matched or draft_tokens == 0.
  std::vector<int32_t> propose(uint32_t draft_tokens) const;
  // The length of the suffix match the last proposal-worthy candidate had (0: none), for
  // tests and for sizing a draft by its match (as suffix decoding does).
  uint32_t match_tokens() const;

  size_t size() const { return tokens_.size(); }
  std::span<const int32_t> tokens() const { return tokens_; }

 private:
  struct Match {
    uint32_t end = 0;     // one past the earlier occurrence's last token
    uint32_t length = 0;  // 0: none
  };
  Match best_match() const;
  uint64_t gram_hash(size_t end) const;  // of tokens_[end - min, end)

  NgramConfig config_;
  std::vector<int32_t> tokens_;
  std::vector<uint32_t> prev_;  // prev_[end]: the previous end with the same gram hash, or 0
  std::unordered_map<uint64_t, uint32_t> head_;  // gram hash -> latest end
};

}  // namespace tandem::decode
