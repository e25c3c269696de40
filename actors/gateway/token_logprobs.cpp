#include "actors/gateway/token_logprobs.hpp"

#include <algorithm>

namespace tandem::gateway {

std::vector<TokenLogprobs> token_logprobs(std::span<const devices::SampledToken> tokens,
                                          std::optional<int32_t>& prev_id,
                                          const DecodePieceFn& decode_piece) {
  RT_ASSERT(decode_piece != nullptr, "token_logprobs needs a decoder");
  std::vector<TokenLogprobs> out;
  out.reserve(tokens.size());
  for (const devices::SampledToken& t : tokens) {
    RT_ASSERT(t.top.size() <= size_t(devices::logprobs_top_n_max), t.top.size());
    TokenLogprobs entry;
    entry.token = decode_piece(prev_id, t.token);
    entry.logprob = std::min(0.0, static_cast<double>(t.logprob));
    entry.top.reserve(t.top.size());
    for (const devices::TokenLogprob& alt : t.top) {
      entry.top.push_back(
          {decode_piece(prev_id, alt.token), std::min(0.0, static_cast<double>(alt.logprob))});
    }
    out.push_back(std::move(entry));
    prev_id = t.token;
  }
  RT_ASSERT(out.size() == tokens.size(), out.size(), tokens.size());
  return out;
}

}  // namespace tandem::gateway
