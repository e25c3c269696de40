#include "actors/gateway/api_request.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "actors/gateway/json_text.hpp"
#include "actors/gateway/request_common.hpp"

namespace tandem::gateway {

std::optional<json> parse_body(FieldReader& reader, std::string_view body) {
  // Invalid UTF-8 and numbers beyond a double are 400s named here, before the parser (which
  // would quote the raw bytes, or read an infinity).
  if (std::optional<std::string> bad = check_json_text(body)) {
    reader.fail_invalid("", "request body is not valid JSON: " + *bad);
    return std::nullopt;
  }
  json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Malformed bodies only: parse again with exceptions for where it went wrong.
    std::string where;
    try {
      json again = json::parse(body);  // throws: the first parse failed
    } catch (const json::parse_error& e) {
      std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
      size_t at = what.find("] ");
      where = ": " + printable(at == std::string::npos ? what : what.substr(at + 2));
    }
    reader.fail_invalid("", "request body is not valid JSON" + where);
    return std::nullopt;
  }
  if (!root.is_object()) {
    reader.fail_invalid("", "request body must be a JSON object, got " + json_type_name(root));
    return std::nullopt;
  }
  return root;
}

void read_model(FieldReader& reader, const json& root, GenerateSpec& spec) {
  reader.required(root, "model", "");
  std::optional<std::string> model = reader.string(root, "model", "");
  if (model && model->empty()) reader.fail_invalid("model", "model must not be empty");
  if (model) spec.model = *model;
}

namespace {
void read_penalties(FieldReader& reader, const json& root, SamplingSpec& s) {
  if (auto v = reader.number_in(root, "presence_penalty", "", -2, 2)) s.presence_penalty = *v;
  if (auto v = reader.number_in(root, "frequency_penalty", "", -2, 2)) s.frequency_penalty = *v;
  if (auto v = reader.number(root, "repetition_penalty", "")) {
    if (!(*v > 0) || !std::isfinite(*v)) {
      reader.fail_invalid("repetition_penalty",
                          "repetition_penalty must be > 0, got " + number_text(*v));
    } else {
      s.repetition_penalty = *v;
    }
  }
}

void read_logprobs(FieldReader& reader, const json& root, SamplingSpec& s) {
  if (auto v = reader.boolean(root, "logprobs", "")) s.logprobs = *v;
  if (auto v = reader.integer(root, "top_logprobs", "")) {
    if (*v < 0 || *v > top_logprobs_max) {
      reader.fail_invalid("top_logprobs",
                          "top_logprobs must be in [0, 20], got " + std::to_string(*v));
    } else if (*v > 0 && !s.logprobs) {
      reader.fail_invalid("top_logprobs", "top_logprobs requires logprobs to be true");
    } else {
      s.top_logprobs = *v;
    }
  }
}
}  // namespace

void read_sampling(FieldReader& reader, const json& root, double temperature_max, SamplingSpec& s) {
  if (auto v = reader.number_in(root, "temperature", "", 0, temperature_max)) s.temperature = *v;
  if (auto v = reader.number(root, "top_p", "")) {
    if (!(*v > 0 && *v <= 1)) {
      reader.fail_invalid("top_p", "top_p must be in (0, 1], got " + number_text(*v));
    } else {
      s.top_p = *v;
    }
  }
  if (auto v = reader.integer(root, "top_k", "")) {
    if (*v < -1) {
      reader.fail_invalid("top_k",
                          "top_k must be -1, 0 (disabled) or >= 1, got " + std::to_string(*v));
    } else {
      s.top_k = *v == 0 ? -1 : *v;
    }
  }
  if (auto v = reader.number_in(root, "min_p", "", 0, 1)) s.min_p = *v;
  read_penalties(reader, root, s);
  if (auto v = reader.integer(root, "seed", "")) s.seed = static_cast<uint64_t>(*v);
  if (auto v = reader.boolean(root, "speculative", "")) s.speculative = *v;
  if (auto n = reader.integer(root, "n", ""); n && *n != 1) {
    reader.fail(
        unsupported("n", "n must be 1 (one choice per request), got " + std::to_string(*n)));
  }
  RT_ASSERT(s.top_k == -1 || s.top_k >= 1, s.top_k);
}

void read_logprobs_chat(FieldReader& reader, const json& root, SamplingSpec& s) {
  read_logprobs(reader, root, s);
}

void read_stop(FieldReader& reader, const json& root, std::string_view key, SamplingSpec& s) {
  if (reader.failed()) return;
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) return;
  std::string p(key);
  if (it->is_string()) {
    if (it->get<std::string>().empty()) return reader.fail_invalid(p, p + " must not be empty");
    s.stop.push_back(it->get<std::string>());
    return;
  }
  if (!it->is_array()) {
    return reader.fail_invalid(
        p, p + " must be a string or an array of strings, got " + json_type_name(*it));
  }
  if (it->size() > stop_strings_max) {
    return reader.fail_invalid(p, p + " allows at most " + std::to_string(stop_strings_max) +
                                      " strings, got " + std::to_string(it->size()));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& one = (*it)[i];
    if (!one.is_string() || one.get<std::string>().empty()) {
      return reader.fail_invalid(path_index(p, i),
                                 path_index(p, i) + " must be a non-empty string");
    }
    s.stop.push_back(one.get<std::string>());
  }
}

void read_max_tokens(FieldReader& reader, const json& root, std::string_view key,
                     GenerateSpec& spec) {
  std::optional<int64_t> v = reader.integer(root, key, "");
  if (!v) return;
  std::string p(key);
  if (*v < 1) return reader.fail_invalid(p, p + " must be >= 1, got " + std::to_string(*v));
  if (spec.max_tokens && *spec.max_tokens != *v) {
    return reader.fail_invalid(p, p + " (" + std::to_string(*v) + ") contradicts " +
                                      spec.max_tokens_param + " (" +
                                      std::to_string(*spec.max_tokens) + ")");
  }
  spec.max_tokens = *v;
  spec.max_tokens_param = p;
}

void read_stream_and_salt(FieldReader& reader, const json& root, GenerateSpec& spec) {
  if (auto v = reader.boolean(root, "stream", "")) spec.stream = *v;
  if (const json* options = reader.object(root, "stream_options", "")) {
    if (!spec.stream) {
      reader.fail_invalid("stream_options", "stream_options is only allowed when stream is true");
    }
    if (auto v = reader.boolean(*options, "include_usage", "stream_options")) {
      spec.include_usage = *v;
    }
  }
  if (auto v = reader.string(root, "cache_salt", "")) {
    if (v->empty()) reader.fail_invalid("cache_salt", "cache_salt must not be empty");
    spec.cache_salt = *v;
  }
}

std::string neutral_tool_json(FieldReader& reader, const json& name, const json* description,
                              const json* parameters, const std::string& path) {
  if (!name.is_string() || name.get<std::string>().empty()) {
    reader.fail_invalid(path_key(path, "name"),
                        path_key(path, "name") + " must be a non-empty string");
    return {};
  }
  json function = {{"name", name}};
  if (description != nullptr && description->is_string()) function["description"] = *description;
  if (parameters != nullptr && !parameters->is_null()) {
    if (!parameters->is_object()) {
      reader.fail_invalid(path_key(path, "parameters"), path_key(path, "parameters") +
                                                            " must be a JSON Schema object, got " +
                                                            json_type_name(*parameters));
      return {};
    }
    function["parameters"] = *parameters;
  }
  return json{{"type", "function"}, {"function", function}}.dump();
}

void check_named_tool(FieldReader& reader, const GenerateSpec& spec, const std::string& path) {
  if (reader.failed() || spec.tool_choice.mode != ToolChoiceMode::named) return;
  for (const std::string& tool : spec.conversation.tools_json) {
    json t = json::parse(tool);
    if (t["function"]["name"] == spec.tool_choice.name) return;
  }
  reader.fail_invalid(path,
                      path + " names tool '" + spec.tool_choice.name + "', which is not in tools");
}

std::string read_text_content(FieldReader& reader, const json& content, const std::string& path,
                              std::initializer_list<std::string_view> text_types) {
  if (reader.failed() || content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    reader.fail_invalid(path, path + " must be a string or an array of content parts, got " +
                                  json_type_name(content));
    return {};
  }
  std::string text;
  for (size_t i = 0; i < content.size() && !reader.failed(); ++i) {
    std::string part_path = path_index(path, i);
    const json& part = content[i];
    if (!part.is_object()) {
      reader.fail_invalid(part_path, part_path + " must be an object");
      break;
    }
    std::optional<std::string> type = reader.string(part, "type", part_path);
    bool is_text = false;
    for (std::string_view t : text_types) is_text = is_text || (type && *type == t);
    if (!is_text) {
      std::string tp = path_key(part_path, "type");
      reader.fail(unsupported(
          tp, tp + ": content part type '" + type.value_or("") + "' is not supported (text only)"));
      break;
    }
    reader.required(part, "text", part_path);
    if (auto t = reader.string(part, "text", part_path)) text += *t;
  }
  return text;
}

void fill_tool_names(Conversation& conversation) {
  std::map<std::string, std::string> names_by_id;
  for (ChatMessage& m : conversation.messages) {
    for (const ToolCall& call : m.tool_calls) names_by_id[call.id] = call.name;
    if (m.role == ChatRole::tool && m.name.empty()) {
      auto it = names_by_id.find(m.tool_call_id);
      if (it != names_by_id.end()) m.name = it->second;
    }
  }
}

ApiResult<GenerateSpec> parse_request(ApiKind kind, std::string_view body) {
  switch (kind) {
    case ApiKind::chat_completions:
      return parse_chat_request(body);
    case ApiKind::completions:
      return parse_completion_request(body);
    case ApiKind::responses:
      return parse_responses_request(body);
    case ApiKind::messages:
    case ApiKind::count_tokens:
      return parse_messages_request(body, kind);
  }
  RT_ASSERT(false, "unknown ApiKind", static_cast<int>(kind));
  return invalid_request("", "unreachable");
}

std::string anthropic_error_type(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return "api_error";
  }
}

std::string render_error_body(ApiKind kind, const ApiError& error) {
  RT_ASSERT(!error.message.empty(), "error without a message");
  RT_ASSERT(error.http_status >= 400 && error.http_status < 600, error.http_status);
  if (kind == ApiKind::messages || kind == ApiKind::count_tokens) {
    json body = {
        {"type", "error"},
        {"error", {{"type", anthropic_error_type(error.http_status)}, {"message", error.message}}}};
    return body.dump(-1, ' ', false, json::error_handler_t::replace);  // never throws
  }
  json e = {{"message", error.message}, {"type", error.type}};
  e["param"] = error.param.empty() ? json(nullptr) : json(error.param);
  e["code"] = error.code.empty() ? json(nullptr) : json(error.code);
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {
std::string prompt_param(ApiKind kind) {
  switch (kind) {
    case ApiKind::completions:
      return "prompt";
    case ApiKind::responses:
      return "input";
    default:
      return "messages";
  }
}
}  // namespace

ApiResult<int64_t> check_context_length(const GenerateSpec& spec, int64_t prompt_tokens,
                                        int64_t model_len_tokens_max) {
  RT_ASSERT(prompt_tokens >= 0, prompt_tokens);
  RT_ASSERT(model_len_tokens_max >= 1, model_len_tokens_max);
  auto too_long = [](std::string param, std::string message) {
    ApiError e = invalid_request(std::move(param), std::move(message));
    e.code = "context_length_exceeded";
    return e;
  };
  std::string limit = "This model's maximum context length is " +
                      std::to_string(model_len_tokens_max) + " tokens. ";
  if (prompt_tokens >= model_len_tokens_max) {
    return too_long(prompt_param(spec.api),
                    limit + "However, the prompt has " + std::to_string(prompt_tokens) +
                        " tokens, which leaves no room to generate. Shorten the prompt.");
  }
  if (!spec.max_tokens) return model_len_tokens_max - prompt_tokens;
  int64_t max_tokens = *spec.max_tokens;
  RT_ASSERT(max_tokens >= 1, max_tokens);
  int64_t requested_tokens =
      max_tokens > INT64_MAX - prompt_tokens ? INT64_MAX : prompt_tokens + max_tokens;
  if (max_tokens > model_len_tokens_max - prompt_tokens) {
    return too_long(spec.max_tokens_param,
                    limit + "However, you requested " + std::to_string(requested_tokens) +
                        " tokens (" + std::to_string(prompt_tokens) + " in the prompt, " +
                        std::to_string(max_tokens) + " in " + spec.max_tokens_param +
                        "). Reduce the prompt or " + spec.max_tokens_param + ".");
  }
  return max_tokens;
}

void check_ignored_fields(FieldReader& reader, const json& root,
                          std::initializer_list<TypedField> fields) {
  RT_ASSERT(root.is_object(), "parse_body returned an object");
  for (const TypedField& f : fields) {
    if (reader.failed()) return;
    RT_ASSERT(!f.key.empty(), "a field name");
    switch (f.kind) {
      case JsonKind::string: (void)reader.string(root, f.key, ""); break;
      case JsonKind::boolean: (void)reader.boolean(root, f.key, ""); break;
      case JsonKind::integer: (void)reader.integer(root, f.key, ""); break;
      case JsonKind::number: (void)reader.number(root, f.key, ""); break;
      case JsonKind::object: (void)reader.object(root, f.key, ""); break;
      case JsonKind::array: (void)reader.array(root, f.key, ""); break;
    }
  }
}

int64_t prompt_tokens_max(const GenerateSpec& spec, int64_t model_len_tokens_max) {
  RT_ASSERT(model_len_tokens_max >= 1, model_len_tokens_max);
  int64_t output = spec.max_tokens ? std::max<int64_t>(1, *spec.max_tokens) : 1;
  int64_t left = output >= model_len_tokens_max ? 0 : model_len_tokens_max - output;
  RT_ASSERT(left >= 0 && left < model_len_tokens_max, left);
  return left;
}

ApiError prompt_too_long(const GenerateSpec& spec, int64_t prompt_tokens_min,
                         int64_t model_len_tokens_max) {
  RT_ASSERT(prompt_tokens_min > prompt_tokens_max(spec, model_len_tokens_max),
            prompt_tokens_min);
  std::string limit = "This model's maximum context length is " +
                      std::to_string(model_len_tokens_max) + " tokens. However, the prompt has " +
                      "more than " + std::to_string(prompt_tokens_min) +
                      " tokens (tokenizing stopped there)";
  ApiError e;
  if (spec.max_tokens) {
    e = invalid_request(spec.max_tokens_param,
                        limit + " and " + std::to_string(*spec.max_tokens) + " are requested in " +
                            spec.max_tokens_param + ". Reduce the prompt or " +
                            spec.max_tokens_param + ".");
  } else {
    e = invalid_request(prompt_param(spec.api), limit + ", which leaves no room to generate. "
                                                        "Shorten the prompt.");
  }
  e.code = "context_length_exceeded";
  return e;
}

}  // namespace tandem::gateway
