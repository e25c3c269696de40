// `tandem up MANIFEST`: starts every node of the manifest that lives on this machine as a
// child process (`tandem node --manifest M --node NAME`), forwards their output prefixed with
// the node name, restarts one that exits (with backoff, bounded per window), and stops them
// all on Ctrl-C / SIGTERM.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

#include "actors/executor/executor_actor.hpp"
#include "config/manifest.hpp"
#include "devices/kv_memory.hpp"
#include "tools/commands.hpp"
#include "tools/launcher.hpp"
#include "tools/up_plan.hpp"

namespace tandem::tools {
namespace {

// Flags::parse keeps the last value of a repeated flag; --only is repeatable, so collect it.
std::vector<std::string> only_values(cli::Args args) {
  std::vector<std::string> values;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--") break;
    if (arg == "--only" && i + 1 < args.size()) values.emplace_back(args[++i]);
    if (arg.rfind("--only=", 0) == 0) values.push_back(arg.substr(7));
  }
  return values;
}

std::string resolve_bin(const std::string& flag_value) {
  if (flag_value != "/proc/self/exe") return flag_value;
  std::string self = cli::self_exe_path();
  return self.empty() ? flag_value : self;
}

bool want_color() {
  const char* no_color = std::getenv("NO_COLOR");
  return ::isatty(STDOUT_FILENO) == 1 && (no_color == nullptr || *no_color == '\0');
}

int fail(const std::string& message) {
  std::fprintf(stderr, "tandem up: %s\n", message.c_str());
  return 1;
}

Result<config::Manifest> load(const std::string& path) {
  auto loaded = config::load_manifest(path);
  if (auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    std::string issues = errors->describe();
    while (!issues.empty() && issues.back() == '\n') issues.pop_back();
    return make_error(ErrorKind::invalid, path + " is not a valid manifest:\n" + issues);
  }
  return std::get<config::Manifest>(std::move(loaded));
}

}  // namespace

int cmd_up(cli::Args args) {
  cli::Flags flags("tandem up MANIFEST [--only NODE]...",
                   "Starts every node of MANIFEST whose host is this machine (loopback, the\n"
                   "hostname, or an address of a local interface) as `tandem node`, prefixes\n"
                   "their output with the node name, and restarts a node that exits or dies\n"
                   "(backoff from 0.5 s doubling to 30 s; at most --restarts per window, then\n"
                   "it is given up on and the others keep serving). Ctrl-C/SIGTERM stops them\n"
                   "all (exit status 1 if a node was given up on). --restarts 0: the first node\n"
                   "to exit stops the cluster.");
  flags.positional("MANIFEST", "the cluster manifest (TOML)")
      .flag("grace-ms", "MS",
            "how long nodes get to stop after SIGTERM before SIGKILL (default: the manifest's "
            "[supervisor] drain_timeout_ms + 10000: they drain first)",
            "")
      .flag("bin", "PATH", "the tandem binary each node runs", "/proc/self/exe")
      .flag("only", "NODE[,NODE...]", "start only these nodes (repeatable)")
      .flag("restarts", "N", "restarts of one node per window before it is given up on", "5")
      .flag("restart-window-s", "S", "the window --restarts counts over", "60");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  std::optional<int64_t> grace_ms;
  if (!flags.get("grace-ms").empty()) {
    grace_ms = flags.get_int("grace-ms");
    if (!grace_ms) return 2;
    if (*grace_ms < 0) return fail("--grace-ms must be >= 0, got " + flags.get("grace-ms"));
  }
  std::optional<int64_t> restarts = flags.get_int("restarts");
  std::optional<int64_t> window_s = flags.get_int("restart-window-s");
  if (!restarts || !window_s) return 2;
  if (*restarts < 0 || *restarts > 1000) {
    return fail("--restarts must be in [0, 1000], got " + flags.get("restarts"));
  }
  if (*window_s < 1 || *window_s > 86400) {
    return fail("--restart-window-s must be in [1, 86400], got " + flags.get("restart-window-s"));
  }
  UpRequest request{flags.get("MANIFEST"), resolve_bin(flags.get("bin")),
                    split_node_list(only_values(args))};
  if (::access(request.tandem_bin.c_str(), X_OK) != 0) {
    return fail("--bin " + request.tandem_bin + ": not an executable file");
  }
  auto manifest = load(request.manifest_path);
  if (!manifest) return fail(manifest.error().message);
  auto children = plan_local_nodes(*manifest, request, this_host());
  if (!children) return fail(children.error().message);
  std::string names;
  for (const auto& child : *children) names += (names.empty() ? "" : ", ") + child.name;
  // Each node checks its own KV pools at start; the nodes started here share this host.
  std::vector<devices::KvPoolUse> pools;
  for (const auto& child : *children) {
    const config::Node* node = manifest->find_node(child.name);
    RT_ASSERT(node != nullptr, child.name);
    auto own = actors::node_kv_pools(*manifest, *node, true);
    pools.insert(pools.end(), own.begin(), own.end());
  }
  if (auto too_big = devices::check_kv_pools_fit("this host's nodes " + names, pools,
                                                 devices::host_memory_bytes())) {
    return fail(*too_big);
  }
  std::fprintf(stderr, "tandem up: starting %zu node(s): %s\n", children->size(), names.c_str());
  LauncherOptions options;
  options.grace = std::chrono::milliseconds(
      grace_ms ? *grace_ms : int64_t{manifest->supervisor.drain_timeout_ms} + 10000);
  options.color = want_color();
  options.restart.restarts_max = static_cast<uint32_t>(*restarts);
  options.restart.window_ms = std::chrono::seconds(*window_s);
  auto outcome = run_cluster(*children, options);
  if (!outcome) return fail(outcome.error().message);
  return outcome->exit_code;
}

}  // namespace tandem::tools
