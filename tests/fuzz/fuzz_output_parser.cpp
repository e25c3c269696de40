// Fuzz target: the gateway's streaming output parser (actors/gateway/output_parser.hpp) on
// arbitrary model output fed in arbitrary splits (STYLE.md §8, issue 12). Input: byte 0 picks
// the config (reasoning, starts_in_reasoning, tool format, with or without a tool schema),
// bytes 1-2 seed the split points, the rest is the model's text. Checked: feeding it whole,
// in the seeded chunks, and byte by byte gives the same events (adjacent deltas merged);
// only delta events come out; tool calls are numbered 0, 1, ... with arguments only for a
// started call; each call's arguments concatenate to JSON (an object for MiniMax-M2);
// tool_calls_count() counts the starts.
//   libFuzzer: build-fuzz/tests/fuzz_output_parser (tests/fuzz/README.md)
//   here: build/tests/fuzz_output_parser_replay tests/fuzz/corpus/output_parser (a test)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "actors/gateway/output_parser.hpp"

namespace {

using namespace tandem::gateway;

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

const std::string weather_tool =
    R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"},"days":{"type":"integer"},)"
    R"("metric":{"type":"boolean"},"opts":{"type":"object"},"limit":{"type":["integer","null"]},)"
    R"("ratio":{"type":"number"},"tags":{"type":"array"},"none":{"type":"null"}}}}})";

OutputParserConfig config_of(uint8_t byte) {
  OutputParserConfig config;
  config.reasoning = (byte & 1) != 0;
  config.starts_in_reasoning = config.reasoning && (byte & 2) != 0;
  static constexpr ToolCallFormat formats[] = {ToolCallFormat::none, ToolCallFormat::minimax_m2,
                                               ToolCallFormat::qwen, ToolCallFormat::minimax_m2};
  config.tool_format = formats[(byte >> 2) & 3];
  if ((byte & 16) != 0) config.tools_json = {weather_tool};
  return config;
}

struct Parsed {
  std::vector<std::string> lines;  // T:text R:text S:i:name A:i:json, adjacent deltas merged
  int64_t tool_calls_count = 0;
  std::map<int64_t, std::string> arguments;  // per tool call index
};

void append(std::vector<std::string>& out, const std::string& tag, const std::string& body) {
  if (!out.empty() && out.back().rfind(tag, 0) == 0) {
    out.back() += body;
  } else {
    out.push_back(tag + body);
  }
}

void describe(Parsed& parsed, const std::vector<GenEvent>& events) {
  for (const GenEvent& e : events) {
    if (const auto* t = std::get_if<TextDelta>(&e)) {
      append(parsed.lines, "T:", t->text);
    } else if (const auto* r = std::get_if<ReasoningDelta>(&e)) {
      append(parsed.lines, "R:", r->text);
    } else if (const auto* s = std::get_if<ToolCallStart>(&e)) {
      require(s->index == int64_t(parsed.arguments.size()));
      parsed.arguments[s->index];
      parsed.lines.push_back("S:" + std::to_string(s->index) + ":" + s->name);
    } else if (const auto* a = std::get_if<ToolCallArgsDelta>(&e)) {
      require(parsed.arguments.count(a->index) == 1);
      parsed.arguments[a->index] += a->delta;
      append(parsed.lines, "A:" + std::to_string(a->index) + ":", a->delta);
    } else {
      require(false);  // the parser makes deltas only
    }
  }
}

Parsed parse_chunks(const OutputParserConfig& config, const std::vector<std::string_view>& chunks) {
  OutputParser parser(config);
  Parsed parsed;
  for (std::string_view chunk : chunks) describe(parsed, parser.feed(chunk));
  describe(parsed, parser.finish());
  parsed.tool_calls_count = parser.tool_calls_count();
  require(parsed.tool_calls_count == int64_t(parsed.arguments.size()));
  require(!parser.holding());
  return parsed;
}

std::vector<std::string_view> seeded_chunks(std::string_view text, uint32_t seed) {
  std::vector<std::string_view> chunks;
  uint32_t state = seed * 2654435761u + 1;
  while (!text.empty()) {
    state = state * 1103515245u + 12345u;
    size_t take = std::min<size_t>(text.size(), 1 + (state >> 16) % 24);
    chunks.push_back(text.substr(0, take));
    text.remove_prefix(take);
  }
  return chunks;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const OutputParserConfig config = config_of(data[0]);
  const uint32_t seed = uint32_t(data[1]) | uint32_t(data[2]) << 8;
  std::string_view text(reinterpret_cast<const char*>(data) + 3, size - 3);
  const Parsed whole = parse_chunks(config, {text});
  for (const auto& [index, arguments] : whole.arguments) {
    auto parsed = nlohmann::json::parse(arguments, nullptr, false);
    require(!parsed.is_discarded());
    if (config.tool_format == ToolCallFormat::minimax_m2) require(parsed.is_object());
  }
  require(parse_chunks(config, seeded_chunks(text, seed)).lines == whole.lines);
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  require(parse_chunks(config, bytes).lines == whole.lines);
  return 0;
}
