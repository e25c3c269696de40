// The serving roles of one node: spawns an actor (or service) for every role instance the
// manifest gives the node — executors first (they own the devices and register the KV
// pools), then prefill and decode (each with its executor), routers, gateways.
#pragma once

#include "runtime/node/node.hpp"

namespace tandem::actors {

std::unique_ptr<runtime::NodeServices> make_node_services(const config::Manifest& manifest,
                                                          const std::string& node,
                                                          runtime::NodeEnv& env);

}  // namespace tandem::actors
