#include "actors/gateway/output_parser.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

namespace tandem::gateway {
namespace {

using json = nlohmann::ordered_json;
// Model text may be any bytes: invalid UTF-8 is replaced (U+FFFD), never thrown.
constexpr auto utf8_replace = json::error_handler_t::replace;

constexpr std::string_view think_open = "<think>";
constexpr std::string_view think_close = "</think>";
constexpr std::string_view minimax_open = "<minimax:tool_call>";
constexpr std::string_view minimax_close = "</minimax:tool_call>";
constexpr std::string_view invoke_open = "<invoke name=";
constexpr std::string_view invoke_close = "</invoke>";
constexpr std::string_view param_open = "<parameter name=";
constexpr std::string_view param_close = "</parameter>";
constexpr std::string_view qwen_open = "<tool_call>";
constexpr std::string_view qwen_close = "</tool_call>";

// Length of the longest proper prefix of `marker` that `text` ends with.
size_t held_prefix(std::string_view text, std::string_view marker) {
  RT_ASSERT(!marker.empty(), "empty marker");
  for (size_t k = std::min(text.size(), marker.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

// `text` is a proper prefix of `marker` (more input may complete it).
bool proper_prefix_of(std::string_view text, std::string_view marker) {
  return text.size() < marker.size() && marker.substr(0, text.size()) == text;
}

bool is_space(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), is_space);
}

std::string_view trim(std::string_view s, std::string_view chars) {
  size_t b = s.find_first_not_of(chars);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(chars);
  return s.substr(b, e - b + 1);
}

// `name="f"` / `name='f'` / `name=f` -> f
std::string unquote_name(std::string_view raw) {
  std::string_view s = trim(raw, " \t\r\n");
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
    s = s.substr(1, s.size() - 2);
  }
  return std::string(s);
}

std::optional<json> convert_to(std::string_view type, const std::string& value) {
  if (type == "boolean") {
    std::string lower(trim(value, " \t\r\n"));
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "true" || lower == "false") return json(lower == "true");
    return std::nullopt;
  }
  if (type == "null") {
    if (trim(value, " \t\r\n") == "null") return json(nullptr);
    return std::nullopt;
  }
  json parsed = json::parse(value, nullptr, false);
  if (parsed.is_discarded()) return std::nullopt;
  bool fits = (type == "integer" && parsed.is_number_integer()) ||
              (type == "number" && parsed.is_number()) ||
              (type == "object" && parsed.is_object()) || (type == "array" && parsed.is_array());
  if (fits) return parsed;
  return std::nullopt;
}

// A parameter value typed by its schema in `properties` (JSON text); a string otherwise.
json typed_value(const std::string& properties_text, const std::string& name,
                 const std::string& value) {
  if (properties_text.empty()) return json(value);
  json properties = json::parse(properties_text, nullptr, false);
  if (!properties.is_object() || !properties.contains(name)) return json(value);
  const json& schema = properties[name];
  if (!schema.is_object() || !schema.contains("type")) return json(value);
  json types = schema["type"].is_array() ? schema["type"] : json::array({schema["type"]});
  for (const json& t : types) {
    if (!t.is_string() || t == "string") continue;
    if (std::optional<json> v = convert_to(t.get<std::string>(), value)) return *v;
  }
  return json(value);
}

}  // namespace

OutputParser::OutputParser(OutputParserConfig config) : config_(std::move(config)) {
  RT_ASSERT(!config_.starts_in_reasoning || config_.reasoning,
            "starts_in_reasoning needs reasoning");
  for (const std::string& tool_text : config_.tools_json) {
    json tool = json::parse(tool_text, nullptr, false);
    if (!tool.is_object() || !tool.contains("function")) continue;
    const json& f = tool["function"];
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    std::string properties;
    if (f.contains("parameters") && f["parameters"].is_object() &&
        f["parameters"].contains("properties")) {
      properties = f["parameters"]["properties"].dump(-1, ' ', false, utf8_replace);
    }
    properties_by_tool_[f["name"].get<std::string>()] = std::move(properties);
  }
  if (config_.starts_in_reasoning) state_ = State::reasoning;
}

std::vector<GenEvent> OutputParser::feed(std::string_view chunk) {
  RT_ASSERT(!finished_, "feed() after finish()");
  RT_ASSERT(out_.empty(), "events left from the previous feed");
  buffer_.append(chunk);
  run(false);
  return std::move(out_);
}

std::vector<GenEvent> OutputParser::finish() {
  RT_ASSERT(!finished_, "finish() twice");
  RT_ASSERT(out_.empty(), "events left from the previous feed");
  finished_ = true;
  run(true);
  if (state_ == State::minimax_invoke) {
    close_invoke();
  } else if (state_ == State::minimax_block && block_invokes_count_ == 0) {
    emit_text(std::string(minimax_open) + block_raw_ + buffer_);
  } else if (state_ == State::qwen_call) {
    emit_text(std::string(qwen_open) + buffer_);
  }
  buffer_.clear();
  return std::move(out_);
}

void OutputParser::run(bool at_end) {
  for (bool progress = true; progress;) {
    switch (state_) {
      case State::text:
        progress = step_text(at_end);
        break;
      case State::reasoning:
        progress = step_reasoning(at_end);
        break;
      case State::minimax_block:
      case State::minimax_invoke:
        progress = step_minimax();
        break;
      case State::qwen_call:
        progress = step_qwen();
        break;
    }
  }
}

void OutputParser::emit(GenEvent event) {
  if (!out_.empty() && out_.back().index() == event.index()) {
    if (auto* t = std::get_if<TextDelta>(&out_.back())) {
      t->text += std::get<TextDelta>(event).text;
      return;
    }
    if (auto* r = std::get_if<ReasoningDelta>(&out_.back())) {
      r->text += std::get<ReasoningDelta>(event).text;
      return;
    }
    auto* a = std::get_if<ToolCallArgsDelta>(&out_.back());
    if (a != nullptr && a->index == std::get<ToolCallArgsDelta>(event).index) {
      a->delta += std::get<ToolCallArgsDelta>(event).delta;
      return;
    }
  }
  out_.push_back(std::move(event));
}

void OutputParser::emit_text(std::string_view text) {
  if (strip_newlines_) {
    size_t keep = text.find_first_not_of("\r\n");
    text = keep == std::string_view::npos ? std::string_view() : text.substr(keep);
    if (!text.empty()) strip_newlines_ = false;
  }
  if (text.empty()) return;
  if (!all_space(text)) think_allowed_ = false;
  emit(TextDelta{std::string(text)});
}

bool OutputParser::step_text(bool at_end) {
  std::string_view buf = buffer_;
  std::string_view tool_marker = config_.tool_format == ToolCallFormat::minimax_m2 ? minimax_open
                                 : config_.tool_format == ToolCallFormat::qwen     ? qwen_open
                                                                                   : "";
  bool think_ok = config_.reasoning && think_allowed_;
  size_t best = tool_marker.empty() ? std::string_view::npos : buf.find(tool_marker);
  std::string_view which = tool_marker;
  if (think_ok) {
    size_t p = buf.find(think_open);
    if (p != std::string_view::npos && p < best && all_space(buf.substr(0, p))) {
      best = p;
      which = think_open;
    }
  }
  if (best != std::string_view::npos) {
    emit_text(buf.substr(0, best));
    buffer_.erase(0, best + which.size());
    strip_newlines_ = false;
    think_allowed_ = false;
    if (which == think_open) {
      state_ = State::reasoning;
    } else if (which == minimax_open) {
      state_ = State::minimax_block;
      block_invokes_count_ = 0;
      block_raw_.clear();
    } else {
      state_ = State::qwen_call;
    }
    return true;
  }
  size_t hold = 0;
  if (!at_end && !tool_marker.empty()) hold = held_prefix(buf, tool_marker);
  if (!at_end && think_ok) {
    size_t h = held_prefix(buf, think_open);
    if (h > 0 && all_space(buf.substr(0, buf.size() - h))) hold = std::max(hold, h);
  }
  RT_ASSERT(hold <= buf.size(), hold);
  emit_text(buf.substr(0, buf.size() - hold));
  buffer_.erase(0, buffer_.size() - hold);
  return false;
}

bool OutputParser::step_reasoning(bool at_end) {
  std::string_view buf = buffer_;
  size_t p = buf.find(think_close);
  if (p != std::string_view::npos) {
    if (p > 0) emit(ReasoningDelta{std::string(buf.substr(0, p))});
    buffer_.erase(0, p + think_close.size());
    state_ = State::text;
    think_allowed_ = false;
    strip_newlines_ = true;
    return true;
  }
  size_t hold = at_end ? 0 : held_prefix(buf, think_close);
  if (buf.size() > hold) emit(ReasoningDelta{std::string(buf.substr(0, buf.size() - hold))});
  buffer_.erase(0, buffer_.size() - hold);
  return false;
}

void OutputParser::consume(size_t bytes) {
  RT_ASSERT(bytes <= buffer_.size(), bytes, buffer_.size());
  if (block_invokes_count_ == 0) block_raw_.append(buffer_, 0, bytes);
  buffer_.erase(0, bytes);
}

bool OutputParser::step_minimax() {
  size_t spaces = 0;
  while (spaces < buffer_.size() && is_space(buffer_[spaces])) ++spaces;
  consume(spaces);
  if (buffer_.empty()) return false;
  std::string_view buf = buffer_;
  if (state_ == State::minimax_block) {
    if (buf.starts_with(minimax_close)) {
      consume(minimax_close.size());
      state_ = State::text;
      return true;
    }
    if (buf.starts_with(invoke_open)) {
      size_t gt = buf.find('>');
      if (gt == std::string_view::npos) return false;
      std::string name = unquote_name(buf.substr(invoke_open.size(), gt - invoke_open.size()));
      consume(gt + 1);
      emit(ToolCallStart{tool_index_++, "", name});
      ++block_invokes_count_;
      invoke_name_ = std::move(name);
      invoke_params_count_ = 0;
      state_ = State::minimax_invoke;
      return true;
    }
    if (proper_prefix_of(buf, minimax_close) || proper_prefix_of(buf, invoke_open)) return false;
  } else {
    if (buf.starts_with(invoke_close) || buf.starts_with(minimax_close)) {
      if (buf.starts_with(invoke_close)) consume(invoke_close.size());
      close_invoke();
      state_ = State::minimax_block;
      return true;
    }
    if (buf.starts_with(param_open)) {
      size_t gt = buf.find('>');
      if (gt == std::string_view::npos) return false;
      size_t end = buf.find(param_close, gt + 1);
      if (end == std::string_view::npos) return false;
      std::string name = unquote_name(buf.substr(param_open.size(), gt - param_open.size()));
      std::string value(trim(buf.substr(gt + 1, end - gt - 1), "\r\n"));
      consume(end + param_close.size());
      finish_minimax_param(name, value);
      return true;
    }
    if (proper_prefix_of(buf, invoke_close) || proper_prefix_of(buf, param_open) ||
        proper_prefix_of(buf, minimax_close)) {
      return false;
    }
  }
  // Unrecognised text inside the block: drop up to the next tag.
  size_t next = buf.find('<', 1);
  consume(next == std::string_view::npos ? buf.size() : next);
  return true;
}

void OutputParser::finish_minimax_param(const std::string& name, const std::string& value) {
  RT_ASSERT(state_ == State::minimax_invoke, "a parameter outside an invoke");
  RT_ASSERT(tool_index_ >= 1, tool_index_);
  auto it = properties_by_tool_.find(invoke_name_);
  std::string properties = it == properties_by_tool_.end() ? std::string() : it->second;
  std::string piece = invoke_params_count_ == 0 ? "{" : ",";
  piece += json(name).dump(-1, ' ', false, utf8_replace) + ":" +
           typed_value(properties, name, value).dump(-1, ' ', false, utf8_replace);
  ++invoke_params_count_;
  emit(ToolCallArgsDelta{tool_index_ - 1, std::move(piece)});
}

void OutputParser::close_invoke() {
  RT_ASSERT(state_ == State::minimax_invoke, "close_invoke outside an invoke");
  RT_ASSERT(tool_index_ >= 1, tool_index_);
  emit(ToolCallArgsDelta{tool_index_ - 1, invoke_params_count_ == 0 ? "{}" : "}"});
  invoke_name_.clear();
  invoke_params_count_ = 0;
}

bool OutputParser::step_qwen() {
  size_t p = buffer_.find(qwen_close);
  if (p == std::string::npos) return false;
  std::string body = buffer_.substr(0, p);
  buffer_.erase(0, p + qwen_close.size());
  state_ = State::text;
  json call = json::parse(body, nullptr, false);
  std::optional<std::string> args;
  if (call.is_object() && call.contains("name") && call["name"].is_string()) {
    const json* a = call.contains("arguments")    ? &call["arguments"]
                    : call.contains("parameters") ? &call["parameters"]
                                                  : nullptr;
    if (a == nullptr) {
      args = "{}";
    } else if (a->is_object()) {
      args = a->dump();
    } else if (a->is_string()) {
      json inner = json::parse(a->get<std::string>(), nullptr, false);
      if (inner.is_object()) args = inner.dump(-1, ' ', false, utf8_replace);
    }
  }
  if (!args) {
    emit_text(std::string(qwen_open) + body + std::string(qwen_close));
    return true;
  }
  emit(ToolCallStart{tool_index_, "", call["name"].get<std::string>()});
  emit(ToolCallArgsDelta{tool_index_, *args});
  ++tool_index_;
  return true;
}

}  // namespace tandem::gateway
