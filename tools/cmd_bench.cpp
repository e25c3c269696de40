// `tandem bench KIND`: dispatches to the benchmarks in bench/.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/device_bench.hpp"
#include "bench/hash_bench.hpp"
#include "bench/overhead_bench.hpp"
#include "bench/rbln_pipeline_bench.hpp"
#include "bench/router_bench.hpp"
#include "bench/serve_bench.hpp"
#include "bench/spec_bench.hpp"
#include "bench/spec_decode_bench.hpp"
#include "bench/sweep_cli.hpp"
#include "bench/tier2_bench.hpp"
#include "bench/tokenize_bench.hpp"
#include "bench/transport_bench.hpp"
#include "tools/commands.hpp"

namespace tandem::tools {
namespace {

int run_hash(cli::Args args) {
  cli::Flags flags("tandem bench hash [--tokens N] [--seconds S]",
                   "Hashes a prompt's blocks (HMAC-SHA-256, chained) at block sizes 16 and 4096\n"
                   "and prints the time beside `openssl speed` for the same hash, as ratios.");
  flags.flag("tokens", "N", "prompt tokens", "200000")
      .flag("seconds", "S", "wall time per measurement", "0.5")
      .flag("no-openssl", "", "skip the openssl baseline");
  int code = 0;
  if (!flags.parse(args, &code)) return code;
  auto tokens = flags.get_int("tokens");
  auto seconds = flags.get_double("seconds");
  if (!tokens || *tokens <= 0 || !seconds || *seconds <= 0) return 2;
  bench::HashBenchOptions options;
  options.tokens_count = static_cast<uint32_t>(*tokens);
  options.seconds_min = *seconds;
  options.run_openssl = !flags.has("no-openssl");
  return bench::run_hash_bench(options);
}

// Benches that are Node scripts (bench/*.mjs: fetch, SSE and thousands of sockets with no C++
// client to keep, beside the official SDK checks): this finds the script ($TANDEM_SOURCE_ROOT,
// else the tree this binary was built in) and runs it with the flags.
int run_node_script(const char* kind, const char* file, cli::Args args) {
  namespace fs = std::filesystem;
  const char* root_env = std::getenv("TANDEM_SOURCE_ROOT");
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  fs::path root = root_env != nullptr ? fs::path(root_env) : exe.parent_path() / ".." / "..";
  fs::path script = root / "bench" / file;
  if (!fs::exists(script)) {
    std::fprintf(stderr, "tandem bench %s: %s not found (set TANDEM_SOURCE_ROOT)\n", kind,
                 script.c_str());
    return 2;
  }
  std::vector<std::string> argv_text = {"node", script.string()};
  for (const char* a : args) argv_text.emplace_back(a);
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp("node", argv.data());
  std::fprintf(stderr, "tandem bench %s: cannot run node (run tools/setup.sh): %s\n", kind,
               std::strerror(errno));
  return 2;
}

// Prefix reuse across an agent's turns (bench/agent_turns.mjs).
int run_agent_turns(cli::Args args) {
  return run_node_script("agent-turns", "agent_turns.mjs", args);
}

// Memory and answers at 10x capacity (bench/overload.mjs).
int run_overload(cli::Args args) { return run_node_script("overload", "overload.mjs", args); }

// TTFT of a long prompt computed vs read back from tier 2 (bench/tier2_ttft.mjs).
int run_tier2_ttft(cli::Args args) {
  return run_node_script("tier2-ttft", "tier2_ttft.mjs", args);
}

}  // namespace

int cmd_bench(cli::Args args) {
  struct Entry {
    const char* name;
    int (*run)(cli::Args);
  };
  static constexpr Entry entries[] = {
      {"device", bench::run_device_bench},
      {"transport", bench::run_transport_bench},
      {"hash", run_hash},
      {"tokenize", bench::run_tokenize_bench},
      {"router", bench::run_router_bench_cli},
      {"serve", bench::run_serve_bench_cli},
      {"overhead", bench::run_overhead_bench},
      {"isolation", bench::run_isolation_bench},
      {"admission", bench::run_admission_bench},
      {"sweep", bench::run_sweep_cli},
      {"tier2", bench::run_tier2_bench},
      {"spec", bench::run_spec_bench},
      {"spec-decode", bench::run_spec_decode_bench},
      {"agent-turns", run_agent_turns},
      {"overload", run_overload},
      {"tier2-ttft", run_tier2_ttft},
      {"rbln-pipeline", bench::run_rbln_pipeline_bench},
  };
  if (!args.empty()) {
    for (const auto& e : entries) {
      if (std::strcmp(args[0], e.name) == 0) return e.run(args.subspan(1));
    }
  }
  std::fprintf(stderr, "usage: tandem bench KIND [flags]\nkinds:");
  for (const auto& e : entries) std::fprintf(stderr, " %s", e.name);
  std::fprintf(stderr, "\n");
  return 2;
}

}  // namespace tandem::tools
