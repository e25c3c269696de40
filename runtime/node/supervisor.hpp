// The node's supervisor: restarts the node's serving actors when they die (one_for_one).
//
// Every serving actor of the node (router, prefill, decode, the gateway actor and its
// preparers) is given to the supervisor with a function that spawns a replacement and
// registers it under the same name, and an ActorSlot through which its senders find the
// current actor. When a supervised actor exits with any reason but user_shutdown, the
// supervisor logs it, counts it (tandem:actor_crashes_total{role}), clears the slot and
// marks the actor down in NodeHealth (so /health answers 503 naming it); after
// RestartPolicy::delay_ms (manifest [supervisor]) it spawns the replacement, counts tandem:actor_restarts_total{role}
// and marks it up again. Beyond restarts_max restarts within window_ms the actor stays down
// (logged as an error; /health says so) until the node is restarted.
// Threads: NodeHealth and ActorSlot are thread-safe (read by the HTTP thread); the
// supervisor's state is its own.
#pragma once

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/node/restart_budget.hpp"
#include "runtime/obs/metrics.hpp"

namespace tandem::runtime {

// What is down on this node, for /health. Thread-safe.
class NodeHealth {
 public:
  void set_down(const std::string& name, std::string reason);
  void set_up(const std::string& name);
  bool whole() const;
  // "" when whole, else "local/router/router is down (...); ..." (every actor down, by name).
  std::string reason() const;
  // An instance whose executor's device is lost for good (ExecWatch::lose). Only the admin
  // endpoint's /health reads it: the gateway already sees the instance not ready through its
  // router, and a node whose prefill device is lost may still serve (decode prefills itself).
  // The first reason per instance stays; at most one entry per instance.
  void set_device_lost(const std::string& instance, std::string reason);
  // "" when none, else "decode/decode/decode: executor device lost: ...; ...".
  std::string devices_lost() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> down_;  // name -> why; at most the supervised actors
  std::map<std::string, std::string> lost_;  // instance -> why; at most the node's instances
};

// The current actor of one supervised name; empty while it is down. Thread-safe.
class ActorSlot {
 public:
  explicit ActorSlot(caf::actor actor = {}) : actor_(std::move(actor)) {}
  caf::actor get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return actor_;
  }
  void set(caf::actor actor) {
    std::lock_guard<std::mutex> lock(mu_);
    actor_ = std::move(actor);
  }

 private:
  mutable std::mutex mu_;
  caf::actor actor_;
};

struct Supervised {
  std::string name;  // for logs, /health and debug-crash: "local/router/router"
  std::string role;  // the metrics label: "router", "gateway", "gateway-preparer", ...
  // Spawns a replacement and registers it under the name (runs in the supervisor).
  std::function<caf::actor()> respawn;
  std::shared_ptr<ActorSlot> slot;  // holds the first actor when handed over
};

struct SupervisorDeps {
  std::shared_ptr<spdlog::logger> log;
  obs::Registry* metrics;  // outlives the supervisor
  std::shared_ptr<NodeHealth> health;
  RestartPolicy policy;
  static constexpr size_t children_max = 4096;
};

// Spawns the supervisor. At its own exit it stops every actor it supervises (user_shutdown).
caf::actor spawn_supervisor(caf::actor_system& system, SupervisorDeps deps);

// Hands `child` to the supervisor (asynchronous; a child that died already is restarted).
void supervise(const caf::actor& supervisor, Supervised child);

// TEST HOOK (admin command `debug-crash`, only on nodes started with --test-hooks): makes
// the supervised actor `name` exit with an error, as if a handler had failed. The supervisor
// answers the request with a line of text: what it did, or that no such actor is supervised.
struct DebugCrash {
  std::string name;
};

}  // namespace tandem::runtime

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::runtime::Supervised)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::runtime::DebugCrash)
