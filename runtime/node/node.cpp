#include "runtime/node/node.hpp"

#include <caf/all.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <random>

#include "runtime/node/bridge.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"

namespace tandem::runtime {

void block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

namespace {

std::shared_ptr<spdlog::logger> node_logger(const std::string& node, const std::string& level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto log = std::make_shared<spdlog::logger>(node, sink);
  log->set_pattern("%Y-%m-%d %H:%M:%S.%e [%n] %l: %v");
  log->set_level(spdlog::level::from_str(level));
  log->flush_on(spdlog::level::info);
  return log;
}

uint64_t new_incarnation() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd() ^
         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}

int wait_for_stop_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

}  // namespace

int run_node(const config::Manifest& manifest, const std::string& node_name) {
  const config::Node* node = manifest.find_node(node_name);
  RT_ASSERT(node != nullptr, node_name);
  auto log = node_logger(node_name, manifest.logging.level);
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::tandem>();
  cfg.set("scheduler.max-threads", 2);
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system system{cfg};
  Bridge bridge(manifest, node_name, new_incarnation(), log);
  if (Status started = bridge.start(); !started.ok()) {
    log->error("cannot start: {}", started.error().describe());
    return 1;
  }
  std::vector<caf::actor> actors;
  NodeActorDeps deps{&manifest, &bridge, log, nullptr, nullptr};
  actors.push_back(spawn_node_actor(system, std::move(deps)));
  for (const auto& instance : node->instances) {
    actors.push_back(spawn_role_actor(system, &bridge, instance));
  }
  log->info("node {} serving {} actor(s); cluster '{}', {} node(s)", node_name, actors.size(),
            manifest.cluster.name, manifest.nodes.size());
  int sig = wait_for_stop_signal();
  log->info("stopping on signal {}", sig);
  bridge.stop();
  for (auto& actor : actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace tandem::runtime
