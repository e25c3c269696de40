// config/examples/agents.toml end to end (issue 11): one `tandem node` on the example
// manifest (ports rewritten to free ones, the model synthesized into a temp dir as
// tools/setup.d/40-agents-model.sh does), then what a coding agent sees:
// - GET /v1/models lists [model] name and every served_names alias;
// - a request for an alias is served and answered under that alias; an unknown model is a
//   404 whose message lists the served names;
// - a chat completion with tools has non-empty reasoning_content AND content (the sim device
//   closes </think> after reasoning_share of its output) and no tool call (the sim never
//   writes tool-call markup), and no chat markers in the text (eos is not detokenized);
//   Anthropic Messages gets a thinking and a text block;
// - a 30K-token prompt is accepted.
#include <doctest.h>

#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tandem_node.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "agents.toml lacks: ", from);
  return text.replace(at, from.size(), to);
}

class AgentsNode {
 public:
  AgentsNode() : dir_(make_temp_dir("agents")), http_port_(free_port()) {
    // The options of tools/setup.d/40-agents-model.sh.
    RunResult synth = run({tandem_bin(), "model", "synth", "--arch", "minimax-m2", "--vocab",
                           "512", "--max-position", "204800", "--seed", "0", "--out",
                           dir_ + "/model"},
                          60s);
    REQUIRE_MESSAGE(synth.exit_code == 0, synth.output);
    std::string text = read_file(source_root() + "/config/examples/agents.toml");
    text = replace_once(text, "path = \"../../models/minimax-m2-synth\"",
                        "path = \"" + dir_ + "/model\"");
    text = replace_once(text, "fabric_port = 17120", "fabric_port = " +
                                                         std::to_string(free_port()));
    text = replace_once(text, "admin_port = 17220", "admin_port = " +
                                                        std::to_string(free_port()));
    text = replace_once(text, "http_port = 8000", "http_port = " + std::to_string(http_port_));
    write_file(dir_ + "/agents.toml", text);
    child_ = std::make_unique<Child>(std::vector<std::string>{tandem_bin(), "node", "--manifest",
                                                              dir_ + "/agents.toml", "--node",
                                                              "agents"},
                                     dir_ + "/node.log");
  }
  ~AgentsNode() {
    child_->signal(SIGTERM);
    child_->wait(5000ms);
    child_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  uint16_t port() const { return http_port_; }
  std::string log() const { return child_->log(); }
  bool running() { return child_->running(); }

 private:
  std::string dir_;
  uint16_t http_port_;
  std::unique_ptr<Child> child_;
};

AgentsNode& node() {
  static AgentsNode shared;
  static bool healthy = eventually(90s, [] {
    return shared.running() && http::get(shared.port(), "/health", 1000ms).status == 200;
  });
  REQUIRE_MESSAGE(healthy, ("GET /health never answered 200; node log:\n" + shared.log()));
  return shared;
}

const char* kTools = R"([{"type":"function","function":{"name":"shell","description":
  "Runs a shell command","parameters":{"type":"object","properties":{"command":
  {"type":"string"}},"required":["command"]}}}])";

json post_json(const std::string& path, const json& body, std::chrono::milliseconds timeout) {
  http::Response r = http::post(node().port(), path, body.dump(), timeout);
  INFO("POST ", path, " -> ", r.status, " ", r.error, ": ", r.body.substr(0, 2000));
  REQUIRE(r.ok());
  json parsed = json::parse(r.body, nullptr, false);
  REQUIRE(!parsed.is_discarded());
  parsed["__status"] = r.status;
  if (r.status != 200 && r.status != 404) {  // what the node said, for a failure's report
    std::string log = node().log();
    MESSAGE("POST ", path, " -> ", r.status, ": ", r.body.substr(0, 2000), "\nnode log (tail):\n",
            log.substr(log.size() > 6000 ? log.size() - 6000 : 0));
  }
  return parsed;
}

}  // namespace

TEST_CASE("agents.toml: /v1/models lists every served name; aliases served; unknown is 404") {
  http::Response models = http::get(node().port(), "/v1/models");
  REQUIRE(models.status == 200);
  json list = json::parse(models.body);
  std::vector<std::string> ids;
  for (const auto& entry : list["data"]) ids.push_back(entry.value("id", ""));
  CHECK(ids == std::vector<std::string>{"MiniMax-M2", "MiniMax-M2.7", "MiniMax-M2.7-small"});
  CHECK(list["data"][1].value("max_model_len", 0) == 204800);

  for (const std::string name : {"MiniMax-M2.7", "MiniMax-M2.7-small", "MiniMax-M2"}) {
    json reply = post_json("/v1/chat/completions",
                           {{"model", name},
                            {"messages", {{{"role", "user"}, {"content", "Title this chat"}}}},
                            {"max_tokens", 16}},
                           30s);
    CHECK(reply["__status"] == 200);
    CHECK(reply.value("model", "") == name);  // the id the client asked for
  }
  json anthropic = post_json("/v1/messages",
                             {{"model", "MiniMax-M2.7-small"},
                              {"max_tokens", 16},
                              {"messages", {{{"role", "user"}, {"content", "hi"}}}}},
                             30s);
  CHECK(anthropic["__status"] == 200);
  CHECK(anthropic.value("model", "") == "MiniMax-M2.7-small");

  json unknown = post_json("/v1/chat/completions",
                           {{"model", "gpt-9"},
                            {"messages", {{{"role", "user"}, {"content", "hi"}}}}},
                           30s);
  CHECK(unknown["__status"] == 404);
  std::string message = unknown["error"].value("message", "");
  for (const char* fragment : {"gpt-9", "'MiniMax-M2'", "'MiniMax-M2.7'", "'MiniMax-M2.7-small'"}) {
    CHECK_MESSAGE(message.find(fragment) != std::string::npos, fragment, ": ", message);
  }
}

TEST_CASE("agents.toml: a dry run has reasoning and content, never a tool call") {
  json tools = json::parse(kTools);
  json reply = post_json("/v1/chat/completions",
                         {{"model", "MiniMax-M2.7"},
                          {"messages", {{{"role", "system"}, {"content", "You are a coder."}},
                                        {{"role", "user"}, {"content", "Fix the failing test"}}}},
                          {"tools", tools},
                          {"tool_choice", "auto"},
                          {"max_tokens", 4096}},
                         60s);
  REQUIRE(reply["__status"] == 200);
  const json& message = reply["choices"][0]["message"];
  INFO(message.dump().substr(0, 2000));
  CHECK(message.value("reasoning_content", "").size() > 0);
  CHECK(message.value("content", "").size() > 0);
  CHECK_FALSE(message.contains("tool_calls"));
  for (const char* marker : {"[e~[", "]~b]", "<think>", "</think>", "<minimax:tool_call>"}) {
    CHECK_MESSAGE(message.value("content", "").find(marker) == std::string::npos, marker);
    CHECK_MESSAGE(message.value("reasoning_content", "").find(marker) == std::string::npos,
                  marker);
  }
  CHECK(reply["choices"][0].value("finish_reason", "") == "stop");
  int64_t completion = reply["usage"].value("completion_tokens", int64_t{0});
  CHECK(completion > 3);
  // reasoning_share 0.3 of the output is reasoning: usage says so.
  int64_t reasoning = reply["usage"]["completion_tokens_details"].value("reasoning_tokens",
                                                                        int64_t{0});
  CHECK(reasoning >= completion / 5);
  CHECK(reasoning <= completion * 2 / 5);

  json messages = post_json("/v1/messages",
                            {{"model", "MiniMax-M2.7"},
                             {"max_tokens", 4096},
                             {"tools", {{{"name", "shell"},
                                         {"input_schema", tools[0]["function"]["parameters"]}}}},
                             {"messages", {{{"role", "user"}, {"content", "Fix the test"}}}}},
                            60s);
  REQUIRE(messages["__status"] == 200);
  std::vector<std::string> kinds;
  for (const auto& block : messages["content"]) kinds.push_back(block.value("type", ""));
  INFO(messages.dump().substr(0, 2000));
  CHECK(kinds == std::vector<std::string>{"thinking", "text"});
  CHECK(messages.value("stop_reason", "") == "end_turn");
}

TEST_CASE("agents.toml: a 30K-token prompt is accepted") {
  std::string repository;
  for (int i = 0; repository.size() < 200000; ++i) {
    repository += "// file src/module_" + std::to_string(i) + ".cpp\nint function_" +
                  std::to_string(i) + "(int x) { return x * " + std::to_string(i * 7 % 97) +
                  " + helper(" + std::to_string(i) + "); }\n";
  }
  json reply = post_json("/v1/chat/completions",
                         {{"model", "MiniMax-M2.7"},
                          {"messages", {{{"role", "user"}, {"content", repository}}}},
                          {"max_tokens", 64}},
                         120s);
  CHECK(reply["__status"] == 200);
  int64_t prompt_tokens = reply["usage"].value("prompt_tokens", int64_t{0});
  CHECK(prompt_tokens >= 30000);
  CHECK(prompt_tokens < 204800);
}

namespace {

// Runs a Node script of tests/js or bench against the node; PASS/FAIL lines as sdk checks.
RunResult run_node_script(const std::string& script, const std::vector<std::string>& extra) {
  REQUIRE_MESSAGE(!find_on_path("node").empty(), "`node` is not on PATH (run tools/setup.sh)");
  std::vector<std::string> argv{find_on_path("node"), source_root() + "/" + script,
                                "--base-url", "http://127.0.0.1:" + std::to_string(node().port())};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run(std::move(argv), 300s);
}

void check_script_passes(const std::string& script) {
  RunResult r = run_node_script(script, {"--model", "MiniMax-M2.7"});
  INFO(script, " output:\n", r.output);
  CHECK(r.output.find("PASS ") != std::string::npos);
  CHECK(r.output.find("FAIL ") == std::string::npos);
  CHECK(r.exit_code == 0);
}

}  // namespace

TEST_CASE("agents.toml: request bodies in the shape agents send, through each API (30K+ tokens)") {
  check_script_passes("tests/js/agent_replay.mjs");
  CHECK_MESSAGE(node().running(), node().log());
}

TEST_CASE("agents.toml: the official SDKs as agents use them (tools, function calls, tool_use)") {
  REQUIRE_MESSAGE(access((source_root() + "/node_modules/openai").c_str(), R_OK) == 0,
                  "node_modules is missing (run tools/setup.sh)");
  check_script_passes("tests/js/sdk_agents.mjs");
}

// [model] block_tokens of config/examples/agents.toml, the manifest the node runs.
int64_t manifest_block_tokens() {
  std::string text = read_file(source_root() + "/config/examples/agents.toml");
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(text, m, std::regex("\\nblock_tokens = (\\d+)")),
                  "agents.toml lacks block_tokens");
  return std::stoll(m[1].str());
}

TEST_CASE("agents.toml: tandem bench agent-turns (3 turns): follow-up turns reuse the prefix") {
  const int64_t block_tokens = manifest_block_tokens();
  RunResult r = run({tandem_bin(), "bench", "agent-turns", "--base-url",
                     "http://127.0.0.1:" + std::to_string(node().port()), "--model",
                     "MiniMax-M2.7", "--block-tokens", std::to_string(block_tokens), "--turns",
                     "3", "--seed", "11", "--json"},
                    300s);
  INFO(r.output);
  // bench/agent_turns.mjs: 0 goal met, 3 figures printed and goal NOT met, 1 an error.
  REQUIRE_MESSAGE((r.exit_code == 0 || r.exit_code == 3), "no figures: exit ", r.exit_code);
  size_t begin = r.output.find('[');
  size_t end = r.output.rfind(']');
  REQUIRE((begin != std::string::npos && end != std::string::npos));
  json rows = json::parse(r.output.substr(begin, end - begin + 1));
  REQUIRE(rows.size() == 6);  // messages and responses, 3 turns each
  for (const auto& row : rows) {
    CAPTURE(row.dump());
    const int64_t prompt = row["prompt"].get<int64_t>();
    const int64_t cached = row["cached"].get<int64_t>();
    const int64_t previous = row["previous"].get<int64_t>();
    CHECK(prompt > 0);
    if (row["turn"] == 1) continue;
    CHECK(prompt > previous);  // each turn's prompt extends the last
    // The promise (docs/STATUS.md, docs/benchmarks.md "Prefix reuse across an agent's turns"):
    // from turn 2 on, >= 95% of the previous turn's prompt is reported cached. Every turn's
    // prompt here is ~28K+ tokens, so the block-aligned ceiling floor(previous / block_tokens)
    // * block_tokens is above that share (>= 0.99); 0 cached (no prefix reuse) fails both.
    CHECK(cached > 0);
    CHECK(cached * 100 >= previous * 95);
    CHECK(cached <= previous);  // the cached tokens can only come from the last prompt
  }
  CHECK(r.output.find("summary: messages+responses") != std::string::npos);
  CHECK_MESSAGE(r.exit_code == 0, "agent_turns.mjs says the goal is NOT met");
}
