#include "runtime/node/node.hpp"

#include "runtime/node/credentials.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <caf/all.hpp>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "runtime/node/bridge.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/device_lost_record.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/node_metrics.hpp"
#include "runtime/obs/admin_http.hpp"
#include "runtime/obs/log.hpp"

namespace tandem::runtime {

void block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

namespace {

uint64_t new_incarnation() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd() ^
         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}

// A second SIGINT/SIGTERM within `wait`: the number, or 0.
int poll_stop_signal(std::chrono::milliseconds wait) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  timespec ts{static_cast<time_t>(wait.count() / 1000),
              static_cast<long>((wait.count() % 1000) * 1'000'000)};
  int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

// Set by NodeEnv::device_lost when [supervisor] device_lost = "restart-node". Any thread.
// The first loss decides, against the node's device-lost record (device_lost_record.hpp):
// restart the node, or (its restarts spent) stay up without the device.
class LostDeviceStop {
 public:
  LostDeviceStop(const config::Manifest& manifest, const std::string& node,
                 std::shared_ptr<spdlog::logger> log)
      : record_(device_lost_record_path(manifest.cluster.name, node, manifest.file)),
        max_(manifest.supervisor.device_lost_restarts_max),
        window_ms_(manifest.supervisor.device_lost_window_ms),
        log_(std::move(log)) {}

  void request(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!why_.empty() || !kept_up_.empty()) return;
    std::vector<int64_t> stamps = read_device_lost_record(record_);
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    const bool restart = allow_device_lost_restart(stamps, now, window_ms_, max_);
    if (!restart) {
      kept_up_ =
          "the node restarted " +
          (stamps.size() == 1 ? std::string("once") : std::to_string(stamps.size()) + " times") +
          " within " + std::to_string(window_ms_) +
          " ms for lost devices ([supervisor] "
          "device_lost_restarts_max = " +
          std::to_string(max_) +
          "), so it stays up without this one; fix the device, then restart the node";
      log_->error("{}: {}", why, kept_up_);
      return;
    }
    if (Status st = write_device_lost_record(record_, stamps); !st.ok()) {
      log_->warn(
          "cannot keep the device-lost record ({}): a device lost for good restarts this "
          "node until its supervisor gives up",
          st.error().describe());
    }
    why_ = why;
  }
  // The first lost device ("instance: reason") when it restarts the node, "" while none.
  std::string why() const {
    std::lock_guard<std::mutex> lock(mu_);
    return why_;
  }
  // Why a loss did not restart the node (device_lost_restarts_max reached), "" otherwise.
  std::string kept_up() const {
    std::lock_guard<std::mutex> lock(mu_);
    return kept_up_;
  }

 private:
  const std::string record_;
  const uint32_t max_;
  const int64_t window_ms_;
  std::shared_ptr<spdlog::logger> log_;
  mutable std::mutex mu_;
  std::string why_, kept_up_;
};

// Waits for SIGINT/SIGTERM (returns its number) or a lost device's stop (returns 0).
int wait_for_stop(const LostDeviceStop& lost) {
  while (lost.why().empty()) {
    if (int sig = poll_stop_signal(std::chrono::milliseconds(100)); sig != 0) return sig;
  }
  return 0;
}

// The graceful part of a stop (see run_node): returns once this node holds nothing (twice in a
// row, after two heartbeats so that every router has heard of the drain), at the deadline, or
// on a second signal. Main thread; blocking is fine here.
void drain_node(caf::actor_system& system, caf::actor node_actor, NodeServices* services,
                const config::Manifest& manifest, const config::Node& node,
                const std::shared_ptr<spdlog::logger>& log) {
  using Clock = std::chrono::steady_clock;
  auto timeout = std::chrono::milliseconds(manifest.supervisor.drain_timeout_ms);
  if (timeout.count() == 0) return;
  log->info(
      "draining: routers stop picking this node's instances and its gateway takes no new "
      "requests; waiting up to {} ms for what it holds (a second signal stops at once)",
      timeout.count());
  if (services) services->begin_drain();
  auto started = Clock::now();
  // Routers elsewhere hear of the drain with the next heartbeat: a node with prefill or decode
  // instances waits two before it trusts "empty" (a pick made meanwhile may still arrive).
  bool serves = std::any_of(node.instances.begin(), node.instances.end(), [](const auto& i) {
    return i.role == config::Role::prefill || i.role == config::Role::decode;
  });
  auto settle =
      std::chrono::milliseconds(serves ? 2 * manifest.membership.heartbeat_interval_ms : 0);
  caf::scoped_actor self{system};
  int empty_in_a_row = 0;
  while (true) {
    uint64_t held = 0;
    bool answered = false;
    self->request(node_actor, std::chrono::seconds(1), atoms::drain::value, true)
        .receive([&](uint64_t n) { held = n, answered = true; }, [](const caf::error&) {});
    uint64_t open = services ? services->open_requests() : 0;
    bool empty = answered && held == 0 && open == 0;
    empty_in_a_row = empty ? empty_in_a_row + 1 : 0;
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    if (empty_in_a_row >= 2 && took >= settle) {
      log->info("drained in {} ms", took.count());
      return;
    }
    if (took >= timeout) {
      log->warn(
          "drain timeout ({} ms): stopping with {} request(s) held by its instances and {} "
          "open at its gateway",
          timeout.count(), held, open);
      return;
    }
    if (int sig = poll_stop_signal(std::chrono::milliseconds(100)); sig != 0) {
      log->warn("signal {} while draining: stopping now ({} held, {} open)", sig, held, open);
      return;
    }
  }
}

}  // namespace

int run_node(const config::Manifest& manifest, const std::string& node_name) {
  return run_node(manifest, node_name, nullptr);
}

int run_node(const config::Manifest& manifest, const std::string& node_name,
             const ServicesFactory& make_services, NodeOptions options) {
  const config::Node* node = manifest.find_node(node_name);
  RT_ASSERT(node != nullptr, node_name);
  auto made_log = obs::make_node_logger(node_name, manifest.logging.level);
  RT_ASSERT(made_log.ok(), "the manifest validated the level");
  auto log = *made_log;
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::tandem>();
  cfg.set("scheduler.max-threads", static_cast<size_t>(node->workers_count()));
  // Latency: CAF's idle workers first poll with sleep_for(50 us) for 500 rounds, and a job
  // enqueued from outside the scheduler (the HTTP thread, a detached executor actor) waits
  // for that sleep to end (~60-110 us with timer slack) because only a worker parked on its
  // condition variable is notified. Every request crosses that boundary at least twice and
  // every decode step once more, so skip the sleeping phase: after a short spin an idle
  // worker parks and is woken at once by the enqueue. Parked workers look for work to steal
  // every relaxed-sleep-duration (CAF's default is 10 ms; 1 ms keeps both workers busy
  // under load). docs/benchmarks.md "Serving overhead" has the before/after.
  cfg.set("work-stealing.moderate-poll-attempts", 0);
  cfg.set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(1)});
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system system{cfg};
  obs::Registry registry;
  NodeMetrics metrics(registry, node_name);
  metrics.set_workers(node->workers_count());
  Bridge bridge(manifest, node_name, new_incarnation(), log);
  // The fabric opens first (executors register their KV pools with it); frames are
  // delivered only once every actor is registered (set_ready below).
  if (Status started = bridge.start(); !started.ok()) {
    log->error("cannot start: {}", started.error().describe());
    return 1;
  }
  auto render = [&registry, &metrics, &bridge] {
    if (auto* fabric = bridge.fabric()) metrics.sync(fabric->counters(), bridge.counters());
    return registry.render_prometheus();
  };
  auto health = std::make_shared<NodeHealth>();
  const bool restart_on_loss =
      manifest.supervisor.device_lost == config::DeviceLostAction::restart_node;
  auto lost_stop = std::make_shared<LostDeviceStop>(manifest, node_name, log);
  auto device_lost = [health, lost_stop, restart_on_loss](const std::string& instance,
                                                          const std::string& reason) {
    health->set_device_lost(instance, reason);
    if (restart_on_loss) lost_stop->request(instance + ": " + reason);
  };
  const config::SupervisorSection& sup = manifest.supervisor;
  RestartPolicy policy{sup.restarts_max, std::chrono::milliseconds(sup.restart_window_ms),
                       std::chrono::milliseconds(sup.restart_delay_ms)};
  caf::actor supervisor = spawn_supervisor(system, SupervisorDeps{log, &registry, health, policy});
  std::unique_ptr<obs::AdminHttpServer> admin;
  if (node->admin_port) {
    std::vector<obs::AdminRoute> routes = {
        {"/metrics",
         [render] {
           return obs::AdminResponse{200, "text/plain; version=0.0.4; charset=utf-8", render()};
         }},
        obs::health_route([health, restart_on_loss, lost_stop] {
          std::string why = health->reason();
          if (std::string lost = health->devices_lost(); !lost.empty()) {
            std::string kept_up = lost_stop->kept_up();
            why += (why.empty() ? "" : "; ") + lost +
                   (!kept_up.empty()  ? "; " + kept_up
                    : restart_on_loss ? std::string("; the node drains and restarts ([supervisor] "
                                                    "device_lost = \"restart-node\")")
                                      : std::string("; restart the node to reopen it ([supervisor] "
                                                    "device_lost = \"stay\")"));
          }
          return why.empty() ? obs::HealthStatus{true, "node running"}
                             : obs::HealthStatus{false, why};
        })};
    routes.insert(routes.end(), options.admin_routes.begin(), options.admin_routes.end());
    admin = std::make_unique<obs::AdminHttpServer>(node->admin_host, *node->admin_port, routes);
    if (manifest.admin.http_token_required) {
      auto token = load_key_file(manifest.admin.token_file, KeyRole::admin);
      if (!token.ok()) {
        log->error("cannot start the admin endpoint: {}", token.error().describe());
        return 1;
      }
      admin->require_bearer_token(std::string(token->secret.begin(), token->secret.end()));
    }
    if (Status s = admin->start(); !s.ok()) {
      log->error("cannot start the admin endpoint: {}", s.error().describe());
      return 1;
    }
    log->info("admin endpoint http://{}:{}/metrics{}", node->admin_host, *node->admin_port,
              manifest.admin.http_token_required ? " (the admin token is required)" : "");
  }
  std::vector<caf::actor> actors;
  NodeActorDeps deps{&manifest, &bridge, log, render,
                     [&metrics](int64_t up, int64_t total) { metrics.set_peers(up, total); },
                     options.test_hooks ? supervisor : caf::actor{}};
  metrics.set_peers(0, static_cast<int64_t>(manifest.nodes.size()) - 1);
  caf::actor node_actor = spawn_node_actor(system, std::move(deps));
  actors.push_back(node_actor);
  actors.push_back(supervisor);  // stops the replacements it spawned when it exits
  if (options.test_hooks) log->warn("TEST HOOKS are on (debug-crash, debug-drop-kv-events); not for production");
  NodeEnv env{&bridge, &registry, log, supervisor, health, device_lost};
  std::unique_ptr<NodeServices> services = make_services ? make_services(manifest, node_name, env)
                                                         : nullptr;
  int code = 0;
  if (services) {
    if (Status s = services->spawn_all(system, node_actor, actors); !s.ok()) {
      log->error("cannot start: {}", s.error().describe());
      code = 1;
    }
  } else {
    for (const auto& instance : node->instances) {
      actors.push_back(spawn_role_actor(system, &bridge, instance));
    }
  }
  if (code == 0) {
    bridge.set_ready();
    log->info("node {} serving {} actor(s) on {} worker thread(s); cluster '{}', {} node(s)",
              node_name, actors.size(), node->workers_count(), manifest.cluster.name,
              manifest.nodes.size());
    if (int sig = wait_for_stop(*lost_stop); sig != 0) {
      log->info("stopping on signal {}", sig);
    } else {
      const std::string why = lost_stop->why();
      code = kExitDeviceLost;
      log->error(
          "restarting the node: {} ([supervisor] device_lost = \"restart-node\"); draining, "
          "then exiting with status {} for its supervisor (tandem up, systemd) to start it "
          "again and reopen the device",
          why, code);
      // A device that hangs may hold its thread past any orderly stop: the restart must not
      // wait on it. Past the drain's bound and a grace, the process ends anyway.
      std::thread([bound = std::chrono::milliseconds(manifest.supervisor.drain_timeout_ms) +
                           std::chrono::seconds(30)] {
        std::this_thread::sleep_for(bound);
        std::_Exit(kExitDeviceLost);
      }).detach();
    }
    drain_node(system, node_actor, services.get(), manifest, *node, log);
  }
  if (services) services->stop();
  if (admin) admin->stop();
  for (auto& actor : actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  system.await_all_actors_done();
  services.reset();
  bridge.stop();  // after every actor (and its registered memory) is gone
  return code;
}

}  // namespace tandem::runtime
