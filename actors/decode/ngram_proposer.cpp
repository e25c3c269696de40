#include "actors/decode/ngram_proposer.hpp"

#include <algorithm>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::decode {

Status NgramConfig::validate() const {
  auto bad = [](const char* key, uint32_t value, const char* rule) {
    return make_error(ErrorKind::invalid, std::string("ngram: ") + key + " = " +
                                              std::to_string(value) + " " + rule);
  };
  if (match_tokens_min < 1) return bad("match_tokens_min", match_tokens_min, "is below 1");
  if (match_tokens_max < match_tokens_min) {
    return bad("match_tokens_max", match_tokens_max, "is below match_tokens_min");
  }
  if (candidates_max < 1) return bad("candidates_max", candidates_max, "is below 1");
  return {};
}

NgramProposer::NgramProposer(NgramConfig config) : config_(config) {
  RT_ASSERT(config_.validate().ok(), config_.validate().error().describe());
  prev_.push_back(0);  // end 0: no gram ends there
}

uint64_t NgramProposer::gram_hash(size_t end) const {
  // FNV-1a over the gram's tokens: collisions only cost a candidate, never a wrong draft.
  uint64_t h = 1469598103934665603ull;
  for (size_t i = end - config_.match_tokens_min; i < end; ++i) {
    h ^= static_cast<uint32_t>(tokens_[i]);
    h *= 1099511628211ull;
  }
  return h;
}

void NgramProposer::append(int32_t token) {
  tokens_.push_back(token);
  const size_t end = tokens_.size();
  uint32_t before = 0;
  if (end >= config_.match_tokens_min) {
    uint32_t& head = head_[gram_hash(end)];
    before = head;
    head = static_cast<uint32_t>(end);
  }
  prev_.push_back(before);
  RT_ASSERT(prev_.size() == tokens_.size() + 1, prev_.size(), tokens_.size());
}

void NgramProposer::append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) append(t);
}

NgramProposer::Match NgramProposer::best_match() const {
  const size_t n = tokens_.size();
  Match best;
  if (n < config_.match_tokens_min + 1) return best;
  // The chain of ends with the current suffix's gram hash, newest first, the suffix itself out.
  uint32_t end = prev_[n];
  for (uint32_t seen = 0; end > 0 && seen < config_.candidates_max; ++seen, end = prev_[end]) {
    RT_ASSERT(end < n, end, n);
    uint32_t length = 0;
    const uint32_t reach = std::min<uint32_t>(config_.match_tokens_max, end);
    while (length < reach && tokens_[end - 1 - length] == tokens_[n - 1 - length]) ++length;
    if (length >= config_.match_tokens_min && length > best.length) best = {end, length};
    if (best.length == config_.match_tokens_max) break;  // no longer match exists
  }
  return best;
}

std::vector<int32_t> NgramProposer::propose(uint32_t draft_tokens) const {
  if (draft_tokens == 0) return {};
  const Match m = best_match();
  if (m.length == 0) return {};
  const size_t to = std::min(tokens_.size(), size_t{m.end} + draft_tokens);
  return std::vector<int32_t>(tokens_.begin() + m.end, tokens_.begin() + static_cast<ptrdiff_t>(to));
}

uint32_t NgramProposer::match_tokens() const { return best_match().length; }

}  // namespace tandem::decode
