// Responses API renderer (see api_response.hpp, renderers.hpp).
//
// Output items open lazily on the first delta of their kind and close when another kind
// starts or at Finish: reasoning (rs_...), message (msg_...), function_call (fc_..., call_id
// call_...). Event order per item: output_item.added, [content_part.added], deltas,
// [..._text.done, content_part.done | function_call_arguments.done], output_item.done.
// With logprobs (include message.output_text.logprobs): each output_text.delta carries the
// logprobs of the tokens released with it, and the done event / content part all of them.
#include "actors/gateway/renderers.hpp"

namespace tandem::gateway {

ResponsesRenderer::ResponsesRenderer(RenderOptions options, IdGenerator& ids)
    : RendererBase(std::move(options), ids), id_(ids_.next("resp_")) {}

json ResponsesRenderer::delta_logprobs() {
  json out = json::array();
  if (!options_.logprobs) return out;
  size_t begin = take_unsent_logprobs();
  for (size_t i = begin; i < logprobs_.size(); ++i) {
    out.push_back(chat_logprob_json(logprobs_[i]));
    open_logprobs_.push_back(out.back());
  }
  return out;
}

std::string ResponsesRenderer::emit(const std::string& type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_number_++;
  if (!options_.stream) return {};
  return sse_event(type, fields.dump(-1, ' ', false, utf8_replace));
}

json ResponsesRenderer::response_object(const std::string& status) const {
  json r = {{"id", id_},
            {"object", "response"},
            {"created_at", options_.created_s},
            {"status", status},
            {"model", options_.model},
            {"output", items_},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"parallel_tool_calls", true},
            {"tool_choice", "auto"},
            {"tools", json::array()},
            {"temperature", options_.temperature},
            {"top_p", options_.top_p},
            {"previous_response_id", nullptr},
            {"store", false},
            {"text", {{"format", {{"type", "text"}}}}},
            {"truncation", "disabled"},
            {"metadata", json::object()},
            {"usage", nullptr}};
  r["instructions"] = options_.instructions.empty() ? json(nullptr) : json(options_.instructions);
  r["max_output_tokens"] =
      options_.max_output_tokens ? json(*options_.max_output_tokens) : json(nullptr);
  r["reasoning"] = {{"effort", options_.reasoning_effort.empty() ? json(nullptr)
                                                                 : json(options_.reasoning_effort)},
                    {"summary", nullptr}};
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (done_ && !error_) {
    r["usage"] = {{"input_tokens", usage_.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", usage_.cached_tokens}}},
                  {"output_tokens", usage_.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", usage_.reasoning_tokens}}},
                  {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens}};
  }
  return r;
}

std::string ResponsesRenderer::begin() {
  RT_ASSERT(!begun_, "begin() twice");
  begun_ = true;
  std::string out = emit("response.created", {{"response", response_object("in_progress")}});
  return out + emit("response.in_progress", {{"response", response_object("in_progress")}});
}

std::string ResponsesRenderer::open_item(Open kind, const GenEvent& event) {
  RT_ASSERT(open_ == Open::none, "an item is already open");
  RT_ASSERT(kind != Open::none, "open_item(none)");
  open_ = kind;
  open_text_.clear();
  open_logprobs_ = json::array();
  int64_t out_index = static_cast<int64_t>(items_.size());
  if (kind == Open::function_call) {
    const ToolCallAccum& tool = tools_.back();
    RT_ASSERT(std::holds_alternative<ToolCallStart>(event), "function_call opens on its start");
    open_item_ = {{"id", ids_.next("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
                  {"call_id", tool.id},     {"name", tool.name},       {"arguments", ""}};
    return emit("response.output_item.added", {{"output_index", out_index}, {"item", open_item_}});
  }
  bool message = kind == Open::message;
  if (message) {
    open_item_ = {{"id", ids_.next("msg_")},
                  {"type", "message"},
                  {"status", "in_progress"},
                  {"role", "assistant"},
                  {"content", json::array()}};
  } else {
    open_item_ = {{"id", ids_.next("rs_")},
                  {"type", "reasoning"},
                  {"summary", json::array()},
                  {"content", json::array()}};
  }
  json part = message ? json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}
                      : json{{"type", "reasoning_text"}, {"text", ""}};
  std::string out =
      emit("response.output_item.added", {{"output_index", out_index}, {"item", open_item_}});
  return out + emit("response.content_part.added", {{"item_id", open_item_["id"]},
                                                    {"output_index", out_index},
                                                    {"content_index", 0},
                                                    {"part", part}});
}

std::string ResponsesRenderer::close_item() {
  if (open_ == Open::none) return {};
  int64_t out_index = static_cast<int64_t>(items_.size());
  json ids = {{"item_id", open_item_["id"]}, {"output_index", out_index}};
  std::string out;
  if (open_ == Open::function_call) {
    json done = ids;
    done["arguments"] = open_text_;
    out += emit("response.function_call_arguments.done", done);
    open_item_["arguments"] = open_text_;
  } else {
    bool message = open_ == Open::message;
    json part =
        message
            ? json{{"type", "output_text"}, {"text", open_text_}, {"annotations", json::array()}}
            : json{{"type", "reasoning_text"}, {"text", open_text_}};
    if (message && options_.logprobs) {
      // Tokens still unsent (the EOS, held-back text) belong to this message's text.
      size_t begin = take_unsent_logprobs();
      for (size_t i = begin; i < logprobs_.size(); ++i) {
        open_logprobs_.push_back(chat_logprob_json(logprobs_[i]));
      }
      part["logprobs"] = open_logprobs_;
    }
    json done = ids;
    done["content_index"] = 0;
    done["text"] = open_text_;
    if (message) done["logprobs"] = options_.logprobs ? open_logprobs_ : json::array();
    out += emit(message ? "response.output_text.done" : "response.reasoning_text.done", done);
    json part_done = ids;
    part_done["content_index"] = 0;
    part_done["part"] = part;
    out += emit("response.content_part.done", part_done);
    open_item_["content"] = json::array({part});
  }
  if (open_item_.contains("status")) open_item_["status"] = "completed";
  out += emit("response.output_item.done", {{"output_index", out_index}, {"item", open_item_}});
  items_.push_back(open_item_);
  open_ = Open::none;
  return out;
}

std::string ResponsesRenderer::on_delta(const GenEvent& event) {
  Open kind = Open::none;
  std::string delta;
  if (const auto* t = std::get_if<TextDelta>(&event)) kind = Open::message, delta = t->text;
  if (const auto* r = std::get_if<ReasoningDelta>(&event)) kind = Open::reasoning, delta = r->text;
  if (const auto* a = std::get_if<ToolCallArgsDelta>(&event)) {
    kind = Open::function_call, delta = a->delta;
    RT_ASSERT(open_ == Open::function_call, "arguments without an open function_call");
  }
  std::string out;
  if (std::holds_alternative<ToolCallStart>(event)) {
    (void)take_unsent_logprobs();  // tool-call tokens: not output_text
    out += close_item();
    return out + open_item(Open::function_call, event);
  }
  RT_ASSERT(kind != Open::none, "on_delta with a non-delta", event.index());
  if (delta.empty()) return out;
  if (kind != Open::message) (void)take_unsent_logprobs();  // not output_text tokens
  if (open_ != kind) {
    out += close_item();
    out += open_item(kind, event);
  }
  open_text_ += delta;
  int64_t out_index = static_cast<int64_t>(items_.size());
  if (options_.stream && !options_.logprobs && kind != Open::function_call) {
    // Per token: the event written around the escaped text (the bytes emit() gives for the
    // same fields; keys in nlohmann::json's sorted order).
    const char* type =
        kind == Open::message ? "response.output_text.delta" : "response.reasoning_text.delta";
    std::string data = R"({"content_index":0,"delta":)" +
                       json(delta).dump(-1, ' ', false, utf8_replace) + R"(,"item_id":)" +
                       open_item_["id"].dump(-1, ' ', false, utf8_replace) +
                       (kind == Open::message ? R"(,"logprobs":[])" : "") +
                       R"(,"output_index":)" + std::to_string(out_index) +
                       R"(,"sequence_number":)" + std::to_string(sequence_number_++) +
                       R"(,"type":")" + type + "\"}";
    return out + sse_event(type, data);
  }
  json fields = {{"item_id", open_item_["id"]}, {"output_index", out_index}, {"delta", delta}};
  if (kind == Open::function_call) {
    return out + emit("response.function_call_arguments.delta", fields);
  }
  fields["content_index"] = 0;
  if (kind == Open::message) fields["logprobs"] = delta_logprobs();
  return out + emit(kind == Open::message ? "response.output_text.delta"
                                          : "response.reasoning_text.delta",
                    fields);
}

std::string ResponsesRenderer::feed(const GenEvent& event) {
  account(event, "call_");
  if (const ApiError* e = terminal_error(event)) {
    json fields = {{"message", e->message}};
    fields["code"] = e->code.empty() ? json(e->type) : json(e->code);
    fields["param"] = e->param.empty() ? json(nullptr) : json(e->param);
    return emit("error", fields);
  }
  if (event.index() <= 3) return on_delta(event);
  if (std::holds_alternative<LogprobsDelta>(event)) return {};  // sent with the next delta
  if (std::holds_alternative<Finish>(event)) return close_item();
  RT_ASSERT(std::holds_alternative<UsageReport>(event), "unhandled event", event.index());
  bool incomplete = finish_.reason == FinishReason::length;
  std::string status = incomplete ? "incomplete" : "completed";
  return emit(incomplete ? "response.incomplete" : "response.completed",
              {{"response", response_object(status)}});
}

std::string ResponsesRenderer::body() const {
  RT_ASSERT(done_, "body() before the terminal event");
  RT_ASSERT(!error_, "body() after an error; render error() instead");
  RT_ASSERT(open_ == Open::none, "an item is still open");
  bool incomplete = finish_.reason == FinishReason::length;
  return response_object(incomplete ? "incomplete" : "completed")
      .dump(-1, ' ', false, utf8_replace);
}

}  // namespace tandem::gateway
