// tandem/gateway: the neutral request and error types every API front end produces.
//
// The conversation types mirror `runtime/text/chat.hpp` (branch `tokenizer`) field for field
// (ToolCall, ChatMessage, Conversation), so converting to tandem::text is a member-wise copy;
// see to_text_conversation() once both are merged. They are plain values: copy and compare.
//
// ApiError is an expected error (bad input, unsupported feature, context too long): each
// front end renders it in its own error body (api_request.hpp: render_error_body).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/base/assert.hpp"

namespace tandem::gateway {

// The HTTP endpoint a request came in on; decides parsing, rendering and error bodies.
enum class ApiKind { chat_completions, completions, responses, messages, count_tokens };

// An error the client must see. `type` is one of: invalid_request_error, authentication_error,
// not_found_error, request_too_large, rate_limit_error, overloaded_error, api_error.
// `param` names the offending field with its path ("messages[2].content"), empty when none;
// `code` is a machine-readable code ("unsupported_parameter"), empty when none.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
  std::string message;
  friend bool operator==(const ApiError&, const ApiError&) = default;
};

// 400 invalid_request_error naming `param`.
ApiError invalid_request(std::string param, std::string message);
// 400 invalid_request_error, code "unsupported_parameter" (or "unsupported_value").
ApiError unsupported(std::string param, std::string message);

// ApiResult<T>: a value or an ApiError. Reading the wrong alternative is a bug (asserted).
template <class T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT: implicit by design
  bool ok() const { return v_.index() == 0; }
  T& value() & {
    RT_ASSERT(ok(), "ApiResult::value() on an error:", std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  const T& value() const& {
    RT_ASSERT(ok(), "ApiResult::value() on an error:", std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  const ApiError& error() const {
    RT_ASSERT(!ok(), "ApiResult::error() on a value");
    return std::get<1>(v_);
  }

 private:
  std::variant<T, ApiError> v_;
};

// ---- the conversation (mirrors tandem::text in runtime/text/chat.hpp) ----
enum class ChatRole { system, user, assistant, tool };

struct ToolCall {
  std::string id;              // the client's id for the call (call_..., toolu_...)
  std::string name;            // function name
  std::string arguments_json;  // the arguments as JSON text (an object)
  friend bool operator==(const ToolCall&, const ToolCall&) = default;
};

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
  std::string reasoning;             // assistant only: reasoning text
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only: which call this answers
  std::string name;                  // tool only: the function name (looked up by id)
  friend bool operator==(const ChatMessage&, const ChatMessage&) = default;
};

struct Conversation {
  std::vector<ChatMessage> messages;
  // Each a JSON object text: {"type":"function","function":{"name","description","parameters"}}
  std::vector<std::string> tools_json;
  bool add_generation_prompt = true;
  friend bool operator==(const Conversation&, const Conversation&) = default;
};

// ---- the neutral generation request ----
enum class PromptKind { conversation, text, token_ids };
enum class ToolChoiceMode { automatic, none, required, named };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::automatic;
  std::string name;  // named only
  friend bool operator==(const ToolChoice&, const ToolChoice&) = default;
};

// Defaults are "off": temperature 1, top_p 1, top_k -1 (disabled), min_p 0, penalties neutral.
struct SamplingSpec {
  double temperature = 1.0;         // [0, 2] (Anthropic [0, 1]); 0 = greedy
  double top_p = 1.0;               // (0, 1]
  int64_t top_k = -1;               // -1 = disabled, else >= 1 (0 is read as -1)
  double min_p = 0.0;               // [0, 1]
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  double repetition_penalty = 1.0;  // > 0, 1 = off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // stop strings (non-empty), at most stop_strings_max
  bool logprobs = false;
  int64_t top_logprobs = 0;  // [0, 20], only with logprobs
  // Tandem's extension `"speculative": false`: this request never drafts (the manifest's
  // [speculative] method applies otherwise). Greedy output is the same either way.
  bool speculative = true;
  friend bool operator==(const SamplingSpec&, const SamplingSpec&) = default;
};

// Reasoning knobs as the client sent them; the gateway decides what the template does.
struct ReasoningSpec {
  std::string effort;                    // "" when unset; else as sent (low, medium, high, ...)
  std::optional<bool> thinking_enabled;  // Anthropic thinking.type; unset elsewhere
  int64_t thinking_budget_tokens = 0;    // Anthropic thinking.budget_tokens, 0 when unset
  std::string summary;                   // Responses reasoning.summary, "" when unset
  friend bool operator==(const ReasoningSpec&, const ReasoningSpec&) = default;
};

inline constexpr size_t stop_strings_max = 16;
inline constexpr int64_t top_logprobs_max = 20;

struct GenerateSpec {
  ApiKind api = ApiKind::chat_completions;
  std::string model;
  PromptKind prompt_kind = PromptKind::conversation;
  Conversation conversation;              // prompt_kind == conversation (tools live here)
  std::string prompt_text;                // prompt_kind == text
  std::vector<int64_t> prompt_token_ids;  // prompt_kind == token_ids
  ToolChoice tool_choice;
  SamplingSpec sampling;
  ReasoningSpec reasoning;
  std::optional<int64_t> max_tokens;  // >= 1 when set; unset = fill the context
  std::string max_tokens_param;       // the field it came from ("max_tokens", ...)
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage (Chat/Completions)
  bool echo = false;                 // Completions echo: prepend the prompt text
  std::string cache_salt;            // "" when unset
  bool store = false;                // Responses store (accepted; nothing is stored)
  std::vector<std::string> include;  // Responses include (message.output_text.logprobs
                                     // turns logprobs on; the rest is ignored)
};

}  // namespace tandem::gateway
