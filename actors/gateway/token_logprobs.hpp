// tandem/gateway: the text of each generated token's logprobs, for the renderers.
// Pure: the tokenizer comes in as a function.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/gateway/api_response.hpp"
#include "devices/sampling.hpp"

namespace tandem::gateway {

// The bytes token `id` contributes after `prev_id` (nullopt: start of text), i.e.
// text::Tokenizer::decode_piece.
using DecodePieceFn = std::function<std::string(std::optional<int32_t> prev_id, int32_t id)>;

// One TokenLogprobs per sampled token, in order. A token's text, and the text of each
// alternative at its position, is that token decoded alone after the previous generated token
// (`prev_id` for tokens[0]: the last prompt token for completions, nullopt for a chat reply,
// as the stream decoder starts). prev_id is updated to the last token of `tokens`, so
// consecutive chunks continue. Logprobs above 0 (float slack) are clamped to 0.
// Cost: one decode_piece per token and alternative.
std::vector<TokenLogprobs> token_logprobs(std::span<const devices::SampledToken> tokens,
                                          std::optional<int32_t>& prev_id,
                                          const DecodePieceFn& decode_piece);

}  // namespace tandem::gateway
