// Issue 11: tool calls end to end through the real gateway, for each API, streamed and not.
// A decode stand-in (tests/support/gateway_harness.hpp) emits the tokens of a recorded model
// output with reasoning and two tool calls (one without arguments; nested JSON and non-ASCII
// in the other); the client gets each API's tool-call shape; it sends the calls and results
// back in that API's shape; the next prompt the gateway gives decode is checked token for
// token against the model's format. The same for the Qwen/ChatML format. Then tool_choice
// (named, "none") and a tool call cut by max_tokens.
#include <doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/text/chat.hpp"
#include "tests/support/gateway_harness.hpp"
#include "tests/support/sse.hpp"
#include "tools/model_synth.hpp"

using namespace tandem;
using json = nlohmann::ordered_json;  // key order as clients send it
using testing::DecodeScript;
using testing::GatewayHarness;

namespace {

enum class Api { chat, responses, messages };
std::string api_name(Api api) {
  return api == Api::chat ? "chat" : api == Api::responses ? "responses" : "messages";
}
std::string api_path(Api api) {
  return api == Api::chat ? "/v1/chat/completions"
         : api == Api::responses ? "/v1/responses"
                                 : "/v1/messages";
}

// A synthesized model directory per architecture (tokenizer with the format's markers).
std::string synth_dir(devices::Arch arch) {
  const bool minimax = arch == devices::Arch::minimax_m2;
  auto dir = std::filesystem::temp_directory_path() /
             ("tandem_agent_tools_" + std::to_string(getpid()) + (minimax ? "_mm" : "_llama"));
  if (!std::filesystem::exists(dir / "tokenizer.json")) {
    tools::SynthOptions o;
    o.arch = arch;
    o.vocab = 1024;
    REQUIRE(tools::synth_model(o, dir.string()).ok());
  }
  return dir.string();
}

const char* const tools_openai = R"([
  {"type": "function", "function": {"name": "list_files", "description": "List a directory",
   "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                   "opts": {"type": "object"}}}}},
  {"type": "function", "function": {"name": "get_time", "description": "Now",
   "parameters": {"type": "object", "properties": {}}}}])";

json tools_for(Api api) {
  json tools = json::parse(tools_openai);
  if (api == Api::chat) return tools;
  json out = json::array();
  for (const json& t : tools) {
    const json& f = t["function"];
    if (api == Api::responses) {
      out.push_back({{"type", "function"}, {"name", f["name"]}, {"description", f["description"]},
                     {"parameters", f["parameters"]}});
    } else {
      out.push_back({{"name", f["name"]}, {"description", f["description"]},
                     {"input_schema", f["parameters"]}});
    }
  }
  return out;
}

const std::string list_args = R"({"path":"src/été","opts":{"depth":2,"filter":{"ext":[".c",".h"]}}})";

// The recorded outputs: reasoning, a line of text, two parallel calls.
const std::string minimax_output =
    "I need the files and the time.\n</think>\n\nLet me look.\n<minimax:tool_call>\n"
    "<invoke name=\"list_files\">\n<parameter name=\"path\">src/été</parameter>\n"
    "<parameter name=\"opts\">{\"depth\": 2, \"filter\": {\"ext\": [\".c\", \".h\"]}}"
    "</parameter>\n</invoke>\n<invoke name=\"get_time\">\n</invoke>\n</minimax:tool_call>";
const std::string qwen_output =
    "<think>\nI need the files and the time.\n</think>\n\nLet me look.\n<tool_call>\n"
    "{\"name\": \"list_files\", \"arguments\": {\"path\": \"src/été\", \"opts\": {\"depth\": 2, "
    "\"filter\": {\"ext\": [\".c\", \".h\"]}}}}\n</tool_call>\n<tool_call>\n"
    "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

struct Call {
  std::string id, name, arguments;  // arguments: JSON text as the client got it
};
struct Answer {
  std::string reasoning, content, finish;
  std::vector<Call> calls;
  int64_t completion_tokens = -1, reasoning_tokens = -1;
};

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  while (!s.empty() && (s.front() == '\n' || s.front() == ' ')) s.erase(0, 1);
  return s;
}

json first_request(Api api, bool stream, const json& extra = json::object()) {
  json body = {{"model", "stories15M"}, {"stream", stream}, {"tools", tools_for(api)}};
  if (api == Api::chat) {
    body["messages"] = {{{"role", "system"}, {"content", "You code."}},
                        {{"role", "user"}, {"content", "List src and tell the time."}}};
    if (stream) body["stream_options"] = {{"include_usage", true}};
  } else if (api == Api::responses) {
    body["instructions"] = "You code.";
    body["input"] = {{{"type", "message"}, {"role", "user"},
                      {"content", {{{"type", "input_text"}, {"text", "List src and tell the time."}}}}}};
  } else {
    body["max_tokens"] = 100;
    body["system"] = "You code.";
    body["messages"] = {{{"role", "user"}, {"content", "List src and tell the time."}}};
  }
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

Answer chat_answer(const json& body) {
  Answer a;
  const json& choice = body["choices"][0];
  const json& m = choice["message"];
  a.reasoning = m.value("reasoning_content", "");
  a.content = m["content"].is_string() ? m["content"].get<std::string>() : "";
  for (const json& c : m.value("tool_calls", json::array())) {
    a.calls.push_back({c["id"], c["function"]["name"], c["function"]["arguments"]});
  }
  a.finish = choice["finish_reason"];
  a.completion_tokens = body["usage"]["completion_tokens"];
  a.reasoning_tokens = body["usage"]["completion_tokens_details"]["reasoning_tokens"];
  return a;
}

Answer chat_stream_answer(const std::vector<testing::SseEvent>& events) {
  Answer a;
  REQUIRE(events.back().data == "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i].data);
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      a.completion_tokens = chunk["usage"]["completion_tokens"];
      a.reasoning_tokens = chunk["usage"]["completion_tokens_details"]["reasoning_tokens"];
    }
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    const json& d = choice["delta"];
    if (d.contains("reasoning_content")) a.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content") && d["content"].is_string()) a.content += d["content"];
    for (const json& tc : d.value("tool_calls", json::array())) {
      size_t index = tc["index"];
      if (index == a.calls.size()) {
        REQUIRE(tc.contains("id"));  // the first delta of a call names it
        a.calls.push_back({tc["id"], tc["function"]["name"], ""});
      }
      REQUIRE(index + 1 == a.calls.size());
      a.calls[index].arguments += tc["function"].value("arguments", "");
    }
    if (choice["finish_reason"].is_string()) a.finish = choice["finish_reason"];
  }
  return a;
}

Answer responses_answer(const json& response) {
  Answer a;
  CHECK(response["status"] == "completed");
  for (const json& item : response["output"]) {
    if (item["type"] == "reasoning") {
      for (const json& part : item.value("content", json::array())) a.reasoning += part["text"];
    } else if (item["type"] == "message") {
      for (const json& part : item["content"]) a.content += part["text"];
    } else if (item["type"] == "function_call") {
      a.calls.push_back({item["call_id"], item["name"], item["arguments"]});
    }
  }
  a.finish = a.calls.empty() ? "stop" : "tool_calls";
  a.completion_tokens = response["usage"]["output_tokens"];
  a.reasoning_tokens = response["usage"]["output_tokens_details"]["reasoning_tokens"];
  return a;
}

Answer responses_stream_answer(const std::vector<testing::SseEvent>& events) {
  std::string args;
  int64_t sequence = -1;
  json completed;
  for (const auto& e : events) {
    json data = json::parse(e.data);
    CHECK(data["type"] == e.name);
    CHECK(data["sequence_number"].get<int64_t>() == sequence + 1);
    sequence = data["sequence_number"];
    if (e.name == "response.function_call_arguments.delta") args += data["delta"];
    if (e.name == "response.completed") completed = data["response"];
  }
  REQUIRE(completed.is_object());
  Answer a = responses_answer(completed);
  std::string all;
  for (const Call& c : a.calls) all += c.arguments;
  CHECK(args == all);  // the deltas add up to the final arguments
  return a;
}

Answer messages_answer(const json& body) {
  Answer a;
  for (const json& block : body["content"]) {
    if (block["type"] == "thinking") a.reasoning += block["thinking"];
    if (block["type"] == "text") a.content += block["text"];
    if (block["type"] == "tool_use") a.calls.push_back({block["id"], block["name"], block["input"].dump()});
  }
  a.finish = body["stop_reason"];
  a.completion_tokens = body["usage"]["output_tokens"];
  return a;
}

Answer messages_stream_answer(const std::vector<testing::SseEvent>& events) {
  json message;
  std::vector<json> blocks;
  std::vector<std::string> partial;
  for (const auto& e : events) {
    json data = json::parse(e.data);
    CHECK(data["type"] == e.name);
    if (e.name == "message_start") message = data["message"];
    if (e.name == "content_block_start") {
      REQUIRE(data["index"] == blocks.size());
      blocks.push_back(data["content_block"]);
      partial.emplace_back();
    }
    if (e.name == "content_block_delta") {
      size_t i = data["index"];
      REQUIRE(i < blocks.size());
      const json& d = data["delta"];
      if (d["type"] == "text_delta") blocks[i]["text"] = blocks[i].value("text", "") + d["text"].get<std::string>();
      if (d["type"] == "thinking_delta") {
        blocks[i]["thinking"] = blocks[i].value("thinking", "") + d["thinking"].get<std::string>();
      }
      if (d["type"] == "input_json_delta") partial[i] += d["partial_json"];
    }
    if (e.name == "message_delta") {
      message["stop_reason"] = data["delta"]["stop_reason"];
      message["usage"] = data["usage"];
    }
  }
  REQUIRE(events.back().name == "message_stop");
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i]["type"] == "tool_use") blocks[i]["input"] = json::parse(partial[i].empty() ? "{}" : partial[i]);
  }
  message["content"] = blocks;
  return messages_answer(message);
}

Answer answer_of(Api api, bool stream, const testing::http::Response& r) {
  REQUIRE_MESSAGE(r.ok(), r.error);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  if (stream) {
    auto events = testing::split_sse(r.body);
    REQUIRE_FALSE(events.empty());
    if (api == Api::chat) return chat_stream_answer(events);
    if (api == Api::responses) return responses_stream_answer(events);
    return messages_stream_answer(events);
  }
  json body = json::parse(r.body);
  if (api == Api::chat) return chat_answer(body);
  if (api == Api::responses) return responses_answer(body);
  return messages_answer(body);
}

// The client's next request: the first turn, the assistant's answer as that API sends it back,
// and the two tool results.
json second_request(Api api, const Answer& a) {
  json body = first_request(api, false);
  const std::vector<std::string> results = {"a.c\nb.h", "12:00"};
  if (api == Api::chat) {
    json calls = json::array();
    for (const Call& c : a.calls) {
      calls.push_back({{"id", c.id}, {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    body["messages"].push_back({{"role", "assistant"}, {"content", a.content},
                                {"reasoning_content", a.reasoning}, {"tool_calls", calls}});
    for (size_t i = 0; i < a.calls.size(); ++i) {
      body["messages"].push_back({{"role", "tool"}, {"tool_call_id", a.calls[i].id},
                                  {"content", results[i]}});
    }
  } else if (api == Api::responses) {
    auto& input = body["input"];
    input.push_back({{"type", "reasoning"}, {"id", "rs_1"}, {"encrypted_content", "opaque"},
                     {"summary", {{{"type", "summary_text"}, {"text", a.reasoning}}}}});
    input.push_back({{"type", "message"}, {"role", "assistant"},
                     {"content", {{{"type", "output_text"}, {"text", a.content}}}}});
    for (const Call& c : a.calls) {
      input.push_back({{"type", "function_call"}, {"call_id", c.id}, {"name", c.name},
                       {"arguments", c.arguments}});
    }
    for (size_t i = 0; i < a.calls.size(); ++i) {
      input.push_back({{"type", "function_call_output"}, {"call_id", a.calls[i].id},
                       {"output", results[i]}});
    }
  } else {
    json content = {{{"type", "thinking"}, {"thinking", a.reasoning}, {"signature", "sig"}},
                    {{"type", "text"}, {"text", a.content}}};
    for (const Call& c : a.calls) {
      content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name},
                         {"input", json::parse(c.arguments)}});
    }
    body["messages"].push_back({{"role", "assistant"}, {"content", content}});
    json tool_results = json::array();
    for (size_t i = 0; i < a.calls.size(); ++i) {
      tool_results.push_back({{"type", "tool_result"}, {"tool_use_id", a.calls[i].id},
                              {"content", {{{"type", "text"}, {"text", results[i]}}}},
                              {"cache_control", {{"type", "ephemeral"}}}});
    }
    body["messages"].push_back({{"role", "user"}, {"content", tool_results}});
  }
  return body;
}

// The system turn with the two tools, as the format renders it (test_chat checks it literally).
std::string system_turn(text::ChatFormat format) {
  text::Conversation c;
  c.messages.push_back({text::ChatRole::system, "You code."});
  for (const json& t : json::parse(tools_openai)) c.tools_json.push_back(t.dump());
  c.add_generation_prompt = false;
  auto text = text::render_chat(format, c);
  REQUIRE(text.ok());
  return *text;
}

// The second prompt, literally: user, the assistant's reasoning, text and calls, the results.
std::string expected_second_prompt(text::ChatFormat format, const Answer& a) {
  if (format == text::ChatFormat::minimax_m2) {
    // Parameters in the order the client sent the arguments back; strings raw, the rest as
    // Python's json.dumps (the template's tojson).
    std::string params;
    const json arguments = json::parse(a.calls[0].arguments);
    for (const auto& [key, value] : arguments.items()) {
      auto dumped = text::python_style_json(value.dump());
      REQUIRE(dumped.ok());
      params += "<parameter name=\"" + key + "\">" +
                (value.is_string() ? value.get<std::string>() : *dumped) + "</parameter>\n";
    }
    return system_turn(format) + "]~b]user\nList src and tell the time.[e~[\n]~b]ai\n<think>\n" +
           a.reasoning + "\n</think>\n\n" + a.content +
           "\n<minimax:tool_call>\n<invoke name=\"list_files\">\n" + params +
           "</invoke>\n<invoke name=\"get_time\">\n</invoke>\n"
           "</minimax:tool_call>[e~[\n]~b]tool\n<response>a.c\nb.h</response>\n"
           "<response>12:00</response>[e~[\n]~b]ai\n<think>\n";
  }
  return system_turn(format) +
         "<|im_start|>user\nList src and tell the time.<|im_end|>\n<|im_start|>assistant\n"
         "<think>\n" + trim(a.reasoning) + "\n</think>\n\n" + a.content +
         "\n<tool_call>\n{\"name\": \"list_files\", \"arguments\": " + a.calls[0].arguments +
         "}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": " +
         a.calls[1].arguments +
         "}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\na.c\nb.h\n"
         "</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
         "<|im_start|>assistant\n";
}

std::vector<int32_t> tokens_of(GatewayHarness& h, const std::string& text) {
  return h.tokenizer().encode(text, false);
}

DecodeScript script_of(const std::vector<int32_t>& tokens, wire::FinishReason reason) {
  // Two chunks, split mid-output (inside a marker as often as not).
  size_t half = tokens.size() / 2;
  std::vector<int32_t> a(tokens.begin(), tokens.begin() + static_cast<long>(half));
  std::vector<int32_t> b(tokens.begin() + static_cast<long>(half), tokens.end());
  return DecodeScript{{{"a/decode/dec", 0, a}, {"a/decode/dec", static_cast<uint32_t>(half), b}},
                      static_cast<uint32_t>(tokens.size()), reason, false};
}

void check_round_trip(GatewayHarness& h, text::ChatFormat format, const std::string& output,
                      int64_t reasoning_tokens_expected) {
  std::vector<int32_t> tokens = tokens_of(h, output);
  for (Api api : {Api::chat, Api::responses, Api::messages}) {
    for (bool stream : {false, true}) {
      CAPTURE(api_name(api));
      CAPTURE(stream);
      auto first = h.post(api_path(api), first_request(api, stream).dump(),
                          script_of(tokens, wire::FinishReason::STOP));
      Answer a = answer_of(api, stream, first.response);
      CHECK(trim(a.reasoning) == "I need the files and the time.");
      CHECK(trim(a.content) == "Let me look.");
      REQUIRE(a.calls.size() == 2);
      CHECK(a.calls[0].name == "list_files");
      // Same object (key order aside: Anthropic's input objects are rendered with sorted keys).
      CHECK(nlohmann::json::parse(a.calls[0].arguments) == nlohmann::json::parse(list_args));
      CHECK(a.calls[1].name == "get_time");
      CHECK(nlohmann::json::parse(a.calls[1].arguments) == nlohmann::json::object());
      CHECK(a.calls[0].id != a.calls[1].id);
      CHECK(a.finish == (api == Api::messages ? "tool_use" : "tool_calls"));
      CHECK(a.completion_tokens == static_cast<int64_t>(tokens.size()));
      if (api != Api::messages) CHECK(a.reasoning_tokens == reasoning_tokens_expected);
      // The results go back; the next prompt is the format's, token for token.
      auto second = h.post(api_path(api), second_request(api, a).dump(),
                           script_of(tokens_of(h, "Done."), wire::FinishReason::STOP));
      REQUIRE_MESSAGE(second.response.status == 200, second.response.body);
      std::string expected = expected_second_prompt(format, a);
      CHECK(h.tokenizer().decode(second.prompt) == expected);
      CHECK(second.prompt == tokens_of(h, expected));
    }
  }
}

// Tokens up to and including the one that ends `marker` in `output`.
int64_t tokens_through(GatewayHarness& h, const std::string& output, const std::string& marker) {
  std::vector<int32_t> tokens = tokens_of(h, output);
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    text += h.tokenizer().decode_piece(i == 0 ? std::nullopt : std::optional<int32_t>(tokens[i - 1]),
                                       tokens[i]);
    if (text.find(marker) != std::string::npos) return static_cast<int64_t>(i + 1);
  }
  FAIL("marker not in output");
  return -1;
}

}  // namespace

TEST_CASE("tool calls round trip, minimax-m2: every API, streamed and not; next prompt exact") {
  GatewayHarness h(synth_dir(devices::Arch::minimax_m2), "minimax-m2", 4096);
  check_round_trip(h, text::ChatFormat::minimax_m2, minimax_output,
                   tokens_through(h, minimax_output, "</think>"));
}

TEST_CASE("tool calls round trip, Qwen/ChatML <tool_call>: every API, streamed and not") {
  GatewayHarness h(synth_dir(devices::Arch::llama), "chatml", 4096);
  check_round_trip(h, text::ChatFormat::chatml, qwen_output,
                   tokens_through(h, qwen_output, "</think>"));
}

TEST_CASE("tool_choice named, required and none; a tool call cut by max_tokens (minimax-m2)") {
  GatewayHarness h(synth_dir(devices::Arch::minimax_m2), "minimax-m2", 4096);
  SUBCASE("named: the prompt opens that call; the answer is that call, no reasoning") {
    json extra = {{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}};
    auto x = h.post("/v1/chat/completions", first_request(Api::chat, false, extra).dump(),
                    script_of(tokens_of(h, "</invoke>\n</minimax:tool_call>"),
                              wire::FinishReason::STOP));
    std::string prompt = h.tokenizer().decode(x.prompt);
    CHECK(prompt.ends_with("]~b]ai\n<think>\n</think>\n\n<minimax:tool_call>\n"
                           "<invoke name=\"get_time\">\n"));
    Answer a = answer_of(Api::chat, false, x.response);
    REQUIRE(a.calls.size() == 1);
    CHECK(a.calls[0].name == "get_time");
    CHECK(a.calls[0].arguments == "{}");
    CHECK(a.reasoning.empty());
    CHECK(a.finish == "tool_calls");
    // Anthropic's {"type":"tool"} and Responses' {"type":"function","name"} do the same.
    json anth = {{"tool_choice", {{"type", "tool"}, {"name", "get_time"}}}};
    auto m = h.post("/v1/messages", first_request(Api::messages, true, anth).dump(),
                    script_of(tokens_of(h, "</invoke>\n</minimax:tool_call>"),
                              wire::FinishReason::STOP));
    Answer ma = answer_of(Api::messages, true, m.response);
    REQUIRE(ma.calls.size() == 1);
    CHECK(ma.calls[0].name == "get_time");
    CHECK(ma.finish == "tool_use");
  }
  SUBCASE("required: the prompt opens a call block; the model picks the tool") {
    json extra = {{"tool_choice", "required"}};
    auto x = h.post("/v1/chat/completions", first_request(Api::chat, false, extra).dump(),
                    script_of(tokens_of(h, "<invoke name=\"list_files\">\n<parameter name="
                                           "\"path\">.</parameter>\n</invoke>\n"
                                           "</minimax:tool_call>"),
                              wire::FinishReason::STOP));
    CHECK(h.tokenizer().decode(x.prompt).ends_with(
        "]~b]ai\n<think>\n</think>\n\n<minimax:tool_call>\n"));
    Answer a = answer_of(Api::chat, false, x.response);
    REQUIRE(a.calls.size() == 1);
    CHECK(a.calls[0].name == "list_files");
    CHECK(nlohmann::json::parse(a.calls[0].arguments) == nlohmann::json{{"path", "."}});
    CHECK(a.reasoning.empty());
    CHECK(a.finish == "tool_calls");
  }
  SUBCASE("none: the tools are not in the prompt and call markup stays text") {
    json extra = {{"tool_choice", "none"}};
    auto x = h.post("/v1/chat/completions", first_request(Api::chat, false, extra).dump(),
                    script_of(tokens_of(h, minimax_output), wire::FinishReason::STOP));
    CHECK(h.tokenizer().decode(x.prompt).find("<tools>") == std::string::npos);
    Answer a = answer_of(Api::chat, false, x.response);
    CHECK(a.calls.empty());
    CHECK(a.content.find("<invoke name=\"list_files\">") != std::string::npos);
    CHECK(a.finish == "stop");
  }
  SUBCASE("cut by max_tokens: the complete parameters so far, finish length") {
    const std::string cut = minimax_output.substr(0, minimax_output.find("<parameter name=\"opts"));
    auto x = h.post("/v1/chat/completions", first_request(Api::chat, true).dump(),
                    script_of(tokens_of(h, cut), wire::FinishReason::LENGTH));
    Answer a = answer_of(Api::chat, true, x.response);
    REQUIRE(a.calls.size() == 1);
    CHECK(a.calls[0].name == "list_files");
    CHECK(json::parse(a.calls[0].arguments) == json{{"path", "src/été"}});
    CHECK(a.finish == "length");
  }
}
