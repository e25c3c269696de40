// Fuzz target: what the admin shell and the status page parse from outside (issue 16): a node's
// metrics text (parse_metrics) turned into the status view and its JSON, and `router set KEY
// VALUE` (config::set_router_key: the value goes through the manifest's TOML rules). Input:
// byte 0 picks the mode; the rest is the text (metrics), or KEY '\n' VALUE.
// Checked: nothing crashes; every parsed sample has a non-empty name; the status JSON parses;
// a set that succeeds changes only what it names and reads back as what it set.
//   libFuzzer: build-fuzz/tests/fuzz_admin_text (tests/fuzz/README.md)
//   here: build/tests/fuzz_admin_text_replay tests/fuzz/corpus/admin_text (a test)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "config/manifest.hpp"
#include "tools/cluster_status.hpp"

namespace {

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

void metrics(const std::string& text) {
  auto samples = tandem::tools::parse_metrics(text);
  for (const auto& s : samples) require(!s.name.empty());
  // The same text as a node's answer, with instance rows cut from it too.
  std::vector<std::vector<std::string>> rows = {{"instance", "state", "w", "r", "u", "t"}};
  std::vector<std::string> cells;
  std::string cell;
  for (char c : text.substr(0, 256)) {
    if (c == ' ' || c == '\n') {
      cells.push_back(cell);
      cell.clear();
      if (cells.size() == 6) rows.push_back(cells), cells.clear();
    } else {
      cell += c;
    }
  }
  tandem::tools::NodeAnswers a{"n", rows, text};
  auto status = tandem::tools::build_status(
      "c", {{"node", "address", "state", "uptime"}, {"n", "a", "up", "1s"}}, {a});
  (void)tandem::tools::render_status(status);
  auto j = nlohmann::json::parse(tandem::tools::status_json(status), nullptr, false);
  require(!j.is_discarded());
}

void router_set(const std::string& text) {
  size_t nl = text.find('\n');
  std::string key = text.substr(0, nl), value = nl == std::string::npos ? "" : text.substr(nl + 1);
  tandem::config::RouterSection current;
  auto set = tandem::config::set_router_key(current, key, value);
  if (!set.ok()) {
    require(!set.error().message.empty());
    return;
  }
  for (const auto& [name, before] : tandem::config::router_settings(current)) {
    std::string after = tandem::config::router_setting_text(*set, name);
    require(!after.empty());
    if (name != key) require(after == before);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    metrics(text);
  } else {
    router_set(text);
  }
  return 0;
}
