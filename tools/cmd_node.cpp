// `tandem node --manifest M --node N`: run one node of a cluster in the foreground.
#include <cstdio>

#include "actors/executor/executor_actor.hpp"
#include "actors/node_services.hpp"
#include "devices/kv_memory.hpp"
#include "runtime/node/node.hpp"
#include "tools/commands.hpp"
#include "tools/status_page.hpp"

namespace tandem::tools {

int cmd_node(cli::Args args) {
  cli::Flags flags("tandem node --manifest MANIFEST --node NAME",
                   "Runs one node of the cluster described by MANIFEST: its fabric endpoint,\n"
                   "its actors (one per role instance the manifest gives it), membership and\n"
                   "its admin endpoint. Stops cleanly on SIGINT or SIGTERM. `tandem up` starts\n"
                   "this for every local node.");
  flags.flag("manifest", "FILE", "the cluster manifest (TOML)")
      .flag("node", "NAME", "which [[node]] of the manifest this process is")
      .flag("test-hooks", "", "TESTS ONLY: answer the admin commands debug-crash and debug-drop-kv-events");
  int code = 0;
  if (!flags.parse(args, &code)) return code;
  if (!flags.has("manifest") || !flags.has("node")) {
    std::fprintf(stderr, "tandem node: --manifest and --node are required\n");
    return 2;
  }
  runtime::block_stop_signals();  // before any thread starts
  auto loaded = config::load_manifest(flags.get("manifest"));
  if (auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    std::fprintf(stderr, "%s", errors->describe().c_str());
    return 1;
  }
  const auto& manifest = std::get<config::Manifest>(loaded);
  if (manifest.find_node(flags.get("node")) == nullptr) {
    std::fprintf(stderr, "tandem node: %s has no node named '%s'\n", flags.get("manifest").c_str(),
                 flags.get("node").c_str());
    return 1;
  }
  // A pool that cannot fit would start and be killed under load: refuse it now.
  const config::Node& node = *manifest.find_node(flags.get("node"));
  if (auto too_big = actors::check_node_kv_memory(manifest, node, devices::host_memory_bytes())) {
    std::fprintf(stderr, "tandem node: %s\n", too_big->c_str());
    return 1;
  }
  runtime::NodeOptions options;
  options.test_hooks = flags.has("test-hooks");
  // The status page: its sampler asks the cluster as an admin client bound to this node's host.
  StatusSampler sampler(manifest, node.host);
  options.admin_routes.push_back(
      {"/status", [] {
         return obs::AdminResponse{200, "text/html; charset=utf-8", status_page_html()};
       }});
  options.admin_routes.push_back(
      {"/status.json", [&sampler] {
         return obs::AdminResponse{200, "application/json", sampler.history_json()};
       }});
  return runtime::run_node(manifest, flags.get("node"), actors::make_node_services, options);
}

}  // namespace tandem::tools
