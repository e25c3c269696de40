// Anthropic Messages request parsing (declared in api_request.hpp).
//
// A user message's tool_result blocks become tool messages (in order, before the rest of its
// text); an assistant message's thinking blocks become `reasoning`, tool_use blocks
// tool_calls (input dumped as JSON), text blocks `content`. redacted_thinking is dropped.
// A `system` entry inside messages is a system message in place (besides top-level system).
// `thinking` of any type is accepted: "disabled" turns reasoning off, every other type on.
#include "actors/gateway/api_request.hpp"
#include "actors/gateway/request_common.hpp"

namespace tandem::gateway {
namespace {

void read_system(FieldReader& r, const json& root, GenerateSpec& spec) {
  if (r.failed() || !root.contains("system") || root["system"].is_null()) return;
  std::string text = read_text_content(r, root["system"], "system", {"text"});
  if (!r.failed() && !text.empty()) {
    spec.conversation.messages.push_back(ChatMessage{ChatRole::system, text});
  }
}

void read_tool_result(FieldReader& r, const json& block, const std::string& p, Conversation& c) {
  ChatMessage m;
  m.role = ChatRole::tool;
  r.required(block, "tool_use_id", p);
  m.tool_call_id = r.string(block, "tool_use_id", p).value_or("");
  if (!r.failed() && block.contains("content")) {
    m.content = read_text_content(r, block["content"], path_key(p, "content"), {"text"});
  }
  if (auto is_error = r.boolean(block, "is_error", p); is_error && *is_error) {
    m.content = "Error: " + m.content;
  }
  c.messages.push_back(std::move(m));
}

void read_tool_use(FieldReader& r, const json& block, const std::string& p, ChatMessage& m) {
  ToolCall call;
  r.required(block, "id", p);
  call.id = r.string(block, "id", p).value_or("");
  r.required(block, "name", p);
  call.name = r.string(block, "name", p).value_or("");
  r.required(block, "input", p);
  if (const json* input = r.object(block, "input", p)) call.arguments_json = input->dump();
  m.tool_calls.push_back(std::move(call));
}

// One content block of a message with role `role` ("user" or "assistant").
void read_block(FieldReader& r, const json& block, const std::string& p, bool assistant,
                ChatMessage& m, Conversation& c) {
  if (!block.is_object()) return r.fail_invalid(p, p + " must be an object");
  r.required(block, "type", p);
  std::string type = r.string(block, "type", p).value_or("");
  if (r.failed()) return;
  std::string tp = path_key(p, "type");
  if (type == "text") {
    r.required(block, "text", p);
    m.content += r.string(block, "text", p).value_or("");
  } else if (type == "tool_result" && !assistant) {
    read_tool_result(r, block, p, c);
  } else if (type == "tool_use" && assistant) {
    read_tool_use(r, block, p, m);
  } else if (type == "thinking" && assistant) {
    m.reasoning += r.string(block, "thinking", p).value_or("");
  } else if (type == "redacted_thinking" && assistant) {
    // encrypted by another provider: nothing to render
  } else if (type == "tool_use" || type == "tool_result" || type == "thinking" ||
             type == "redacted_thinking") {
    r.fail_invalid(tp, tp + ": a '" + type + "' block is not allowed in a " +
                           (assistant ? "assistant" : "user") + " message");
  } else {
    r.fail(unsupported(tp, tp + ": content block type '" + type + "' is not supported"));
  }
}

void read_message(FieldReader& r, const json& msg, const std::string& p, Conversation& c) {
  if (!msg.is_object()) return r.fail_invalid(p, p + " must be an object");
  r.required(msg, "role", p);
  std::string role = r.string(msg, "role", p).value_or("");
  r.required(msg, "content", p);
  if (r.failed()) return;
  if (role == "system") {
    // A system entry inside messages (clients send them after the first user turn): its
    // text (a string or text blocks) is a system message in place; see chat.hpp.
    std::string text = read_text_content(r, msg["content"], path_key(p, "content"), {"text"});
    if (!r.failed()) c.messages.push_back(ChatMessage{ChatRole::system, std::move(text)});
    return;
  }
  if (role != "user" && role != "assistant") {
    return r.fail_invalid(path_key(p, "role"), path_key(p, "role") +
                                                   " must be 'user', 'assistant' or 'system', "
                                                   "got '" + role + "'");
  }
  bool assistant = role == "assistant";
  ChatMessage m;
  m.role = assistant ? ChatRole::assistant : ChatRole::user;
  const json& content = msg["content"];
  std::string cp = path_key(p, "content");
  if (content.is_string()) {
    m.content = content.get<std::string>();
  } else if (content.is_array()) {
    for (size_t i = 0; i < content.size() && !r.failed(); ++i) {
      read_block(r, content[i], path_index(cp, i), assistant, m, c);
    }
  } else {
    return r.fail_invalid(
        cp, cp + " must be a string or an array of content blocks, got " + json_type_name(content));
  }
  // A user message made only of tool results adds no user turn.
  bool only_tool_results =
      !assistant && m.content.empty() && content.is_array() && !content.empty();
  if (!only_tool_results) c.messages.push_back(std::move(m));
}

// A server tool's type: a name and an 8-digit version date, "web_search_20250305".
bool server_tool_type(const std::string& type) {
  constexpr size_t date_digits = 8;
  if (type.size() < date_digits + 2 || type[type.size() - date_digits - 1] != '_') return false;
  for (size_t i = type.size() - date_digits; i < type.size(); ++i) {
    if (type[i] < '0' || type[i] > '9') return false;
  }
  for (size_t i = 0; i + date_digits + 1 < type.size(); ++i) {
    const char c = type[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

void read_anthropic_tools(FieldReader& r, const json& root, GenerateSpec& spec) {
  const json* tools = r.array(root, "tools", "");
  for (size_t i = 0; tools != nullptr && i < tools->size() && !r.failed(); ++i) {
    std::string p = path_index("tools", i);
    const json& tool = (*tools)[i];
    if (!tool.is_object()) return r.fail_invalid(p, p + " must be an object");
    r.required(tool, "name", p);
    (void)r.string(tool, "name", p);
    std::string type = r.string(tool, "type", p).value_or("custom");
    if (r.failed()) return;
    if (type != "custom") {
      // Server tools (web_search_20250305, bash_20250124, ...) are ignored; anything else
      // (an OpenAI-shaped {"type":"function"} tool) is a mistake, not a tool to drop.
      if (!server_tool_type(type)) {
        return r.fail_invalid(path_key(p, "type"),
                              path_key(p, "type") + " must be 'custom' or a server tool type "
                                                    "such as 'web_search_20250305', got '" +
                                  type + "'");
      }
      continue;
    }
    r.required(tool, "input_schema", p);
    const json* schema = r.object(tool, "input_schema", p);
    if (r.failed()) return;
    auto it = tool.find("description");
    std::string t =
        neutral_tool_json(r, tool["name"], it == tool.end() ? nullptr : &*it, schema, p);
    if (!r.failed()) spec.conversation.tools_json.push_back(std::move(t));
  }
}

void read_anthropic_tool_choice(FieldReader& r, const json& root, GenerateSpec& spec) {
  const json* choice = r.object(root, "tool_choice", "");
  if (choice == nullptr) return;
  r.required(*choice, "type", "tool_choice");
  std::string type = r.string(*choice, "type", "tool_choice").value_or("");
  if (r.failed()) return;
  if (type == "auto") {
    spec.tool_choice.mode = ToolChoiceMode::automatic;
  } else if (type == "none") {
    spec.tool_choice.mode = ToolChoiceMode::none;
  } else if (type == "any") {
    spec.tool_choice.mode = ToolChoiceMode::required;
  } else if (type == "tool") {
    r.required(*choice, "name", "tool_choice");
    spec.tool_choice = {ToolChoiceMode::named,
                        r.string(*choice, "name", "tool_choice").value_or("")};
  } else {
    return r.fail_invalid("tool_choice.type",
                          "tool_choice.type must be one of auto, any, tool, "
                          "none; got '" +
                              type + "'");
  }
  bool needs_tools = spec.tool_choice.mode == ToolChoiceMode::required ||
                     spec.tool_choice.mode == ToolChoiceMode::named;
  if (needs_tools && spec.conversation.tools_json.empty()) {
    return r.fail_invalid("tool_choice", "tool_choice requires tools, but none were given");
  }
  check_named_tool(r, spec, "tool_choice.name");
}

void read_thinking(FieldReader& r, const json& root, GenerateSpec& spec) {
  const json* thinking = r.object(root, "thinking", "");
  if (thinking == nullptr) return;
  r.required(*thinking, "type", "thinking");
  std::string type = r.string(*thinking, "type", "thinking").value_or("");
  if (r.failed()) return;
  if (type == "disabled") {
    spec.reasoning.thinking_enabled = false;
    return;
  }
  // "enabled", "adaptive" and whatever types clients send next: reasoning on (the model's
  // template opens <think> either way; refusing an unknown type would fail the agent).
  spec.reasoning.thinking_enabled = true;
  if (type == "enabled") r.required(*thinking, "budget_tokens", "thinking");
  std::optional<int64_t> budget = r.integer(*thinking, "budget_tokens", "thinking");
  if (!budget) return;
  if (*budget < 1024) {
    return r.fail_invalid("thinking.budget_tokens",
                          "thinking.budget_tokens must be >= 1024, got " + std::to_string(*budget));
  }
  if (spec.max_tokens && *budget >= *spec.max_tokens) {
    return r.fail_invalid("thinking.budget_tokens", "thinking.budget_tokens (" +
                                                        std::to_string(*budget) +
                                                        ") must be less than max_tokens (" +
                                                        std::to_string(*spec.max_tokens) + ")");
  }
  spec.reasoning.thinking_budget_tokens = *budget;
}

void read_messages_list(FieldReader& r, const json& root, GenerateSpec& spec) {
  r.required(root, "messages", "");
  const json* messages = r.array(root, "messages", "");
  if (messages != nullptr && messages->empty()) {
    r.fail_invalid("messages", "messages must contain at least one message");
  }
  for (size_t i = 0; messages != nullptr && i < messages->size() && !r.failed(); ++i) {
    read_message(r, (*messages)[i], path_index("messages", i), spec.conversation);
  }
}

}  // namespace

ApiResult<GenerateSpec> parse_messages_request(std::string_view body, ApiKind kind) {
  RT_ASSERT(kind == ApiKind::messages || kind == ApiKind::count_tokens, static_cast<int>(kind));
  FieldReader r;
  GenerateSpec spec;
  spec.api = kind;
  std::optional<json> root_opt = parse_body(r, body);
  if (!root_opt) return r.error();
  const json& root = *root_opt;
  read_model(r, root, spec);
  if (kind == ApiKind::messages) r.required(root, "max_tokens", "");
  read_max_tokens(r, root, "max_tokens", spec);
  read_system(r, root, spec);
  read_messages_list(r, root, spec);
  read_anthropic_tools(r, root, spec);
  read_anthropic_tool_choice(r, root, spec);
  read_thinking(r, root, spec);
  read_sampling(r, root, 1.0, spec.sampling);
  if (root.contains("stop_sequences") && root["stop_sequences"].is_string()) {
    r.fail_invalid("stop_sequences", "stop_sequences must be an array of strings, got string");
  }
  read_stop(r, root, "stop_sequences", spec.sampling);
  if (kind == ApiKind::messages) {
    if (auto v = r.boolean(root, "stream", "")) spec.stream = *v;
  }
  check_ignored_fields(r, root,
                       {{"metadata", JsonKind::object},
                        {"service_tier", JsonKind::string},
                        {"mcp_servers", JsonKind::array}});
  if (const json* metadata = r.object(root, "metadata", "")) {
    (void)r.string(*metadata, "user_id", "metadata");
  }
  if (r.failed()) return r.error();
  spec.include_usage = true;  // Anthropic always reports usage
  fill_tool_names(spec.conversation);
  RT_ASSERT(kind == ApiKind::count_tokens || spec.max_tokens.has_value(), "validated above");
  RT_ASSERT(!spec.conversation.messages.empty(), "validated above");
  return spec;
}

}  // namespace tandem::gateway
