#include "actors/gateway/api_response.hpp"

#include "actors/gateway/renderers.hpp"

namespace tandem::gateway {

std::string IdGenerator::next(std::string_view prefix) {
  static constexpr std::string_view alphabet =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  constexpr size_t id_chars_count = 24;
  std::string id(prefix);
  while (id.size() < prefix.size() + id_chars_count) {
    // splitmix64
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int i = 0; i < 8 && id.size() < prefix.size() + id_chars_count; ++i) {
      id.push_back(alphabet[(z >> (i * 8)) % alphabet.size()]);
    }
  }
  RT_ASSERT(id.size() == prefix.size() + id_chars_count, id.size());
  return id;
}

std::string sse_data(std::string_view data) {
  RT_ASSERT(data.find('\n') == std::string_view::npos, "SSE data must be one line");
  return "data: " + std::string(data) + "\n\n";
}

std::string sse_event(std::string_view name, std::string_view data) {
  RT_ASSERT(!name.empty(), "SSE event needs a name");
  RT_ASSERT(data.find('\n') == std::string_view::npos, "SSE data must be one line");
  return "event: " + std::string(name) + "\ndata: " + std::string(data) + "\n\n";
}

std::string render_count_tokens(int64_t input_tokens) {
  RT_ASSERT(input_tokens >= 0, input_tokens);
  return json{{"input_tokens", input_tokens}}.dump(-1, ' ', false, utf8_replace);
}

ApiError generation_failed_error() {
  return ApiError{500, "api_error", "", "", "generation failed on the server"};
}

std::unique_ptr<Renderer> make_renderer(ApiKind kind, RenderOptions options, IdGenerator& ids) {
  switch (kind) {
    case ApiKind::chat_completions:
      return std::make_unique<ChatRenderer>(std::move(options), ids);
    case ApiKind::completions:
      return std::make_unique<CompletionRenderer>(std::move(options), ids);
    case ApiKind::responses:
      return std::make_unique<ResponsesRenderer>(std::move(options), ids);
    case ApiKind::messages:
      return std::make_unique<MessagesRenderer>(std::move(options), ids);
    case ApiKind::count_tokens:
      break;
  }
  RT_ASSERT(false, "no renderer for this ApiKind", static_cast<int>(kind));
  return nullptr;
}

void append_json_string(std::string& out, std::string_view text) {
  bool plain = true;
  for (char c : text) {
    auto b = static_cast<unsigned char>(c);
    plain = plain && b >= 0x20 && b < 0x7f && c != '"' && c != '\\';
  }
  if (!plain) {
    out += json(std::string(text)).dump(-1, ' ', false, utf8_replace);
    return;
  }
  out += '"';
  out += text;
  out += '"';
}

std::string chat_usage_text(const Usage& u) {
  return "{\"completion_tokens\":" + std::to_string(u.completion_tokens) +
         ",\"completion_tokens_details\":{\"reasoning_tokens\":" +
         std::to_string(u.reasoning_tokens) + "},\"prompt_tokens\":" +
         std::to_string(u.prompt_tokens) + ",\"prompt_tokens_details\":{\"cached_tokens\":" +
         std::to_string(u.cached_tokens) + "},\"total_tokens\":" +
         std::to_string(u.prompt_tokens + u.completion_tokens) + "}";
}

json chat_usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
              {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}}};
}

const ApiError* RendererBase::terminal_error(const GenEvent& event) {
  if (const auto* e = std::get_if<StreamError>(&event)) {
    error_ = e->error;
  } else if (const auto* f = std::get_if<Finish>(&event); f && f->reason == FinishReason::error) {
    error_ = generation_failed_error();
  } else {
    return nullptr;
  }
  done_ = true;
  return &*error_;
}

void RendererBase::account(const GenEvent& event, std::string_view tool_id_prefix) {
  RT_ASSERT(begun_, "feed() before begin()");
  RT_ASSERT(!done_, "feed() after the terminal event");
  bool is_delta = event.index() <= 3;
  RT_ASSERT(!(is_delta && finished_), "a delta after Finish");
  if (const auto* t = std::get_if<TextDelta>(&event)) {
    text_ += t->text;
  } else if (const auto* r = std::get_if<ReasoningDelta>(&event)) {
    reasoning_ += r->text;
  } else if (const auto* s = std::get_if<ToolCallStart>(&event)) {
    RT_ASSERT(s->index == static_cast<int64_t>(tools_.size()), "tool indexes count from 0",
              s->index);
    std::string id = s->id.empty() ? ids_.next(tool_id_prefix) : s->id;
    tools_.push_back(ToolCallAccum{s->index, std::move(id), s->name, ""});
  } else if (const auto* a = std::get_if<ToolCallArgsDelta>(&event)) {
    RT_ASSERT(!tools_.empty() && tools_.back().index == a->index, "args for an unopened tool",
              a->index);
    tools_.back().arguments += a->delta;
  } else if (const auto* f = std::get_if<Finish>(&event)) {
    RT_ASSERT(!finished_, "two Finish events");
    finished_ = true;
    finish_ = *f;
  } else if (const auto* l = std::get_if<LogprobsDelta>(&event)) {
    RT_ASSERT(options_.logprobs, "LogprobsDelta for a request without logprobs");
    RT_ASSERT(!finished_, "LogprobsDelta after Finish");
    for (const TokenLogprobs& t : l->tokens) {
      // Completions text_offset: bytes of the choice's text (echo included) before the token.
      int64_t offset = static_cast<int64_t>(options_.echo_text.size());
      if (!logprobs_.empty()) {
        offset = text_offsets_.back() + static_cast<int64_t>(logprobs_.back().token.size());
      }
      text_offsets_.push_back(offset);
      logprobs_.push_back(t);
    }
  } else if (const auto* u = std::get_if<UsageReport>(&event)) {
    RT_ASSERT(finished_, "UsageReport before Finish");
    RT_ASSERT(u->usage.cached_tokens <= u->usage.prompt_tokens, "cached > prompt");
    usage_ = u->usage;
    done_ = true;
  }
}

}  // namespace tandem::gateway

namespace tandem::gateway {

size_t RendererBase::take_unsent_logprobs() {
  RT_ASSERT(unsent_logprobs_index_ <= logprobs_.size(), unsent_logprobs_index_);
  RT_ASSERT(text_offsets_.size() == logprobs_.size(), text_offsets_.size());
  size_t begin = unsent_logprobs_index_;
  unsent_logprobs_index_ = logprobs_.size();
  return begin;
}

namespace {

json bytes_json(const std::string& token) {
  json bytes = json::array();
  for (char c : token) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return bytes;
}

}  // namespace

json chat_logprob_json(const TokenLogprobs& t) {
  RT_ASSERT(t.logprob <= 1e-4, "a logprob is <= 0", t.logprob);
  json top = json::array();
  for (const TokenAlternative& a : t.top) {
    RT_ASSERT(a.logprob <= 1e-4, "a logprob is <= 0", a.logprob);
    top.push_back({{"token", a.token}, {"logprob", a.logprob}, {"bytes", bytes_json(a.token)}});
  }
  return {{"token", t.token},
          {"logprob", t.logprob},
          {"bytes", bytes_json(t.token)},
          {"top_logprobs", std::move(top)}};
}

json chat_logprobs_json(std::span<const TokenLogprobs> tokens) {
  json content = json::array();
  for (const TokenLogprobs& t : tokens) content.push_back(chat_logprob_json(t));
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

nlohmann::ordered_json completion_logprobs_json(std::span<const TokenLogprobs> tokens,
                                                std::span<const int64_t> text_offsets) {
  using ojson = nlohmann::ordered_json;
  RT_ASSERT(tokens.size() == text_offsets.size(), tokens.size(), text_offsets.size());
  ojson texts = ojson::array(), lps = ojson::array(), tops = ojson::array();
  ojson offsets = ojson::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    texts.push_back(tokens[i].token);
    lps.push_back(tokens[i].logprob);
    ojson top = ojson::object();
    // Two alternatives that decode to the same text keep the more probable (listed first).
    for (const TokenAlternative& a : tokens[i].top) {
      if (!top.contains(a.token)) top[a.token] = a.logprob;
    }
    tops.push_back(std::move(top));
    offsets.push_back(text_offsets[i]);
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace tandem::gateway
