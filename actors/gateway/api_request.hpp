// tandem/gateway: request parsing and validation for the four HTTP APIs.
//
// Each parse_* takes the raw request body (bytes as received) and returns one neutral
// GenerateSpec or the first ApiError found, naming the field by path (param). Unknown fields
// are accepted and ignored; malformed or contradictory input is rejected (400). Pure: no I/O,
// no clocks; cost is linear in the body size.
//
// Decisions applied to every API (also in README.md):
//  - n / best_of other than 1 are rejected (unsupported_parameter);
//  - max tokens beyond the context are REJECTED (check_context_length), never clamped;
//  - unset max tokens (Chat, Responses) means "the rest of the context"; Completions uses 16
//    like the OpenAI reference; Anthropic requires max_tokens;
//  - non-function tools (built-in tool types) are ignored; function tools are validated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "actors/gateway/api_types.hpp"

namespace tandem::gateway {

// POST /v1/chat/completions
ApiResult<GenerateSpec> parse_chat_request(std::string_view body);
// POST /v1/completions (prompt: a string, a one-element list of strings, or token ids)
ApiResult<GenerateSpec> parse_completion_request(std::string_view body);
// POST /v1/responses (previous_response_id set -> unsupported error)
ApiResult<GenerateSpec> parse_responses_request(std::string_view body);
// POST /v1/messages and /v1/messages/count_tokens (max_tokens required only for messages)
ApiResult<GenerateSpec> parse_messages_request(std::string_view body, ApiKind kind);

// Dispatches on kind to the parsers above.
ApiResult<GenerateSpec> parse_request(ApiKind kind, std::string_view body);

// Error body as that API renders it (JSON text):
//   OpenAI-style (chat, completions, responses): {"error":{"message","type","param","code"}}
//   Anthropic (messages, count_tokens): {"type":"error","error":{"type","message"}}
std::string render_error_body(ApiKind kind, const ApiError& error);

// Anthropic's error type for an HTTP status: 400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large,
// 429 rate_limit_error, 503/529 overloaded_error, anything else api_error.
std::string anthropic_error_type(int http_status);

// Called by the gateway after tokenizing. Returns the max tokens to generate: the requested
// value, or what is left of the context when unset. Errors (400, param = spec's
// max_tokens_param or "messages"/"prompt"/"input", code "context_length_exceeded"):
// prompt_tokens + max_tokens > model_len_tokens_max, stating both numbers; or a prompt
// that leaves no room at all. Preconditions: prompt_tokens >= 0, model_len_tokens_max >= 1.
ApiResult<int64_t> check_context_length(const GenerateSpec& spec, int64_t prompt_tokens,
                                        int64_t model_len_tokens_max);

// The prompt tokens budget for a capped encode (Tokenizer::encode_capped): the most prompt
// tokens check_context_length can accept, model_len_tokens_max - max(1, max_tokens), >= 0.
int64_t prompt_tokens_max(const GenerateSpec& spec, int64_t model_len_tokens_max);

// The context-length 400 for a prompt whose tokenizing stopped early: it has at least
// `prompt_tokens_min` tokens, more than prompt_tokens_max(spec, ...) (asserted).
ApiError prompt_too_long(const GenerateSpec& spec, int64_t prompt_tokens_min,
                         int64_t model_len_tokens_max);

}  // namespace tandem::gateway
