// One node process: the actor system, the bridge to the fabric, the node actor and one actor
// shell per role instance the manifest gives this node, and the admin HTTP endpoint.
#pragma once

#include <string>

#include "config/manifest.hpp"

namespace tandem::runtime {

// Runs until SIGINT or SIGTERM. The caller must have blocked both signals in every thread
// (call block_stop_signals() first thing in main, before any thread starts).
// Returns the process exit code: 0 after a requested stop, 1 on a startup fault (logged).
int run_node(const config::Manifest& manifest, const std::string& node_name);

void block_stop_signals();

}  // namespace tandem::runtime
