// `tandem up MANIFEST`: starts every node of the manifest that lives on this machine as a
// child process (`tandem node --manifest M --node NAME`), forwards their output prefixed with
// the node name, and stops them all on Ctrl-C / SIGTERM or when one of them exits.
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
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : flag_value;
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
                   "their output with the node name, and stops them all on Ctrl-C/SIGTERM or\n"
                   "when one exits (exit status 1 then).");
  flags.positional("MANIFEST", "the cluster manifest (TOML)")
      .flag("grace-ms", "MS", "how long nodes get to stop after SIGTERM before SIGKILL", "5000")
      .flag("bin", "PATH", "the tandem binary each node runs", "/proc/self/exe")
      .flag("only", "NODE[,NODE...]", "start only these nodes (repeatable)");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  std::optional<int64_t> grace_ms = flags.get_int("grace-ms");
  if (!grace_ms) return 2;
  if (*grace_ms < 0) return fail("--grace-ms must be >= 0, got " + flags.get("grace-ms"));
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
  options.grace = std::chrono::milliseconds(*grace_ms);
  options.color = want_color();
  auto outcome = run_cluster(*children, options);
  if (!outcome) return fail(outcome.error().message);
  return outcome->exit_code;
}

}  // namespace tandem::tools
