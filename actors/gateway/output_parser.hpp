// tandem/gateway: streaming parser of model output text into reasoning, text and tool calls.
//
// Fed detokenized text in chunks split anywhere (even inside a marker or a UTF-8 character),
// it returns GenEvents (TextDelta, ReasoningDelta, ToolCallStart, ToolCallArgsDelta) such that
// the concatenation of all events is the same for every split of the same text. A possible
// marker prefix is held back, never emitted as text; finish() flushes what is held.
//
// Formats:
//  - reasoning: `<think>...</think>`. With starts_in_reasoning the output is reasoning until
//    `</think>` (the MiniMax-M2 / Qwen3 templates open <think> in the prompt); otherwise a
//    `<think>` counts only before any non-whitespace text. Newlines right after `</think>`
//    are dropped. Without `reasoning`, think tags are plain text.
//  - minimax_m2: `<minimax:tool_call><invoke name="f"><parameter name="k">v</parameter>
//    </invoke>...</minimax:tool_call>`. Each invoke becomes ToolCallStart then arguments
//    deltas, one per complete parameter, whose concatenation is a compact JSON object.
//    Values are typed by the tool's JSON schema (properties.k.type) when given: integer /
//    number / boolean / null / object / array are parsed (falling back to a string when the
//    text does not parse as that type); no schema -> string. Leading/trailing newlines of a
//    value are trimmed. Unrecognised text between tags inside the block is dropped.
//  - qwen: `<tool_call>{"name": "f", "arguments": {...}}</tool_call>`; when the body is not
//    such JSON, the whole block is emitted as text.
// An unterminated tool block at finish(): open invokes are closed with the complete
// parameters seen so far; a block with no complete invoke/JSON is emitted as text.
// Pure; cost linear in the output length (held-back text is rescanned per chunk).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "actors/gateway/api_response.hpp"

namespace tandem::gateway {

enum class ToolCallFormat { none, minimax_m2, qwen };

struct OutputParserConfig {
  bool reasoning = false;            // parse <think>...</think>
  bool starts_in_reasoning = false;  // the prompt already opened <think> (needs reasoning)
  ToolCallFormat tool_format = ToolCallFormat::none;
  // The request's tools (neutral shape, api_types.hpp), for typing MiniMax parameters.
  std::vector<std::string> tools_json;
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserConfig config);
  // Parses one chunk; returns the events it completes (adjacent same-kind deltas merged).
  std::vector<GenEvent> feed(std::string_view chunk);
  // End of output: flushes held-back text and closes an open tool call. Call once.
  std::vector<GenEvent> finish();
  int64_t tool_calls_count() const { return tool_index_; }
  // Inside <think>...</think> as far as the input fed so far shows (a possible marker prefix
  // held back does not count yet).
  bool in_reasoning() const { return state_ == State::reasoning; }

 private:
  enum class State { text, reasoning, minimax_block, minimax_invoke, qwen_call };
  void run(bool at_end);
  bool step_text(bool at_end);
  bool step_reasoning(bool at_end);
  bool step_minimax();
  bool step_qwen();
  void emit_text(std::string_view text);
  void emit(GenEvent event);
  // Erases `bytes` from buffer_, remembering them while the block has no invoke yet.
  void consume(size_t bytes);
  void finish_minimax_param(const std::string& name, const std::string& value);
  void close_invoke();

  OutputParserConfig config_;
  // tool name -> its parameters' "properties" object (JSON text), from config_.tools_json.
  std::map<std::string, std::string> properties_by_tool_;
  State state_ = State::text;
  std::string buffer_;           // input not consumed yet
  std::vector<GenEvent> out_;    // events of the current feed()
  bool think_allowed_ = true;    // no non-whitespace text emitted yet
  bool strip_newlines_ = false;  // just after </think>
  bool finished_ = false;
  int64_t tool_index_ = 0;   // tool calls started so far
  std::string invoke_name_;  // minimax: the open invoke's function
  int64_t invoke_params_count_ = 0;
  int64_t block_invokes_count_ = 0;  // minimax: invokes started in this block
  std::string block_raw_;            // minimax: block text consumed before its first invoke
};

}  // namespace tandem::gateway
