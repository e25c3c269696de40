// One node process: the actor system, the bridge to the fabric, the node actor and one actor
// shell per role instance the manifest gives this node, and the admin HTTP endpoint.
#pragma once

#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "runtime/node/bridge.hpp"
#include "runtime/node/supervisor.hpp"
#include "runtime/obs/admin_http.hpp"
#include "runtime/obs/metrics.hpp"

namespace tandem::runtime {

// Runs until SIGINT or SIGTERM. The caller must have blocked both signals in every thread
// (call block_stop_signals() first thing in main, before any thread starts).
// On the signal the node drains first ([supervisor] drain_timeout_ms; 0 skips it): the routers
// stop picking its prefill and decode instances, its gateway refuses new requests, and it
// waits until what it holds has ended or the timeout passed; a second signal ends the wait.
// With [supervisor] device_lost = "restart-node", an executor whose device is lost for good
// (NodeEnv::device_lost) stops the node the same way, unasked: it drains and returns
// kExitDeviceLost, for its supervisor (`tandem up`, systemd's Restart=on-failure) to start it
// again, which reopens the device.
// Returns the process exit code: 0 after a requested stop, 1 on a startup fault (logged),
// kExitDeviceLost (restart_budget.hpp) after a lost device.
int run_node(const config::Manifest& manifest, const std::string& node_name);

// Spawns the actors of one role instance (the serving roles live in actors/, above this
// layer, so `tandem node` passes them in). Returns the spawned actors, or an error that
// stops the node (e.g. the gateway's port is taken). `node_actor` is the node's membership
// and load hub.
struct NodeServices {
  virtual ~NodeServices() = default;
  virtual Status spawn_all(caf::actor_system& system, caf::actor node_actor,
                           std::vector<caf::actor>& actors) = 0;
  virtual void stop() = 0;  // before actors exit: stop accepting outside work (HTTP)
  // A graceful stop begins: refuse new outside work (the gateway's 503 shutting_down) while
  // what was taken goes on. Main thread.
  virtual void begin_drain() {}
  // Outside requests taken and not answered yet (the gateway's open responses). Any thread.
  virtual uint64_t open_requests() const { return 0; }
};
// What run_node built, handed to the services factory. All outlive the services.
// The services hand every serving actor to `supervisor` (supervise()); `health` says what
// is down (the gateway's /health shows it).
struct NodeEnv {
  Bridge* bridge;
  obs::Registry* metrics;
  std::shared_ptr<spdlog::logger> log;
  caf::actor supervisor;
  std::shared_ptr<NodeHealth> health;
  // A prefill or decode instance says its executor's device is lost for good (once per
  // instance; any thread): /health on the admin port says so, and with [supervisor]
  // device_lost = "restart-node" the node drains and exits (run_node).
  std::function<void(const std::string& instance, const std::string& reason)> device_lost;
};
struct NodeOptions {
  // More routes for the admin HTTP endpoint (tools' status page); each handler runs on the
  // admin server's thread and must outlive the node.
  std::vector<obs::AdminRoute> admin_routes;
  // TEST HOOKS: the admin command `debug-crash ACTOR` (supervisor.hpp). Off in production;
  // `tandem node --test-hooks` turns it on. Never reachable from the HTTP API.
  bool test_hooks = false;
};
using ServicesFactory =
    std::function<std::unique_ptr<NodeServices>(const config::Manifest& manifest,
                                                const std::string& node, NodeEnv& env)>;
int run_node(const config::Manifest& manifest, const std::string& node_name,
             const ServicesFactory& services, NodeOptions options = {});

void block_stop_signals();

}  // namespace tandem::runtime
