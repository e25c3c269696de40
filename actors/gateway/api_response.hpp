// tandem/gateway: rendering a neutral stream of generation events into each API's response.
//
// The gateway turns decode output (after detokenizing and output_parser.hpp) into GenEvents
// and feeds them, in order, to one Renderer per request:
//   deltas (TextDelta, ReasoningDelta, ToolCallStart, ToolCallArgsDelta)*,
//   then Finish, then UsageReport (the terminal event);
//   or StreamError at any point (also terminal).
// LogprobsDelta (only when options.logprobs) may come anywhere before Finish: the gateway
// feeds each generated token's logprobs BEFORE the text events that token produces.
// Alignment: a renderer holds the logprobs it has not sent yet and attaches them to the next
// chunk it writes, so text held back (an incomplete UTF-8 character, a possible stop string,
// a possible tool-call or reasoning marker) carries its tokens' logprobs when it is released;
// what is still held at Finish (e.g. the EOS token, the tokens of a matched stop string)
// goes with the finish chunk. Chat and Completions report every generated token (the list
// has usage.completion_tokens entries); Responses reports the tokens of output_text only
// (the logprobs pending when a reasoning or function_call delta is written are dropped).
// Feeding after the terminal event, or breaking that order, is a bug (asserted).
// ToolCallArgsDelta must follow the ToolCallStart of the same index with no other delta
// kind in between (the parsers guarantee this).
//
// Streaming (options.stream): begin() returns the preamble, feed() the SSE bytes to write for
// each event (possibly empty). Non-streaming: begin()/feed() return "", and after the
// terminal event body() returns the JSON body (or, after StreamError, the caller renders
// error() with render_error_body). Pure: time comes in as options.created_s; ids come from
// the IdGenerator passed in (borrowed; it must outlive the renderer).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "actors/gateway/api_types.hpp"

namespace tandem::gateway {

enum class FinishReason { stop, length, tool_calls, stop_string, cancelled, error };

struct Usage {
  int64_t prompt_tokens = 0;      // whole prompt, cached included
  int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache (<= prompt)
  int64_t completion_tokens = 0;  // generated tokens, reasoning included
  int64_t reasoning_tokens = 0;   // of completion_tokens, the reasoning part
  friend bool operator==(const Usage&, const Usage&) = default;
};

struct TextDelta {
  std::string text;
};
struct ReasoningDelta {
  std::string text;
};
// id empty -> the renderer makes one (call_... / toolu_...). index counts from 0 per request.
struct ToolCallStart {
  int64_t index = 0;
  std::string id;
  std::string name;
};
struct ToolCallArgsDelta {
  int64_t index = 0;
  std::string delta;  // a piece of the arguments JSON text
};
struct Finish {
  FinishReason reason = FinishReason::stop;
  std::string stop_string;  // the matched stop string when reason == stop_string
};
struct UsageReport {
  Usage usage;
};
struct StreamError {
  ApiError error;
};
// One candidate at a position: `token` is the tokenizer's decode of that token alone (raw
// bytes, possibly part of a UTF-8 character; rendered with U+FFFD in JSON strings, exact in
// `bytes`); logprob is a natural log, <= 0.
struct TokenAlternative {
  std::string token;
  double logprob = 0.0;
  friend bool operator==(const TokenAlternative&, const TokenAlternative&) = default;
};
// A generated token: its own text and logprob, and the top alternatives (descending; may be
// empty: top_logprobs 0).
struct TokenLogprobs {
  std::string token;
  double logprob = 0.0;
  std::vector<TokenAlternative> top;
  friend bool operator==(const TokenLogprobs&, const TokenLogprobs&) = default;
};
struct LogprobsDelta {
  std::vector<TokenLogprobs> tokens;  // in generation order
};

// New kinds go last: renderers test `index() <= 3` for the text/tool deltas.
using GenEvent = std::variant<TextDelta, ReasoningDelta, ToolCallStart, ToolCallArgsDelta, Finish,
                              UsageReport, StreamError, LogprobsDelta>;

// Deterministic ids: prefix + 24 characters of [0-9A-Za-z] from a splitmix64 stream.
class IdGenerator {
 public:
  explicit IdGenerator(uint64_t seed) : state_(seed) {}
  std::string next(std::string_view prefix);

 private:
  uint64_t state_;
};

struct RenderOptions {
  std::string model;      // echoed in every body
  int64_t created_s = 0;  // unix seconds, from the caller's clock
  bool stream = false;
  bool include_usage = false;  // Chat/Completions stream: send the usage chunk
  int64_t prompt_tokens = 0;   // Anthropic message_start usage (known after tokenizing)
  int64_t cached_tokens = 0;   // Anthropic message_start usage, 0 when not known yet
  std::string echo_text;       // Completions echo: the prompt text to prepend
  bool logprobs = false;       // render logprobs (LogprobsDelta events come only then)
  // Responses: echoed in the response object.
  std::string instructions;
  std::optional<int64_t> max_output_tokens;
  double temperature = 1.0;
  double top_p = 1.0;
  std::string reasoning_effort;
};

class Renderer {
 public:
  virtual ~Renderer() = default;
  // Stream preamble (SSE bytes), "" when not streaming. Called once, before feed().
  virtual std::string begin() = 0;
  // SSE bytes for this event ("" when not streaming or nothing to send yet).
  virtual std::string feed(const GenEvent& event) = 0;
  // Non-stream JSON body. Precondition: done() and error() == nullptr.
  virtual std::string body() const = 0;
  bool done() const { return done_; }
  // The StreamError (or Finish{error}) that ended the request, nullptr otherwise.
  const ApiError* error() const { return error_ ? &*error_ : nullptr; }

 protected:
  bool done_ = false;
  std::optional<ApiError> error_;
};

// One renderer for `kind` (not count_tokens). `ids` is borrowed (outlives the renderer).
std::unique_ptr<Renderer> make_renderer(ApiKind kind, RenderOptions options, IdGenerator& ids);

// SSE framing: "data: <data>\n\n", or "event: <name>\ndata: <data>\n\n".
std::string sse_data(std::string_view data);
std::string sse_event(std::string_view name, std::string_view data);

// POST /v1/messages/count_tokens answer: {"input_tokens":N}.
std::string render_count_tokens(int64_t input_tokens);

// The ApiError a Finish{error} carries when no StreamError was sent: 500 api_error.
ApiError generation_failed_error();

}  // namespace tandem::gateway
