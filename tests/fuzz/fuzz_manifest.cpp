// Fuzz target: the cluster manifest parser (config/manifest.hpp) from raw TOML bytes
// (STYLE.md §8, issue 12). parse_manifest must never throw or crash: any input is a valid
// Manifest or a non-empty list of issues, each with a message, in file order; a valid one
// summarizes and parses again from the same text to the same result.
//   libFuzzer: build-fuzz/tests/fuzz_manifest (tests/fuzz/README.md)
//   here: build/tests/fuzz_manifest_replay tests/fuzz/corpus/manifest (a test)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "config/manifest.hpp"

namespace {

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

// Issues with a place come first, in (line, column) order; placeless ones (line 0) last.
void check_issues(const tandem::config::ManifestErrors& errors) {
  require(!errors.issues.empty());
  bool placeless_seen = false;
  uint32_t line = 0, column = 0;
  for (const auto& issue : errors.issues) {
    require(!issue.message.empty());
    require(issue.file == "fuzz.toml");
    if (issue.line == 0) {
      placeless_seen = true;
      continue;
    }
    require(!placeless_seen);
    require(issue.line > line || (issue.line == line && issue.column >= column));
    line = issue.line;
    column = issue.column;
  }
  require(!errors.describe().empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::config;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = parse_manifest(text, "fuzz.toml");
  if (auto* errors = std::get_if<ManifestErrors>(&parsed)) {
    check_issues(*errors);
    return 0;
  }
  const Manifest& manifest = std::get<Manifest>(parsed);
  require(!manifest.nodes.empty());
  require(!manifest.cluster.name.empty());
  require(!summarize(manifest).empty());
  auto again = parse_manifest(text, "fuzz.toml");
  require(std::holds_alternative<Manifest>(again));
  require(summarize(std::get<Manifest>(again)) == summarize(manifest));
  return 0;
}
