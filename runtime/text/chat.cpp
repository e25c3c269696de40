#include "runtime/text/chat.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "runtime/base/assert.hpp"
#include "runtime/text/tokenizer.hpp"

namespace tandem::text {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view minimax_default_system =
    "You are a helpful assistant. Your name is MiniMax-M2 and is built by MiniMax.";

void append_python_string(std::string& out, const std::string& text) {
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void append_python_json(std::string& out, const ordered_json& value) {
  if (value.is_object()) {
    out.push_back('{');
    bool first = true;
    for (const auto& [key, child] : value.items()) {
      if (!first) out += ", ";
      first = false;
      append_python_string(out, key);
      out += ": ";
      append_python_json(out, child);
    }
    out.push_back('}');
  } else if (value.is_array()) {
    out.push_back('[');
    for (std::size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out += ", ";
      append_python_json(out, value[i]);
    }
    out.push_back(']');
  } else if (value.is_string()) {
    append_python_string(out, value.get<std::string>());
  } else if (value.is_boolean()) {
    out += value.get<bool>() ? "true" : "false";
  } else {
    out += value.dump();  // numbers and null
  }
}

Result<ordered_json> parse_json(std::string_view text, const std::string& what) {
  ordered_json value = ordered_json::parse(text, nullptr, false);
  if (value.is_discarded()) {
    return make_error(ErrorKind::invalid, what + " is not valid JSON: " + std::string(text));
  }
  return value;
}

std::string strip_newlines(std::string_view text, bool left, bool right) {
  while (left && !text.empty() && text.front() == '\n') text.remove_prefix(1);
  while (right && !text.empty() && text.back() == '\n') text.remove_suffix(1);
  return std::string(text);
}

// The templates' fallback when no reasoning is given: "<think>r</think>c" inside content.
// Qwen3 strips newlines on one side where MiniMax strips both (as their templates do).
void split_think(std::string& content, std::string& reasoning, bool minimax) {
  const std::size_t first_close = content.find("</think>");
  if (!reasoning.empty() || first_close == std::string::npos) return;
  const std::size_t last_close = content.rfind("</think>");
  const std::string before = strip_newlines(content.substr(0, first_close), minimax, true);
  const std::size_t open = before.rfind("<think>");
  const std::string inner = open == std::string::npos ? before : before.substr(open + 7);
  reasoning = strip_newlines(inner, true, minimax);
  content = strip_newlines(std::string_view(content).substr(last_close + 8), true, minimax);
}

// The function object of a tool: {"type":"function","function":{...}} or the bare object.
Result<ordered_json> tool_function(const std::string& tool_json, std::size_t index) {
  Result<ordered_json> tool = parse_json(tool_json, "tool " + std::to_string(index));
  if (!tool) return tool;
  if (!tool->is_object()) {
    return make_error(ErrorKind::invalid, "tool " + std::to_string(index) + " is not an object");
  }
  if (tool->contains("function")) return (*tool)["function"];
  return tool;
}

Result<std::string> minimax_system(const Conversation& conversation) {
  std::string out = "]~!b[]~b]system\n";
  const auto& messages = conversation.messages;
  const bool has_system = !messages.empty() && messages[0].role == ChatRole::system;
  out += has_system ? messages[0].content : std::string(minimax_default_system);
  if (!conversation.tools_json.empty()) {
    out +=
        "\n\n# Tools\nYou may call one or more tools to assist with the user query.\n"
        "Here are the tools available in JSONSchema format:\n\n<tools>\n";
    for (std::size_t i = 0; i < conversation.tools_json.size(); ++i) {
      Result<ordered_json> function = tool_function(conversation.tools_json[i], i);
      if (!function) return function.error();
      out += "<tool>";
      append_python_json(out, *function);
      out += "</tool>\n";
    }
    out +=
        "</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass "
        "parameters:\n\n<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n"
        "<parameter name=\"param-key-1\">param-value-1</parameter>\n"
        "<parameter name=\"param-key-2\">param-value-2</parameter>\n...\n</invoke>\n"
        "</minimax:tool_call>";
  }
  out += "[e~[\n";
  return out;
}

Status minimax_tool_calls(const ChatMessage& message, std::size_t index, std::string& out) {
  out += "\n<minimax:tool_call>\n";
  for (const ToolCall& call : message.tool_calls) {
    Result<ordered_json> arguments =
        parse_json(call.arguments_json.empty() ? "{}" : call.arguments_json,
                   "message " + std::to_string(index) + " tool call '" + call.name + "' arguments");
    if (!arguments) return arguments.error();
    if (!arguments->is_object()) {
      return make_error(ErrorKind::invalid, "message " + std::to_string(index) + " tool call '" +
                                                call.name + "': arguments are not a JSON object");
    }
    out += "<invoke name=\"" + call.name + "\">\n";
    for (const auto& [key, value] : arguments->items()) {
      out += "<parameter name=\"" + key + "\">";
      if (value.is_string()) {
        out += value.get<std::string>();
      } else {
        append_python_json(out, value);
      }
      out += "</parameter>\n";
    }
    out += "</invoke>\n";
  }
  out += "</minimax:tool_call>";
  return {};
}

Result<std::string> render_minimax(const Conversation& conversation) {
  Result<std::string> rendered = minimax_system(conversation);
  if (!rendered) return rendered;
  std::string out = std::move(rendered).value();
  const auto& messages = conversation.messages;
  const std::size_t first = !messages.empty() && messages[0].role == ChatRole::system ? 1 : 0;
  std::size_t last_user_index = SIZE_MAX;
  for (std::size_t i = first; i < messages.size(); ++i) {
    if (messages[i].role == ChatRole::user) last_user_index = i;
  }
  bool last_assistant_called_tools = false;
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    const bool prev_tool = i > first && messages[i - 1].role == ChatRole::tool;
    const bool next_tool = i + 1 < messages.size() && messages[i + 1].role == ChatRole::tool;
    switch (message.role) {
      case ChatRole::system:
        // A later system (or developer) message: a system turn in place (the format has one).
        out += "]~b]system\n" + message.content + "[e~[\n";
        break;
      case ChatRole::user:
        out += "]~b]user\n" + message.content + "[e~[\n";
        break;
      case ChatRole::assistant: {
        std::string content = message.content;
        std::string reasoning = message.reasoning;
        split_think(content, reasoning, true);
        out += "]~b]ai\n";
        const bool after_last_user = last_user_index == SIZE_MAX || i > last_user_index;
        if (!reasoning.empty() && after_last_user) {
          out += "<think>\n" + reasoning + "\n</think>\n\n";
        }
        out += content;
        last_assistant_called_tools = !message.tool_calls.empty();
        if (last_assistant_called_tools) {
          if (Status status = minimax_tool_calls(message, i, out); !status) return status.error();
        }
        out += "[e~[\n";
        break;
      }
      case ChatRole::tool:
        if (!last_assistant_called_tools) {
          return make_error(ErrorKind::invalid, "message " + std::to_string(i) +
                                                    ": tool message without a preceding "
                                                    "assistant tool call");
        }
        if (!prev_tool) out += "]~b]tool";
        out += "\n<response>" + message.content + "</response>";
        if (!next_tool) out += "[e~[\n";
        break;
    }
  }
  if (conversation.add_generation_prompt) out += "]~b]ai\n<think>\n";
  RT_ASSERT(out.starts_with("]~!b["), "minimax prompt starts with its BOS marker");
  return out;
}

// Qwen3: the index of the last real user query (not a wrapped tool response).
std::size_t chatml_last_query_index(const std::vector<ChatMessage>& messages) {
  for (std::size_t back = messages.size(); back > 0; --back) {
    const ChatMessage& message = messages[back - 1];
    const bool wrapped = message.content.starts_with("<tool_response>") &&
                         message.content.ends_with("</tool_response>");
    if (message.role == ChatRole::user && !wrapped) return back - 1;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

Result<std::string> chatml_system(const Conversation& conversation) {
  const auto& messages = conversation.messages;
  const bool has_system = !messages.empty() && messages[0].role == ChatRole::system;
  if (conversation.tools_json.empty()) {
    return has_system ? "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n" : "";
  }
  std::string out = "<|im_start|>system\n";
  if (has_system) out += messages[0].content + "\n\n";
  out +=
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (std::size_t i = 0; i < conversation.tools_json.size(); ++i) {
    Result<ordered_json> tool = parse_json(conversation.tools_json[i], "tool " + std::to_string(i));
    if (!tool) return tool.error();
    out += "\n";
    append_python_json(out, *tool);
  }
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  return out;
}

void chatml_assistant(const ChatMessage& message, bool after_query, bool last, std::string& out) {
  std::string content = message.content;
  std::string reasoning = message.reasoning;
  split_think(content, reasoning, false);
  out += "<|im_start|>assistant\n";
  if (after_query && (last || !reasoning.empty())) {
    out += "<think>\n" + strip_newlines(reasoning, true, true) + "\n</think>\n\n" +
           strip_newlines(content, true, false);
  } else {
    out += content;
  }
  for (std::size_t c = 0; c < message.tool_calls.size(); ++c) {
    const ToolCall& call = message.tool_calls[c];
    if (c > 0 || !content.empty()) out += "\n";
    out += "<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " +
           (call.arguments_json.empty() ? std::string("{}") : call.arguments_json) +
           "}\n</tool_call>";
  }
  out += "<|im_end|>\n";
}

Result<std::string> render_chatml(const Conversation& conversation) {
  Result<std::string> rendered = chatml_system(conversation);
  if (!rendered) return rendered;
  std::string out = std::move(rendered).value();
  const auto& messages = conversation.messages;
  const std::size_t last_query_index = chatml_last_query_index(messages);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    const bool last = i + 1 == messages.size();
    switch (message.role) {
      case ChatRole::system:
        if (i > 0) out += "<|im_start|>system\n" + message.content + "<|im_end|>\n";
        break;
      case ChatRole::user:
        out += "<|im_start|>user\n" + message.content + "<|im_end|>\n";
        break;
      case ChatRole::assistant:
        chatml_assistant(message, i > last_query_index, last, out);
        break;
      case ChatRole::tool:
        if (i == 0 || messages[i - 1].role != ChatRole::tool) out += "<|im_start|>user";
        out += "\n<tool_response>\n" + message.content + "\n</tool_response>";
        if (last || messages[i + 1].role != ChatRole::tool) out += "<|im_end|>\n";
        break;
    }
  }
  if (conversation.add_generation_prompt) out += "<|im_start|>assistant\n";
  RT_ASSERT(!conversation.add_generation_prompt || out.ends_with("assistant\n"), "gen prompt");
  return out;
}

Result<std::string> render_plain(const Conversation& conversation) {
  if (!conversation.tools_json.empty()) {
    return make_error(ErrorKind::unimplemented, "tools were given, but the model's chat format is plain, which has no tool support; select chatml or minimax-m2 with [model] chat_format in the manifest");
  }
  std::string out;
  for (std::size_t i = 0; i < conversation.messages.size(); ++i) {
    if (i > 0) out += "\n";
    out += conversation.messages[i].content;
  }
  return out;
}

}  // namespace

std::string_view to_string(ChatFormat format) {
  switch (format) {
    case ChatFormat::plain:
      return "plain";
    case ChatFormat::chatml:
      return "chatml";
    case ChatFormat::minimax_m2:
      return "minimax-m2";
  }
  return "unknown";
}

std::string_view to_string(ChatRole role) {
  switch (role) {
    case ChatRole::system:
      return "system";
    case ChatRole::user:
      return "user";
    case ChatRole::assistant:
      return "assistant";
    case ChatRole::tool:
      return "tool";
  }
  return "unknown";
}

Result<ChatFormat> parse_chat_format(std::string_view name) {
  for (const ChatFormat format : {ChatFormat::plain, ChatFormat::chatml, ChatFormat::minimax_m2}) {
    if (name == to_string(format)) return format;
  }
  return make_error(ErrorKind::invalid, "unknown chat format '" + std::string(name) +
                                            "' (expected plain, chatml or minimax-m2)");
}

Result<ChatRole> parse_chat_role(std::string_view name) {
  for (const ChatRole role :
       {ChatRole::system, ChatRole::user, ChatRole::assistant, ChatRole::tool}) {
    if (name == to_string(role)) return role;
  }
  return make_error(ErrorKind::invalid, "unknown message role '" + std::string(name) +
                                            "' (expected system, user, assistant or tool)");
}

Result<std::string> render_chat(ChatFormat format, const Conversation& conversation) {
  switch (format) {
    case ChatFormat::plain:
      return render_plain(conversation);
    case ChatFormat::chatml:
      return render_chatml(conversation);
    case ChatFormat::minimax_m2:
      return render_minimax(conversation);
  }
  RT_ASSERT(false, "unknown chat format", static_cast<int>(format));
  return make_error(ErrorKind::invalid, "unknown chat format");
}

Result<std::string> tool_call_prefix(ChatFormat format, std::string_view name) {
  switch (format) {
    case ChatFormat::minimax_m2: {
      std::string out = "</think>\n\n<minimax:tool_call>\n";
      if (!name.empty()) out += "<invoke name=\"" + std::string(name) + "\">\n";
      return out;
    }
    case ChatFormat::chatml: {
      std::string out = "<tool_call>\n";
      if (!name.empty()) {
        out += "{\"name\": ";
        append_python_string(out, std::string(name));
        out += ", \"arguments\": ";
      }
      return out;
    }
    case ChatFormat::plain:
      break;
  }
  return make_error(ErrorKind::unimplemented, "the plain chat format has no tool calls");
}

ChatFormat detect_chat_format(std::string_view chat_template) {
  if (chat_template.find("]~b]") != std::string_view::npos) return ChatFormat::minimax_m2;
  if (chat_template.find("<|im_start|>") != std::string_view::npos) return ChatFormat::chatml;
  return ChatFormat::plain;
}

Result<ChatFormat> detect_chat_format_from_config(const std::filesystem::path& config_path) {
  Result<std::string> bytes = read_file_bytes(config_path);
  if (!bytes) {
    if (bytes.error().kind == ErrorKind::not_found) return ChatFormat::plain;
    return bytes.error();
  }
  const ordered_json config = ordered_json::parse(*bytes, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return make_error(ErrorKind::invalid, config_path.string() + ": not a valid JSON object");
  }
  if (!config.contains("chat_template")) return ChatFormat::plain;
  const ordered_json& chat_template = config["chat_template"];
  if (chat_template.is_string()) return detect_chat_format(chat_template.get<std::string>());
  if (chat_template.is_array()) {
    for (const ordered_json& entry : chat_template) {
      if (entry.is_object() && entry.value("name", std::string()) == "default" &&
          entry.contains("template") && entry["template"].is_string()) {
        return detect_chat_format(entry["template"].get<std::string>());
      }
    }
  }
  return make_error(ErrorKind::invalid, config_path.string() +
                                            ": chat_template is neither a string nor a list "
                                            "with a 'default' entry");
}

Result<std::string> python_style_json(std::string_view json_text) {
  Result<ordered_json> value = parse_json(json_text, "value");
  if (!value) return value.error();
  std::string out;
  append_python_json(out, *value);
  return out;
}

}  // namespace tandem::text
