// Output parser: reasoning, MiniMax-M2 and Qwen tool calls, at every split point.
#include <doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/gateway/output_parser.hpp"

using namespace tandem::gateway;
using json = nlohmann::ordered_json;  // as tandem::gateway::json: key order as sent

namespace {

// One line per event after merging adjacent same-kind deltas: T:text R:text S:i:name A:i:json
std::vector<std::string> describe(const std::vector<GenEvent>& events) {
  std::vector<std::string> out;
  auto append = [&out](const std::string& tag, const std::string& body) {
    if (!out.empty() && out.back().rfind(tag, 0) == 0) {
      out.back() += body;
    } else {
      out.push_back(tag + body);
    }
  };
  for (const GenEvent& e : events) {
    if (const auto* t = std::get_if<TextDelta>(&e)) append("T:", t->text);
    if (const auto* r = std::get_if<ReasoningDelta>(&e)) append("R:", r->text);
    if (const auto* s = std::get_if<ToolCallStart>(&e)) {
      out.push_back("S:" + std::to_string(s->index) + ":" + s->name);
    }
    if (const auto* a = std::get_if<ToolCallArgsDelta>(&e)) {
      append("A:" + std::to_string(a->index) + ":", a->delta);
    }
  }
  return out;
}

void add(std::vector<GenEvent>& all, std::vector<GenEvent> more) {
  for (GenEvent& e : more) all.push_back(std::move(e));
}

std::vector<std::string> parse_chunks(const OutputParserConfig& config,
                                      const std::vector<std::string>& chunks) {
  OutputParser parser(config);
  std::vector<GenEvent> all;
  for (const std::string& c : chunks) add(all, parser.feed(c));
  add(all, parser.finish());
  return describe(all);
}

// Parses unsplit, then split at every byte boundary, then byte by byte; all must agree.
std::vector<std::string> parse_every_split(const OutputParserConfig& config,
                                           const std::string& text) {
  std::vector<std::string> whole = parse_chunks(config, {text});
  for (size_t k = 0; k <= text.size(); ++k) {
    std::vector<std::string> split = parse_chunks(config, {text.substr(0, k), text.substr(k)});
    INFO("split at byte " << k);
    REQUIRE(split == whole);
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  REQUIRE(parse_chunks(config, bytes) == whole);
  return whole;
}

const std::string weather_tool =
    R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"},"days":{"type":"integer"},)"
    R"("metric":{"type":"boolean"},"opts":{"type":"object"},"limit":{"type":["integer","null"]},)"
    R"("ratio":{"type":"number"}}}}})";

OutputParserConfig minimax(bool starts_in_reasoning) {
  return OutputParserConfig{true, starts_in_reasoning, ToolCallFormat::minimax_m2, {weather_tool}};
}

}  // namespace

TEST_CASE("MiniMax-M2: reasoning, text and two typed tool calls at every split") {
  std::string text =
      "<think>\nThe user wants weather.\n</think>\n\nLet me check.<minimax:tool_call>\n"
      "<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
      "<parameter name=\"days\">3</parameter>\n<parameter name=\"metric\">true</parameter>\n"
      "<parameter name=\"opts\">{\"a\": [1, 2]}</parameter>\n"
      "<parameter name=\"limit\">null</parameter>\n<parameter name=\"ratio\">0.5</parameter>\n"
      "</invoke>\n<invoke name=\"noop\">\n</invoke>\n</minimax:tool_call>";
  std::vector<std::string> got = parse_every_split(minimax(false), text);
  std::vector<std::string> want = {
      "R:\nThe user wants weather.\n",
      "T:Let me check.",
      "S:0:get_weather",
      R"(A:0:{"city":"Paris","days":3,"metric":true,"opts":{"a":[1,2]},"limit":null,"ratio":0.5})",
      "S:1:noop",
      "A:1:{}"};
  CHECK(got == want);
  // The arguments are a JSON object with the schema's types.
  json args = json::parse(got[3].substr(4));
  CHECK(args["days"].is_number_integer());
  CHECK(args["metric"].is_boolean());
  CHECK(args["opts"].is_object());
}

TEST_CASE("MiniMax-M2: output that starts inside thinking; values with '<' stay intact") {
  std::string text =
      "I should read the file.</think>\n\n<minimax:tool_call><invoke name=\"read\">"
      "<parameter name=\"path\">\n/a<b>.txt\n</parameter></invoke></minimax:tool_call>\nDone.";
  std::vector<std::string> got = parse_every_split(minimax(true), text);
  std::vector<std::string> want = {"R:I should read the file.", "S:0:read",
                                   R"(A:0:{"path":"/a<b>.txt"})", "T:\nDone."};
  CHECK(got == want);
}

TEST_CASE("MiniMax-M2: schema fallbacks keep the text as a string") {
  std::string text =
      "<minimax:tool_call><invoke name=\"get_weather\"><parameter name=\"days\">three"
      "</parameter><parameter name=\"metric\">maybe</parameter><parameter name=\"extra\">7"
      "</parameter></invoke></minimax:tool_call>";
  std::vector<std::string> got = parse_every_split(minimax(false), text);
  REQUIRE(got.size() == 2);
  CHECK(got[1] == R"(A:0:{"days":"three","metric":"maybe","extra":"7"})");
}

TEST_CASE("MiniMax-M2: a call cut off by max_tokens closes with its complete parameters") {
  std::string text =
      "<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1</parameter>"
      "<parameter name=\"b\">par";
  std::vector<std::string> got = parse_every_split(minimax(false), text);
  std::vector<std::string> want = {"S:0:f", R"(A:0:{"a":"1"})"};
  CHECK(got == want);
}

TEST_CASE("MiniMax-M2: an unterminated block without an invoke is text") {
  std::string text = "x <minimax:tool_call>  junk <inv";
  CHECK(parse_every_split(minimax(false), text) ==
        std::vector<std::string>{"T:x <minimax:tool_call>  junk <inv"});
}

TEST_CASE("near-markers and late <think> are plain text; a trailing partial marker flushes") {
  std::string text = "a < b and <thinking> is not <think> here; <minimax:tool and <tool";
  CHECK(parse_every_split(minimax(false), text) == std::vector<std::string>{"T:" + text});
}

TEST_CASE("reasoning that never ends stays reasoning") {
  CHECK(parse_every_split(minimax(true), "thinking forever <b>") ==
        std::vector<std::string>{"R:thinking forever <b>"});
}

TEST_CASE("without a reasoning parser think tags are text") {
  OutputParserConfig config;
  CHECK(parse_every_split(config, "<think>a</think>b") ==
        std::vector<std::string>{"T:<think>a</think>b"});
}

TEST_CASE("Qwen: reasoning, text, a tool call and a malformed block at every split") {
  OutputParserConfig config{true, false, ToolCallFormat::qwen, {}};
  std::string text =
      "<think>hmm</think>\n\nSure.\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
      "{\"q\": \"x\", \"n\": 2}}\n</tool_call>\n<tool_call>\nnot json\n</tool_call>";
  std::vector<std::string> want = {"R:hmm", "T:Sure.\n", "S:0:search", R"(A:0:{"q":"x","n":2})",
                                   "T:\n<tool_call>\nnot json\n</tool_call>"};
  CHECK(parse_every_split(config, text) == want);
}

TEST_CASE("Qwen: string-encoded arguments, two calls, unterminated call is text") {
  OutputParserConfig config{false, false, ToolCallFormat::qwen, {}};
  std::string text =
      "<tool_call>{\"name\":\"a\",\"arguments\":\"{\\\"k\\\":1}\"}</tool_call>"
      "<tool_call>{\"name\":\"b\"}</tool_call><tool_call>{\"name\":";
  std::vector<std::string> want = {"S:0:a", R"(A:0:{"k":1})", "S:1:b", "A:1:{}",
                                   "T:<tool_call>{\"name\":"};
  CHECK(parse_every_split(config, text) == want);
}

TEST_CASE("UTF-8 text split inside characters concatenates back unchanged") {
  std::string text =
      "<think>생각 중…</think>답: 한국어 ✓ "
      "<minimax:tool_call><invoke name=\"get_weather\">"
      "<parameter name=\"city\">서울</parameter></invoke></minimax:tool_call>";
  std::vector<std::string> want = {"R:생각 중…", "T:답: 한국어 ✓ ", "S:0:get_weather",
                                   R"(A:0:{"city":"서울"})"};
  CHECK(parse_every_split(minimax(false), text) == want);
}

TEST_CASE("feed returns nothing for a held marker prefix and counts tool calls") {
  OutputParser parser(minimax(false));
  CHECK(parser.feed("<minimax:to").empty());
  std::vector<GenEvent> events = parser.feed("ol_call><invoke name=\"f\">");
  REQUIRE(events.size() == 1);
  CHECK(std::get<ToolCallStart>(events[0]).name == "f");
  CHECK(std::get<ToolCallStart>(events[0]).id.empty());
  CHECK(parser.tool_calls_count() == 1);
  std::vector<GenEvent> rest = parser.finish();
  REQUIRE(rest.size() == 1);
  CHECK(std::get<ToolCallArgsDelta>(rest[0]).delta == "{}");
}
