// tandem/gateway (internal): the four Renderer implementations behind make_renderer().
// One instance per request, driven from one thread; see api_response.hpp for the contract.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "actors/gateway/api_response.hpp"

namespace tandem::gateway {

// Sorted keys: the per-token writers (render_*.cpp) write these objects' dump bytes by hand.
// (Request parsing, json_reader.hpp, keeps the client's key order: nlohmann::ordered_json.)
using json = nlohmann::json;

// Model text may end mid-character: invalid UTF-8 is replaced (U+FFFD), never thrown.
inline constexpr auto utf8_replace = json::error_handler_t::replace;

// Appends `text` as a JSON string: the bytes of json(text).dump(-1, ' ', false, utf8_replace).
// Printable ASCII without '"' or '\\' (most tokens) is written as it is; anything else goes
// through nlohmann (escapes, UTF-8 checks, replacement of invalid bytes).
void append_json_string(std::string& out, std::string_view text);

// The bytes of chat_usage_json(u).dump(): OpenAI usage with its details, keys sorted.
std::string chat_usage_text(const Usage& u);

struct ToolCallAccum {
  int64_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

// What every renderer tracks: event order, accumulated text, tool calls and the finish.
class RendererBase : public Renderer {
 protected:
  RendererBase(RenderOptions options, IdGenerator& ids) : options_(std::move(options)), ids_(ids) {}
  // Asserts the event order; records text, reasoning, tool calls, finish, usage, error.
  void account(const GenEvent& event, std::string_view tool_id_prefix);
  bool had_tool_calls() const { return !tools_.empty(); }
  // The ApiError ending the stream for StreamError / Finish{error}; nullptr otherwise.
  const ApiError* terminal_error(const GenEvent& event);
  // The index of the first logprobs_ entry not yet written to the stream; the entries from
  // there to the end count as written after this call.
  size_t take_unsent_logprobs();

  RenderOptions options_;
  IdGenerator& ids_;
  bool begun_ = false;
  bool finished_ = false;  // Finish seen
  std::string text_;
  std::string reasoning_;
  std::vector<ToolCallAccum> tools_;
  Finish finish_;
  Usage usage_;
  std::vector<TokenLogprobs> logprobs_;       // every LogprobsDelta entry, in order
  std::vector<int64_t> text_offsets_;         // per logprobs_ entry: bytes of text before it
  size_t unsent_logprobs_index_ = 0;          // logprobs_[index, end) are not streamed yet
};

// OpenAI shapes of one token's logprobs: chat / responses {token, logprob, bytes,
// top_logprobs:[{token, logprob, bytes}]}; bytes are the token's raw bytes.
json chat_logprob_json(const TokenLogprobs& t);
json chat_logprobs_json(std::span<const TokenLogprobs> tokens);  // {content, refusal}
// Completions: {tokens, token_logprobs, top_logprobs:[{token: logprob}], text_offset}. An
// ordered_json: each top_logprobs object lists its keys most probable first, as OpenAI
// does (a plain json object would sort them by text).
nlohmann::ordered_json completion_logprobs_json(std::span<const TokenLogprobs> tokens,
                                                std::span<const int64_t> text_offsets);

class ChatRenderer final : public RendererBase {
 public:
  ChatRenderer(RenderOptions options, IdGenerator& ids);
  std::string begin() override;
  std::string feed(const GenEvent& event) override;
  std::string body() const override;

 private:
  std::string chunk(json delta, json finish_reason);
  // The chunks every stream sends -- a token's text ({"<key>": text}), the finish, the usage
  // -- without logprobs, written around their variable parts with the chunk's fixed tail
  // built once: the same bytes as chunk() (and the usage object), without a JSON tree each.
  std::string text_chunk(const char* key, const std::string& text);
  std::string finish_chunk(std::string_view finish_reason);
  std::string usage_chunk();
  const std::string& meta_tail();  // ],"created":N,"id":...,"model":...,"object":...
  std::string id_;
  std::string meta_tail_;  // built on first use
};

class CompletionRenderer final : public RendererBase {
 public:
  CompletionRenderer(RenderOptions options, IdGenerator& ids);
  std::string begin() override;
  std::string feed(const GenEvent& event) override;
  std::string body() const override;

 private:
  // finish_reason "" = null. Without logprobs the chunk is written around the text and the
  // reason from a head built once (the same bytes as the ordered_json object).
  std::string chunk(const std::string& text, std::string_view finish_reason);
  std::string usage_chunk();
  std::string id_;
  std::string text_chunk_head_;  // chunk()'s bytes before the text (no logprobs); first use
};

class ResponsesRenderer final : public RendererBase {
 public:
  ResponsesRenderer(RenderOptions options, IdGenerator& ids);
  std::string begin() override;
  std::string feed(const GenEvent& event) override;
  std::string body() const override;

 private:
  enum class Open { none, message, reasoning, function_call };
  std::string emit(const std::string& type, json fields);
  std::string open_item(Open kind, const GenEvent& event);
  std::string close_item();
  std::string on_delta(const GenEvent& event);
  json delta_logprobs();  // the unsent logprobs, now part of the open message
  json response_object(const std::string& status) const;
  std::string id_;
  int64_t sequence_number_ = 0;
  Open open_ = Open::none;
  std::string open_text_;       // text/reasoning/arguments of the open item
  json items_ = json::array();  // completed output items
  json open_item_;              // the item being streamed
  json open_logprobs_ = json::array();  // logprobs of the open message's output_text
};

class MessagesRenderer final : public RendererBase {
 public:
  MessagesRenderer(RenderOptions options, IdGenerator& ids);
  std::string begin() override;
  std::string feed(const GenEvent& event) override;
  std::string body() const override;

 private:
  enum class Open { none, text, thinking, tool_use };
  std::string open_block(Open kind, const GenEvent& event);
  std::string close_block();
  std::string on_delta(const GenEvent& event);
  std::string stop_reason() const;
  json usage_json(bool final_usage) const;
  std::string id_;
  Open open_ = Open::none;
  int64_t block_index_ = -1;
  std::string open_text_;
  json blocks_ = json::array();  // completed content blocks
  json open_block_;
};

// Usage objects.
json chat_usage_json(const Usage& usage);

}  // namespace tandem::gateway
