// Chat Completions and Completions renderers (see api_response.hpp, renderers.hpp).
#include "actors/gateway/renderers.hpp"

namespace tandem::gateway {
namespace {

// OpenAI finish_reason. A normal stop after tool calls reports "tool_calls".
std::string openai_finish_reason(const Finish& finish, bool had_tool_calls) {
  switch (finish.reason) {
    case FinishReason::length:
      return "length";
    case FinishReason::tool_calls:
      return "tool_calls";
    case FinishReason::stop:
      return had_tool_calls ? "tool_calls" : "stop";
    case FinishReason::stop_string:
    case FinishReason::cancelled:
    case FinishReason::error:
      return "stop";
  }
  return "stop";
}

std::string openai_error_data(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", err}}.dump(-1, ' ', false, utf8_replace);
}

}  // namespace

// ---------------- Chat Completions ----------------

ChatRenderer::ChatRenderer(RenderOptions options, IdGenerator& ids)
    : RendererBase(std::move(options), ids), id_(ids_.next("chatcmpl-")) {}

std::string ChatRenderer::chunk(json delta, json finish_reason) {
  json logprobs = nullptr;
  if (options_.logprobs) {
    logprobs = chat_logprobs_json(std::span(logprobs_).subspan(take_unsent_logprobs()));
  }
  json choice = {{"index", 0},
                 {"delta", std::move(delta)},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", std::move(finish_reason)}};
  json c = {{"id", id_},
            {"object", "chat.completion.chunk"},
            {"created", options_.created_s},
            {"model", options_.model},
            {"choices", json::array({choice})}};
  return sse_data(c.dump(-1, ' ', false, utf8_replace));
}

const std::string& ChatRenderer::meta_tail() {
  if (meta_tail_.empty()) {
    meta_tail_ = R"(],"created":)" + std::to_string(options_.created_s) + R"(,"id":)";
    append_json_string(meta_tail_, id_);
    meta_tail_ += R"(,"model":)";
    append_json_string(meta_tail_, options_.model);
    meta_tail_ += R"(,"object":"chat.completion.chunk")";
  }
  return meta_tail_;
}

std::string ChatRenderer::text_chunk(const char* key, const std::string& text) {
  if (options_.logprobs) return chunk(json{{key, text}}, nullptr);
  const std::string& tail = meta_tail();
  std::string out;
  out.reserve(text.size() + tail.size() + 112);
  out += R"(data: {"choices":[{"delta":{")";
  out += key;
  out += "\":";
  append_json_string(out, text);
  out += R"(},"finish_reason":null,"index":0,"logprobs":null})";
  out += tail;
  out += "}\n\n";
  return out;
}

std::string ChatRenderer::finish_chunk(std::string_view finish_reason) {
  if (options_.logprobs) return chunk(json::object(), std::string(finish_reason));
  std::string out = R"(data: {"choices":[{"delta":{},"finish_reason":)";
  append_json_string(out, finish_reason);
  out += R"(,"index":0,"logprobs":null})";
  out += meta_tail();
  out += "}\n\n";
  return out;
}

std::string ChatRenderer::usage_chunk() {
  return R"(data: {"choices":[)" + meta_tail() + R"(,"usage":)" + chat_usage_text(usage_) +
         "}\n\n";
}

std::string ChatRenderer::begin() {
  RT_ASSERT(!begun_, "begin() twice");
  begun_ = true;
  if (!options_.stream) return {};
  return chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr);
}

std::string ChatRenderer::feed(const GenEvent& event) {
  account(event, "call_");
  if (const ApiError* e = terminal_error(event)) {
    if (!options_.stream) return {};
    return sse_data(openai_error_data(*e)) + sse_data("[DONE]");
  }
  if (!options_.stream || std::holds_alternative<LogprobsDelta>(event)) return {};
  if (const auto* t = std::get_if<TextDelta>(&event)) {
    return t->text.empty() ? std::string() : text_chunk("content", t->text);
  }
  if (const auto* r = std::get_if<ReasoningDelta>(&event)) {
    return r->text.empty() ? std::string() : text_chunk("reasoning_content", r->text);
  }
  if (std::holds_alternative<ToolCallStart>(event)) {
    const ToolCallAccum& tool = tools_.back();
    json call = {{"index", tool.index},
                 {"id", tool.id},
                 {"type", "function"},
                 {"function", {{"name", tool.name}, {"arguments", ""}}}};
    return chunk(json{{"tool_calls", json::array({call})}}, nullptr);
  }
  if (const auto* a = std::get_if<ToolCallArgsDelta>(&event)) {
    if (a->delta.empty()) return {};
    json call = {{"index", a->index}, {"function", {{"arguments", a->delta}}}};
    return chunk(json{{"tool_calls", json::array({call})}}, nullptr);
  }
  if (std::holds_alternative<Finish>(event)) {
    return finish_chunk(openai_finish_reason(finish_, had_tool_calls()));
  }
  RT_ASSERT(std::holds_alternative<UsageReport>(event), "unhandled event", event.index());
  return (options_.include_usage ? usage_chunk() : std::string()) + "data: [DONE]\n\n";
}

std::string ChatRenderer::body() const {
  RT_ASSERT(done_, "body() before the terminal event");
  RT_ASSERT(!error_, "body() after an error; render error() instead");
  json message = {{"role", "assistant"}};
  message["content"] = text_.empty() && had_tool_calls() ? json(nullptr) : json(text_);
  if (!reasoning_.empty()) message["reasoning_content"] = reasoning_;
  if (had_tool_calls()) {
    json calls = json::array();
    for (const ToolCallAccum& t : tools_) {
      calls.push_back({{"id", t.id},
                       {"type", "function"},
                       {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    }
    message["tool_calls"] = std::move(calls);
  }
  json choice = {{"index", 0},
                 {"message", std::move(message)},
                 {"logprobs", options_.logprobs ? chat_logprobs_json(logprobs_) : json(nullptr)},
                 {"finish_reason", openai_finish_reason(finish_, had_tool_calls())}};
  json b = {{"id", id_},
            {"object", "chat.completion"},
            {"created", options_.created_s},
            {"model", options_.model},
            {"choices", json::array({choice})},
            {"usage", chat_usage_json(usage_)}};
  return b.dump(-1, ' ', false, utf8_replace);
}

// ---------------- Completions ----------------

CompletionRenderer::CompletionRenderer(RenderOptions options, IdGenerator& ids)
    : RendererBase(std::move(options), ids), id_(ids_.next("cmpl-")) {}

// Completions bodies and chunks are ordered_json: their logprobs' top dicts keep the
// probability order (see completion_logprobs_json).
std::string CompletionRenderer::chunk(const std::string& text, std::string_view finish_reason) {
  using ojson = nlohmann::ordered_json;
  if (!options_.logprobs) {  // the hot path: every token's text, and the finish
    if (text_chunk_head_.empty()) {
      text_chunk_head_ = R"(data: {"id":)";
      append_json_string(text_chunk_head_, id_);
      text_chunk_head_ += R"(,"object":"text_completion","created":)" +
                          std::to_string(options_.created_s) + R"(,"model":)";
      append_json_string(text_chunk_head_, options_.model);
      text_chunk_head_ += R"(,"choices":[{"index":0,"text":)";
    }
    std::string out;
    out.reserve(text_chunk_head_.size() + text.size() + finish_reason.size() + 48);
    out += text_chunk_head_;
    append_json_string(out, text);
    out += R"(,"logprobs":null,"finish_reason":)";
    if (finish_reason.empty()) {
      out += "null";
    } else {
      append_json_string(out, finish_reason);
    }
    out += "}]}\n\n";
    return out;
  }
  size_t begin = take_unsent_logprobs();
  ojson logprobs = completion_logprobs_json(std::span(logprobs_).subspan(begin),
                                            std::span(text_offsets_).subspan(begin));
  ojson choice = {{"index", 0},
                  {"text", text},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason",
                   finish_reason.empty() ? ojson(nullptr) : ojson(std::string(finish_reason))}};
  ojson c = {{"id", id_},
             {"object", "text_completion"},
             {"created", options_.created_s},
             {"model", options_.model},
             {"choices", ojson::array({choice})}};
  return sse_data(c.dump(-1, ' ', false, utf8_replace));
}

std::string CompletionRenderer::usage_chunk() {
  std::string out = R"(data: {"choices":[],"created":)" + std::to_string(options_.created_s) +
                    R"(,"id":)";
  append_json_string(out, id_);
  out += R"(,"model":)";
  append_json_string(out, options_.model);
  out += R"(,"object":"text_completion","usage":)" + chat_usage_text(usage_) + "}\n\n";
  return out;
}

std::string CompletionRenderer::begin() {
  RT_ASSERT(!begun_, "begin() twice");
  begun_ = true;
  if (!options_.stream || options_.echo_text.empty()) return {};
  return chunk(options_.echo_text, "");
}

std::string CompletionRenderer::feed(const GenEvent& event) {
  RT_ASSERT(event.index() != 2 && event.index() != 3, "completions carry no tool calls");
  account(event, "call_");
  if (const ApiError* e = terminal_error(event)) {
    if (!options_.stream) return {};
    return sse_data(openai_error_data(*e)) + sse_data("[DONE]");
  }
  if (!options_.stream || std::holds_alternative<LogprobsDelta>(event)) return {};
  // Raw completions have no reasoning channel: reasoning text is text here.
  if (const auto* t = std::get_if<TextDelta>(&event)) {
    return t->text.empty() ? std::string() : chunk(t->text, "");
  }
  if (const auto* r = std::get_if<ReasoningDelta>(&event)) {
    return r->text.empty() ? std::string() : chunk(r->text, "");
  }
  if (std::holds_alternative<Finish>(event)) {
    return chunk("", openai_finish_reason(finish_, false));
  }
  RT_ASSERT(std::holds_alternative<UsageReport>(event), "unhandled event", event.index());
  return (options_.include_usage ? usage_chunk() : std::string()) + "data: [DONE]\n\n";
}

std::string CompletionRenderer::body() const {
  RT_ASSERT(done_, "body() before the terminal event");
  RT_ASSERT(!error_, "body() after an error; render error() instead");
  using ojson = nlohmann::ordered_json;
  ojson logprobs = options_.logprobs ? completion_logprobs_json(logprobs_, text_offsets_)
                                     : ojson(nullptr);
  ojson choice = {{"index", 0},
                  {"text", options_.echo_text + reasoning_ + text_},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason", openai_finish_reason(finish_, false)}};
  ojson b = {{"id", id_},
             {"object", "text_completion"},
             {"created", options_.created_s},
             {"model", options_.model},
             {"choices", ojson::array({choice})},
             {"usage", ojson(chat_usage_json(usage_))}};
  return b.dump(-1, ' ', false, utf8_replace);
}

}  // namespace tandem::gateway
