// tandem/text: rendering a conversation into the model's prompt text.
//
// Formats:
//   minimax-m2  `]~!b[]~b]system\n...[e~[\n]~b]user\n...[e~[\n]~b]ai\n...` following the
//               public MiniMax-M2 chat template (tools as <tools><tool>{json}</tool></tools>
//               in the system turn, tool calls as <minimax:tool_call><invoke ...>, tool
//               results as <response>...</response> in a ]~b]tool turn, reasoning as
//               <think>...</think> on assistant turns after the last user message).
//   chatml      Qwen3's template: <|im_start|>role\n...<|im_end|>\n, tools in the system
//               turn, <tool_call>{json}</tool_call>, results in <tool_response> user turns.
//   plain       the messages' text joined with "\n" (tiny story models); no tools.
// System messages after the first (several developer items, an Anthropic system entry inside
// messages, ...) are never an error; each format renders them once, the same way:
//   minimax-m2  a system turn in place: `]~b]system\n<content>[e~[\n` (the public template
//               drops them silently; dropping would change the answer);
//   chatml      a system turn in place: `<|im_start|>system\n<content><|im_end|>\n` (as Qwen3's
//               template does);
//   plain       its text in order with the others (plain has no turns).
// The first message, when it is a system message, is the system prompt (tools follow it).
// Pure functions; rendering errors are values (a tool message with no preceding tool call,
// arguments that are not a JSON object, tools in plain format, ...).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::text {

enum class ChatFormat { plain, chatml, minimax_m2 };
enum class ChatRole { system, user, assistant, tool };

std::string_view to_string(ChatFormat format);  // "plain", "chatml", "minimax-m2"
std::string_view to_string(ChatRole role);      // "system", "user", "assistant", "tool"
// Errors: invalid naming the unknown value and the accepted ones.
Result<ChatFormat> parse_chat_format(std::string_view name);
Result<ChatRole> parse_chat_role(std::string_view name);

struct ToolCall {
  std::string id;              // OpenAI tool_call id (not rendered by these templates)
  std::string name;            // function name
  std::string arguments_json;  // the arguments as JSON text (an object)
  friend bool operator==(const ToolCall&, const ToolCall&) = default;
};

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
  std::string reasoning;             // assistant only: reasoning text, kept as <think>
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only: which call this answers
  std::string name;                  // tool only: the function name
  friend bool operator==(const ChatMessage&, const ChatMessage&) = default;
};

struct Conversation {
  std::vector<ChatMessage> messages;
  std::vector<std::string> tools_json;  // each a JSON object: {"type":"function","function":{...}}
  bool add_generation_prompt = true;
};

// Renders the prompt text (the generation prompt last when requested).
Result<std::string> render_chat(ChatFormat format, const Conversation& conversation);

// The text that opens a tool call in `format`, appended after the generation prompt to make
// the model call a tool (tool_choice "required": `name` empty, any tool; a named tool_choice:
// that function). It closes the reasoning the minimax-m2 generation prompt opened, so a
// forced call has no reasoning. The output parser is fed the same text first (it is the start
// of the model's answer). Errors: unimplemented for plain (no tool calls).
//   minimax-m2  `</think>\n\n<minimax:tool_call>\n` [+ `<invoke name="NAME">\n`]
//   chatml      `<tool_call>\n` [+ `{"name": "NAME", "arguments": `]
Result<std::string> tool_call_prefix(ChatFormat format, std::string_view name);

// From a chat_template string: contains "]~b]" -> minimax-m2, "<|im_start|>" -> chatml,
// anything else -> plain.
ChatFormat detect_chat_format(std::string_view chat_template);

// Reads `chat_template` from a tokenizer_config.json (a string, or a list of named
// templates whose "default" entry is used). A missing file or key -> plain.
// Errors: invalid when the file exists but is not valid JSON.
Result<ChatFormat> detect_chat_format_from_config(const std::filesystem::path& config_path);

// Serializes JSON text the way Python's json.dumps(ensure_ascii=False) does (", " and ": "
// separators, key order kept) -- what the Jinja `tojson` filter emits in HF templates.
// Errors: invalid when `json_text` does not parse.
Result<std::string> python_style_json(std::string_view json_text);

}  // namespace tandem::text
