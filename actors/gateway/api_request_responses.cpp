// Responses API request parsing (declared in api_request.hpp).
//
// Input items become conversation messages in order. An assistant turn collects what
// belongs together: a reasoning item, then an assistant message and/or function_call items
// merge into one assistant message until a user/system/tool message intervenes.
// `developer` and `system` message items anywhere are system messages in place (chat.hpp);
// `custom_tool_call` / `custom_tool_call_output` are tool calls and results like function
// calls (arguments {"input": text}); `web_search_call` items are skipped; a reasoning item's
// `encrypted_content` is another provider's and is not rendered.
#include "actors/gateway/api_request.hpp"

#include <algorithm>

#include "actors/gateway/request_common.hpp"

namespace tandem::gateway {
namespace {

// The open assistant message to merge into, or a new one.
ChatMessage& assistant_turn(Conversation& c, bool need_no_content, bool need_no_tools) {
  if (!c.messages.empty() && c.messages.back().role == ChatRole::assistant) {
    ChatMessage& last = c.messages.back();
    bool fits =
        (!need_no_content || last.content.empty()) && (!need_no_tools || last.tool_calls.empty());
    if (fits) return last;
  }
  ChatMessage m;
  m.role = ChatRole::assistant;
  c.messages.push_back(std::move(m));
  return c.messages.back();
}

void read_message_item(FieldReader& r, const json& item, const std::string& p, Conversation& c) {
  r.required(item, "role", p);
  std::string role = r.string(item, "role", p).value_or("");
  r.required(item, "content", p);
  if (r.failed()) return;
  std::string text = read_text_content(r, item["content"], path_key(p, "content"),
                                       {"input_text", "output_text", "text"});
  if (role == "assistant") {
    ChatMessage& m = assistant_turn(c, true, true);
    m.content = std::move(text);
    return;
  }
  ChatMessage m;
  if (role == "user") {
    m.role = ChatRole::user;
  } else if (role == "system" || role == "developer") {
    m.role = ChatRole::system;
  } else {
    return r.fail_invalid(path_key(p, "role"), path_key(p, "role") +
                                                   " must be one of user, "
                                                   "system, developer, assistant; got '" +
                                                   role + "'");
  }
  m.content = std::move(text);
  c.messages.push_back(std::move(m));
}

// A call item's required call_id and name (function_call, custom_tool_call).
ToolCall read_call_head(FieldReader& r, const json& item, const std::string& p) {
  ToolCall call;
  r.required(item, "call_id", p);
  call.id = r.string(item, "call_id", p).value_or("");
  r.required(item, "name", p);
  call.name = r.string(item, "name", p).value_or("");
  return call;
}

void read_function_call_item(FieldReader& r, const json& item, const std::string& p,
                             Conversation& c) {
  ToolCall call = read_call_head(r, item, p);
  r.required(item, "arguments", p);
  std::string args = r.string(item, "arguments", p).value_or("");
  if (r.failed()) return;
  json parsed = json::parse(args, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return r.fail_invalid(path_key(p, "arguments"),
                          path_key(p, "arguments") + " must be a JSON object encoded as a string");
  }
  call.arguments_json = std::move(args);
  assistant_turn(c, false, false).tool_calls.push_back(std::move(call));
}

void read_function_output_item(FieldReader& r, const json& item, const std::string& p,
                               Conversation& c) {
  ChatMessage m;
  m.role = ChatRole::tool;
  r.required(item, "call_id", p);
  m.tool_call_id = r.string(item, "call_id", p).value_or("");
  r.required(item, "output", p);
  if (r.failed()) return;
  m.content = read_text_content(r, item["output"], path_key(p, "output"),
                                {"input_text", "output_text", "text"});
  c.messages.push_back(std::move(m));
}

// A custom (freeform) tool call: its `input` text becomes the arguments {"input": text}.
void read_custom_call_item(FieldReader& r, const json& item, const std::string& p,
                           Conversation& c) {
  ToolCall call = read_call_head(r, item, p);
  std::string input = r.string(item, "input", p).value_or("");
  if (r.failed()) return;
  call.arguments_json = json{{"input", input}}.dump();
  assistant_turn(c, false, false).tool_calls.push_back(std::move(call));
}

void read_reasoning_item(FieldReader& r, const json& item, const std::string& p, Conversation& c) {
  std::string text;
  for (const char* key : {"content", "summary"}) {
    const json* parts = r.array(item, key, p);
    if (parts == nullptr || !text.empty()) continue;
    for (size_t i = 0; i < parts->size() && !r.failed(); ++i) {
      std::string pp = path_index(path_key(p, key), i);
      const json& part = (*parts)[i];
      if (!part.is_object()) return r.fail_invalid(pp, pp + " must be an object");
      if (!text.empty()) text += "\n";
      text += r.string(part, "text", pp).value_or("");
    }
  }
  if (r.failed()) return;
  ChatMessage& m = assistant_turn(c, true, true);
  if (!m.reasoning.empty()) m.reasoning += "\n";
  m.reasoning += text;
}

void read_input_item(FieldReader& r, const json& item, const std::string& p, Conversation& c) {
  if (!item.is_object()) return r.fail_invalid(p, p + " must be an object");
  std::string type = r.string(item, "type", p).value_or(item.contains("role") ? "message" : "");
  if (r.failed()) return;
  if (type == "message") return read_message_item(r, item, p, c);
  if (type == "function_call") return read_function_call_item(r, item, p, c);
  if (type == "function_call_output" || type == "custom_tool_call_output") {
    return read_function_output_item(r, item, p, c);
  }
  if (type == "custom_tool_call") return read_custom_call_item(r, item, p, c);
  if (type == "reasoning") return read_reasoning_item(r, item, p, c);
  // A built-in tool's call echoed back (its results were the provider's, not in the item).
  if (type == "web_search_call") return;
  if (type.empty())
    return r.fail_invalid(path_key(p, "type"), path_key(p, "type") + " is required");
  r.fail(unsupported(path_key(p, "type"),
                     path_key(p, "type") + ": input item type '" + type + "' is not supported"));
}

void read_input(FieldReader& r, const json& root, GenerateSpec& spec) {
  if (auto v = r.string(root, "instructions", ""); v && !v->empty()) {
    spec.conversation.messages.push_back(ChatMessage{ChatRole::system, *v});
  }
  const json* input = r.required(root, "input", "");
  if (input == nullptr) return;
  if (input->is_string()) {
    spec.conversation.messages.push_back(ChatMessage{ChatRole::user, input->get<std::string>()});
    return;
  }
  if (!input->is_array()) {
    return r.fail_invalid(
        "input", "input must be a string or an array of items, got " + json_type_name(*input));
  }
  if (input->empty()) return r.fail_invalid("input", "input must contain at least one item");
  for (size_t i = 0; i < input->size() && !r.failed(); ++i) {
    read_input_item(r, (*input)[i], path_index("input", i), spec.conversation);
  }
}

void read_responses_tools(FieldReader& r, const json& root, GenerateSpec& spec) {
  const json* tools = r.array(root, "tools", "");
  for (size_t i = 0; tools != nullptr && i < tools->size() && !r.failed(); ++i) {
    std::string p = path_index("tools", i);
    const json& tool = (*tools)[i];
    if (!tool.is_object()) return r.fail_invalid(p, p + " must be an object");
    r.required(tool, "type", p);
    std::string type = r.string(tool, "type", p).value_or("");
    if (r.failed()) return;
    if (type != "function") continue;  // built-in tools (web_search, ...) are ignored
    r.required(tool, "name", p);
    if (r.failed()) return;
    auto find = [&tool](const char* key) -> const json* {
      auto it = tool.find(key);
      return it == tool.end() ? nullptr : &*it;
    };
    std::string t = neutral_tool_json(r, tool["name"], find("description"), find("parameters"), p);
    if (!r.failed()) spec.conversation.tools_json.push_back(std::move(t));
  }
}

// Logprobs are on when include has "message.output_text.logprobs"; top_logprobs ([0, 20])
// sets the alternatives per token (without the include it is accepted and unused, as OpenAI).
void read_responses_logprobs(FieldReader& r, const json& root, GenerateSpec& spec) {
  const auto& inc = spec.include;
  spec.sampling.logprobs =
      std::find(inc.begin(), inc.end(), "message.output_text.logprobs") != inc.end();
  if (auto v = r.integer(root, "top_logprobs", "")) {
    if (*v < 0 || *v > top_logprobs_max) {
      return r.fail_invalid("top_logprobs",
                            "top_logprobs must be in [0, 20], got " + std::to_string(*v));
    }
    spec.sampling.top_logprobs = spec.sampling.logprobs ? *v : 0;
  }
}

void read_responses_options(FieldReader& r, const json& root, GenerateSpec& spec) {
  if (auto v = r.string(root, "previous_response_id", ""); v && !v->empty()) {
    r.fail(unsupported("previous_response_id",
                       "previous_response_id is not supported: responses are not stored; "
                       "send the full input instead"));
  }
  if (root.contains("conversation") && !root["conversation"].is_null()) {
    r.fail(unsupported("conversation", "conversation is not supported: send the full input"));
  }
  if (const json* reasoning = r.object(root, "reasoning", "")) {
    spec.reasoning.effort = r.string(*reasoning, "effort", "reasoning").value_or("");
    spec.reasoning.summary = r.string(*reasoning, "summary", "reasoning").value_or("");
  }
  if (auto v = r.boolean(root, "store", "")) spec.store = *v;
  if (const json* include = r.array(root, "include", "")) {
    for (size_t i = 0; i < include->size(); ++i) {
      if (!(*include)[i].is_string()) {
        return r.fail_invalid(path_index("include", i),
                              path_index("include", i) + " must be a string");
      }
      spec.include.push_back((*include)[i].get<std::string>());
    }
  }
  read_responses_logprobs(r, root, spec);
}

}  // namespace

ApiResult<GenerateSpec> parse_responses_request(std::string_view body) {
  FieldReader r;
  GenerateSpec spec;
  spec.api = ApiKind::responses;
  std::optional<json> root_opt = parse_body(r, body);
  if (!root_opt) return r.error();
  const json& root = *root_opt;
  read_model(r, root, spec);
  read_responses_options(r, root, spec);
  read_input(r, root, spec);
  read_responses_tools(r, root, spec);
  read_tool_choice_openai(r, root, spec);
  read_sampling(r, root, 2.0, spec.sampling);
  read_max_tokens(r, root, "max_output_tokens", spec);
  if (auto v = r.boolean(root, "stream", "")) spec.stream = *v;
  if (auto v = r.string(root, "cache_salt", "")) spec.cache_salt = *v;
  check_ignored_fields(r, root,
                       {{"user", JsonKind::string},
                        {"metadata", JsonKind::object},
                        {"parallel_tool_calls", JsonKind::boolean},
                        {"service_tier", JsonKind::string},
                        {"prompt_cache_key", JsonKind::string},
                        {"safety_identifier", JsonKind::string},
                        {"truncation", JsonKind::string},
                        {"background", JsonKind::boolean},
                        {"max_tool_calls", JsonKind::integer},
                        {"text", JsonKind::object},
                        {"stream_options", JsonKind::object}});
  if (r.failed()) return r.error();
  fill_tool_names(spec.conversation);
  RT_ASSERT(!spec.conversation.messages.empty(), "input validated above");
  RT_ASSERT(spec.api == ApiKind::responses, "kind");
  return spec;
}

}  // namespace tandem::gateway
