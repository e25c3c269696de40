// Test support: one node's actor system and bridge, in-process, for tests of actors that talk
// through the bridge (the node actor, shells). The fabric endpoint opens on the manifest's
// address for `node` (give it a free port); peers named in the manifest never answer.
#pragma once

#include <doctest.h>

#include <caf/all.hpp>

#include <memory>
#include <string>
#include <variant>

#include "config/manifest.hpp"
#include "runtime/node/bridge.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/obs/log.hpp"

namespace tandem::testing {

inline config::Manifest parse_manifest_or_fail(const std::string& text) {
  auto parsed = config::parse_manifest(text, "test.toml");
  if (auto* errors = std::get_if<config::ManifestErrors>(&parsed)) FAIL(errors->describe());
  return std::get<config::Manifest>(parsed);
}

inline caf::actor_system_config& tandem_actor_config(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::tandem>();
  cfg.set("logger.verbosity", caf::atom("quiet"));
  return cfg;
}

// Declare after the actor_system, so it is destroyed (and its fabric stopped) first.
struct LocalBridge {
  LocalBridge(const config::Manifest& manifest, const std::string& node) {
    auto made = obs::make_node_logger(node, "warn");
    REQUIRE(made.ok());
    log = *made;
    bridge = std::make_unique<runtime::Bridge>(manifest, node, 1, log);
    Status started = bridge->start();
    REQUIRE_MESSAGE(started.ok(), started.error().describe());
  }
  std::shared_ptr<spdlog::logger> log;
  std::unique_ptr<runtime::Bridge> bridge;
};

}  // namespace tandem::testing
