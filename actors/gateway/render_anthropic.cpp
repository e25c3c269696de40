// Anthropic Messages renderer (see api_response.hpp, renderers.hpp).
//
// Content blocks open lazily on the first delta of their kind (thinking, text, tool_use) and
// close when another kind starts or at Finish. usage.input_tokens counts the prompt tokens
// NOT read from the cache (Anthropic's definition); cache_read_input_tokens the cached ones.
#include "actors/gateway/api_request.hpp"
#include "actors/gateway/renderers.hpp"

namespace tandem::gateway {

MessagesRenderer::MessagesRenderer(RenderOptions options, IdGenerator& ids)
    : RendererBase(std::move(options), ids), id_(ids_.next("msg_")) {}

namespace {
std::string anthropic_event(const json& data) {
  return sse_event(data["type"].get<std::string>(), data.dump(-1, ' ', false, utf8_replace));
}
}  // namespace

json MessagesRenderer::usage_json(bool final_usage) const {
  int64_t prompt = final_usage ? usage_.prompt_tokens : options_.prompt_tokens;
  int64_t cached = final_usage ? usage_.cached_tokens : options_.cached_tokens;
  RT_ASSERT(cached <= prompt, "cached > prompt", cached, prompt);
  return json{{"input_tokens", prompt - cached},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", cached},
              {"output_tokens", final_usage ? usage_.completion_tokens : 0}};
}

std::string MessagesRenderer::stop_reason() const {
  switch (finish_.reason) {
    case FinishReason::length:
      return "max_tokens";
    case FinishReason::stop_string:
      return "stop_sequence";
    case FinishReason::tool_calls:
      return "tool_use";
    case FinishReason::stop:
      return had_tool_calls() ? "tool_use" : "end_turn";
    case FinishReason::cancelled:
    case FinishReason::error:
      return "end_turn";
  }
  return "end_turn";
}

std::string MessagesRenderer::begin() {
  RT_ASSERT(!begun_, "begin() twice");
  begun_ = true;
  if (!options_.stream) return {};
  json message = {{"id", id_},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", options_.model},
                  {"content", json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", usage_json(false)}};
  return anthropic_event({{"type", "message_start"}, {"message", message}});
}

std::string MessagesRenderer::open_block(Open kind, const GenEvent& event) {
  RT_ASSERT(open_ == Open::none, "a block is already open");
  open_ = kind;
  open_text_.clear();
  ++block_index_;
  if (kind == Open::tool_use) {
    RT_ASSERT(std::holds_alternative<ToolCallStart>(event), "tool_use opens on its start");
    const ToolCallAccum& tool = tools_.back();
    open_block_ = {
        {"type", "tool_use"}, {"id", tool.id}, {"name", tool.name}, {"input", json::object()}};
  } else if (kind == Open::thinking) {
    open_block_ = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
  } else {
    open_block_ = {{"type", "text"}, {"text", ""}};
  }
  if (!options_.stream) return {};
  return anthropic_event(
      {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", open_block_}});
}

std::string MessagesRenderer::close_block() {
  if (open_ == Open::none) return {};
  if (open_ == Open::tool_use) {
    // The parsers emit a JSON object; anything else (a bug upstream) keeps the raw text
    // visible rather than dropping it.
    json input = json::parse(open_text_.empty() ? "{}" : open_text_, nullptr, false);
    if (input.is_discarded() || !input.is_object()) input = {{"_raw_arguments", open_text_}};
    open_block_["input"] = std::move(input);
  } else if (open_ == Open::thinking) {
    open_block_["thinking"] = open_text_;
  } else {
    open_block_["text"] = open_text_;
  }
  blocks_.push_back(open_block_);
  open_ = Open::none;
  if (!options_.stream) return {};
  return anthropic_event({{"type", "content_block_stop"}, {"index", block_index_}});
}

std::string MessagesRenderer::on_delta(const GenEvent& event) {
  if (std::holds_alternative<ToolCallStart>(event)) {
    std::string out = close_block();
    return out + open_block(Open::tool_use, event);
  }
  Open kind = Open::none;
  std::string delta;
  const char* field = "";  // the delta's text field and type (keys sort: field < "type")
  const char* type = "";
  if (const auto* t = std::get_if<TextDelta>(&event)) {
    kind = Open::text, delta = t->text, field = "text", type = "text_delta";
  } else if (const auto* r = std::get_if<ReasoningDelta>(&event)) {
    kind = Open::thinking, delta = r->text, field = "thinking", type = "thinking_delta";
  } else if (const auto* a = std::get_if<ToolCallArgsDelta>(&event)) {
    RT_ASSERT(open_ == Open::tool_use, "arguments without an open tool_use");
    kind = Open::tool_use, delta = a->delta, field = "partial_json", type = "input_json_delta";
  }
  RT_ASSERT(kind != Open::none, "on_delta with a non-delta", event.index());
  if (delta.empty()) return {};
  std::string out;
  if (open_ != kind) {
    out += close_block();
    out += open_block(kind, event);
  }
  open_text_ += delta;
  if (!options_.stream) return out;
  // Per token: the event written around the escaped text (the bytes anthropic_event() gives
  // for {"type":"content_block_delta","index":i,"delta":{"type":type,field:delta}}).
  return out + sse_event("content_block_delta",
                         std::string(R"({"delta":{")") + field + "\":" +
                             json(delta).dump(-1, ' ', false, utf8_replace) + R"(,"type":")" +
                             type + R"("},"index":)" + std::to_string(block_index_) +
                             R"(,"type":"content_block_delta"})");
}

std::string MessagesRenderer::feed(const GenEvent& event) {
  account(event, "toolu_");
  if (const ApiError* e = terminal_error(event)) {
    if (!options_.stream) return {};
    return anthropic_event(
        {{"type", "error"},
         {"error", {{"type", anthropic_error_type(e->http_status)}, {"message", e->message}}}});
  }
  if (event.index() <= 3) return on_delta(event);
  if (std::holds_alternative<LogprobsDelta>(event)) return {};  // Anthropic has no logprobs
  if (std::holds_alternative<Finish>(event)) return close_block();
  RT_ASSERT(std::holds_alternative<UsageReport>(event), "unhandled event", event.index());
  if (!options_.stream) return {};
  json delta = {{"stop_reason", stop_reason()}, {"stop_sequence", nullptr}};
  if (finish_.reason == FinishReason::stop_string) delta["stop_sequence"] = finish_.stop_string;
  std::string out =
      anthropic_event({{"type", "message_delta"}, {"delta", delta}, {"usage", usage_json(true)}});
  return out + anthropic_event({{"type", "message_stop"}});
}

std::string MessagesRenderer::body() const {
  RT_ASSERT(done_, "body() before the terminal event");
  RT_ASSERT(!error_, "body() after an error; render error() instead");
  json b = {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", options_.model},
            {"content", blocks_},
            {"stop_reason", stop_reason()},
            {"stop_sequence", nullptr},
            {"usage", usage_json(true)}};
  if (finish_.reason == FinishReason::stop_string) b["stop_sequence"] = finish_.stop_string;
  return b.dump(-1, ' ', false, utf8_replace);
}

}  // namespace tandem::gateway
