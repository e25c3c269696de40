// The node actor ("NODE/node/"): membership (hello, heartbeats, up/down events), ping, and
// the admin commands the shell sends. Runs on the node's CAF actor system; all of its state
// lives in its `state` and is touched only by its handlers.
#pragma once

#include <caf/all.hpp>

#include <functional>
#include <string>

#include "config/manifest.hpp"
#include "runtime/node/bridge.hpp"

namespace tandem::runtime {

struct NodeActorDeps {
  const config::Manifest* manifest;  // outlives the actor
  Bridge* bridge;                    // outlives the actor
  std::shared_ptr<spdlog::logger> log;
  std::function<std::string()> render_metrics;  // Prometheus text of this node; thread-safe
  std::function<void(int64_t up, int64_t total)> on_peers_changed;  // for the peers_up gauge
  // TEST HOOK: set only with NodeOptions::test_hooks; then the admin command
  // `debug-crash ACTOR` asks this supervisor to crash ACTOR (supervisor.hpp: DebugCrash).
  caf::actor test_hooks_supervisor;
};

// Spawns the node actor and registers it as NODE/node/. Subscribers (send
// `atoms::subscribe` with an actor) first get an `up` for every peer already up and the last
// InstanceLoadReport of every local instance, then every MembershipEvent and every
// InstanceLoadReport.
caf::actor spawn_node_actor(caf::actor_system& system, NodeActorDeps deps);

// Spawns the actor shell for one role instance and registers it as NODE/role/instance.
// Until a role's serving behaviour lands, its shell answers ping and `describe`.
caf::actor spawn_role_actor(caf::actor_system& system, Bridge* bridge,
                            const config::Instance& instance);

// Answers a Ping envelope addressed to `self` with a Pong. Any actor may use it.
void answer_ping(Bridge* bridge, const messages::ActorName& self, wire::Envelope::Reader envelope);

// Formats a duration for humans: "850ms", "12.4s", "3m05s", "2h10m".
std::string format_age(std::chrono::milliseconds age);

}  // namespace tandem::runtime
