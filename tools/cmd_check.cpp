// `tandem check MANIFEST`: validate a cluster manifest and print its summary.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <variant>
#include <vector>

#include "actors/executor/executor_actor.hpp"
#include "config/manifest.hpp"
#include "devices/kv_memory.hpp"
#include "devices/rbln/rbln_device.hpp"
#include "runtime/node/credentials.hpp"
#include "tools/commands.hpp"
#include "tools/local_host.hpp"

namespace tandem::tools {

namespace {

// Prints each node's KV pool bytes; a node on this host whose pools do not fit its memory is
// an error (`tandem node` would refuse to start it). Returns the exit code.
int check_kv_memory(const config::Manifest& manifest) {
  const HostIdentity self = this_host();
  const uint64_t memory_bytes = devices::host_memory_bytes();
  int exit_code = 0;
  std::vector<devices::KvPoolUse> local_pools;  // of every node on this host: `tandem up`'s
  std::string local_names;
  for (const config::Node& node : manifest.nodes) {
    uint64_t total = 0;
    for (const config::Instance& instance : node.instances) {
      if (instance.role != config::Role::executor) continue;
      auto bytes = devices::kv_pool_host_bytes(actors::device_spec(manifest, instance));
      if (bytes.ok()) total += *bytes;
    }
    bool local = is_local_host(node.host, self);
    if (total > 0) {
      std::printf("kv pools  node %s: %s%s\n", node.name.c_str(),
                  devices::describe_bytes(total).c_str(), local ? " (this host)" : "");
    }
    if (!local) continue;
    if (auto too_big = actors::check_node_kv_memory(manifest, node, memory_bytes)) {
      std::fprintf(stderr, "%s: %s\n", manifest.file.c_str(), too_big->c_str());
      exit_code = 1;
    }
    auto pools = actors::node_kv_pools(manifest, node, true);
    local_pools.insert(local_pools.end(), pools.begin(), pools.end());
    local_names += (local_names.empty() ? "" : ", ") + node.name;
  }
  if (exit_code != 0) return exit_code;  // a node alone is too big: said above
  if (auto too_big = devices::check_kv_pools_fit("this host's nodes " + local_names, local_pools,
                                                 memory_bytes)) {
    std::fprintf(stderr, "%s: %s (`tandem up` starts them together)\n", manifest.file.c_str(),
                 too_big->c_str());
    exit_code = 1;
  }
  return exit_code;
}

// Probes each rbln executor of this host's nodes (library, symbols, compiled directory against
// the manifest) as its executor would at start. Returns the exit code.
int check_rbln(const config::Manifest& manifest) {
  const HostIdentity self = this_host();
  int exit_code = 0;
  for (const config::Node& node : manifest.nodes) {
    for (const config::Instance& instance : node.instances) {
      if (instance.role != config::Role::executor || instance.device != config::DeviceKind::rbln) {
        continue;
      }
      if (!is_local_host(node.host, self)) {
        std::printf("rbln      %s/%s: not probed (node %s is not this host)\n", node.name.c_str(),
                    instance.name.c_str(), node.host.c_str());
        continue;
      }
      auto probed = devices::rbln::probe_rbln(actors::device_spec(manifest, instance));
      if (probed.ok()) {
        std::printf("rbln      %s/%s: %s\n", node.name.c_str(), instance.name.c_str(),
                    probed->c_str());
      } else {
        std::fprintf(stderr, "%s: rbln executor %s/%s: %s\n", manifest.file.c_str(),
                     node.name.c_str(), instance.name.c_str(), probed.error().message.c_str());
        exit_code = 1;
      }
    }
  }
  return exit_code;
}

// The fabric's key and the planes' listen addresses: the key files named are checked as a
// node would load them (a bad mode is an error; a file not on this host yet, a warning), and
// a plane that listens on every interface is a warning. Returns the exit code.
int check_security(const config::Manifest& manifest) {
  int exit_code = 0;
  auto check_file = [&](const std::string& path, runtime::KeyRole role, const char* what) {
    if (::access(path.c_str(), F_OK) != 0) {
      std::printf("security  %s %s: not on this host (copy it here before starting a node)\n",
                  what, path.c_str());
      return;
    }
    auto key = runtime::load_key_file(path, role);
    if (!key.ok()) {
      std::fprintf(stderr, "%s: %s\n", manifest.file.c_str(), key.error().message.c_str());
      exit_code = 1;
      return;
    }
    std::printf("security  %s %s (key id %08x)\n", what, path.c_str(), key->id());
  };
  if (manifest.cluster.key_file.empty()) {
    std::printf("security  cluster key: none named; one host, so each node, up and shell use %s "
                "(made on first use, mode 0600)\n",
                runtime::auto_key_path(manifest).c_str());
  } else {
    check_file(manifest.cluster.key_file, runtime::KeyRole::cluster, "cluster key");
  }
  for (const auto& file : manifest.cluster.accept_key_files) {
    check_file(file, runtime::KeyRole::cluster, "also accepted");
  }
  if (!manifest.admin.token_file.empty()) {
    check_file(manifest.admin.token_file, runtime::KeyRole::admin, "admin token");
  }
  for (const auto& node : manifest.nodes) {
    for (auto [plane, host] : {std::pair{"api", &node.api_host}, std::pair{"fabric", &node.fabric_host},
                               std::pair{"admin", &node.admin_host}}) {
      if (config::is_wildcard_host(*host)) {
        std::fprintf(stderr, "%s: warning: node %s's %s plane listens on every interface (%s)\n",
                     manifest.file.c_str(), node.name.c_str(), plane, host->c_str());
      }
    }
  }
  return exit_code;
}

}  // namespace

int cmd_check(cli::Args args) {
  cli::Flags flags(
      "tandem check MANIFEST",
      "Parses and validates a cluster manifest (TOML; every key is documented in\n"
      "docs/manifest.md). On success prints a one-screen summary (cluster, fabric, model,\n"
      "and a table of nodes with their addresses and instances by role) to stdout and exits\n"
      "0. Otherwise prints every problem found, one per line as\n"
      "`file:line:column: key: message`, to stderr and exits 1. Then prints each node's KV\n"
      "pool bytes; a node on this host whose pools do not fit its memory (with a margin), or\n"
      "all of this host's nodes together (as `tandem up` starts them), is an error too\n"
      "(`tandem node` / `tandem up` refuse to start), exit 1. Executors with device\n"
      "\"rbln\" on this host are probed as they would start: the runtime library and its\n"
      "symbols, and the compiled model directory against the manifest (docs/rbln.md); a\n"
      "failure is printed and exits 1. A bad command line exits 2.");
  flags.positional("MANIFEST", "path of the cluster manifest, e.g. config/examples/local.toml");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  auto loaded = config::load_manifest(flags.get("MANIFEST"));
  if (const auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    for (const auto& issue : errors->issues) {
      std::fprintf(stderr, "%s\n", issue.describe().c_str());
    }
    return 1;
  }
  const auto& manifest = std::get<config::Manifest>(loaded);
  std::fputs(config::summarize(manifest).c_str(), stdout);
  int kv = check_kv_memory(manifest);
  int rbln = check_rbln(manifest);
  int security = check_security(manifest);
  return kv != 0 ? kv : rbln != 0 ? rbln : security;
}

}  // namespace tandem::tools
