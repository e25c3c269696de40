// The official OpenAI and Anthropic JS SDKs (tests/js/sdk_*.mjs, pinned in package.json)
// against a real `tandem node` serving stories15M on free loopback ports; with and without
// API keys. Needs `node`, node_modules (npm ci) and models/stories15M (tools/setup.sh).
#include <doctest.h>

#include "tests/support/tandem_node.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;

namespace {

void require_prerequisites() {
  REQUIRE_MESSAGE(!find_on_path("node").empty(), "`node` is not on PATH (run tools/setup.sh)");
  for (const char* dir : {"/node_modules/openai", "/node_modules/@anthropic-ai/sdk",
                          "/models/stories15M/stories15M.bin"}) {
    REQUIRE_MESSAGE(access((source_root() + dir).c_str(), R_OK) == 0,
                    (source_root() + dir + " is missing (run tools/setup.sh)"));
  }
}

void start(TandemNode& node) {
  REQUIRE_MESSAGE(node.wait_healthy(60s),
                  ("GET /health never answered 200; node log:\n" + node.log()));
}

// Runs one SDK script against the node; returns exit code and its output.
RunResult run_script(const TandemNode& node, const std::string& script,
                     const std::vector<std::string>& extra) {
  std::vector<std::string> argv{find_on_path("node"), source_root() + "/tests/js/" + script,
                                "--base-url", node.base_url(), "--model", "stories15M"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run(std::move(argv), 120s);
}

// Each script run is a CHECK (not REQUIRE) so one node serves all runs of a test case.
void check_passes(const TandemNode& node, const std::string& script,
                    const std::vector<std::string>& extra = {}) {
  RunResult r = run_script(node, script, extra);
  INFO(script, " output:\n", r.output);
  CHECK(r.output.find("PASS ") != std::string::npos);
  CHECK(r.output.find("FAIL ") == std::string::npos);
  CHECK_MESSAGE(r.exit_code == 0, (script + " exited with " + std::to_string(r.exit_code)));
}

}  // namespace

TEST_CASE("sdk: the official OpenAI and Anthropic SDKs against one node") {
  require_prerequisites();
  TandemNode node("", "sdk");
  start(node);
  check_passes(node, "sdk_openai.mjs");
  check_passes(node, "sdk_anthropic.mjs");
  CHECK_MESSAGE(node.running(), ("the node died; log:\n" + node.log()));
}

TEST_CASE("sdk: API keys: the right key works, a wrong one raises AuthenticationError") {
  require_prerequisites();
  TandemNode node("api_keys = [\"sk-test\"]", "sdk-keys");
  start(node);
  check_passes(node, "sdk_openai.mjs", {"--api-key", "sk-test"});
  check_passes(node, "sdk_anthropic.mjs", {"--api-key", "sk-test"});
  check_passes(node, "sdk_openai.mjs", {"--api-key", "sk-wrong", "--expect-auth-error"});
  check_passes(node, "sdk_anthropic.mjs", {"--api-key", "sk-wrong", "--expect-auth-error"});
  CHECK_MESSAGE(node.running(), ("the node died; log:\n" + node.log()));
}

TEST_CASE("sdk: the scripts themselves fail when the server is not there") {
  require_prerequisites();
  // A port nobody listens on: every check must FAIL and the script must exit non-zero.
  std::string url = "http://127.0.0.1:" + std::to_string(free_port());
  for (const char* script : {"sdk_openai.mjs", "sdk_anthropic.mjs"}) {
    RunResult r = run({find_on_path("node"), source_root() + "/tests/js/" + script, "--base-url",
                       url, "--model", "stories15M"},
                      60s);
    INFO(script, " output:\n", r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("FAIL ") != std::string::npos);
    CHECK(r.output.find("PASS ") == std::string::npos);
  }
}
