#include "actors/node_services.hpp"

#include <map>

#include "actors/decode/decode_actor.hpp"
#include "actors/executor/executor_actor.hpp"
#include "actors/gateway/gateway_actor.hpp"
#include "actors/kv_offload/kv_offload_actor.hpp"
#include "actors/prefill/prefill_actor.hpp"
#include "actors/router/router_actor.hpp"
#include "runtime/node/node_actor.hpp"

namespace tandem::actors {
namespace {

class Services final : public runtime::NodeServices {
 public:
  Services(const config::Manifest& manifest, std::string node, runtime::NodeEnv& env)
      : manifest_(manifest), node_(std::move(node)), env_(env) {}

  Status spawn_all(caf::actor_system& system, caf::actor node_actor,
                   std::vector<caf::actor>& actors) override {
    const config::Node* node = manifest_.find_node(node_);
    RT_ASSERT(node != nullptr, node_);
    ShellContext ctx{&manifest_, env_.bridge, env_.log,        env_.metrics,
                     node_actor, env_.health, env_.device_lost};
    std::map<std::string, caf::actor> executors;
    for (const auto& inst : node->instances) {
      if (inst.role != config::Role::executor) continue;
      executors[inst.name] = spawn_executor(system, ctx, inst);
      actors.push_back(executors[inst.name]);
    }
    for (const auto& inst : node->instances) {
      // The serving shells are supervised: a replacement is spawned under the same name.
      std::function<caf::actor()> spawn;
      const config::Instance* one = &inst;  // the manifest outlives the node
      switch (inst.role) {
        case config::Role::executor:
          break;
        case config::Role::prefill:
          spawn = [&system, ctx, one, exec = executors.at(inst.executor)] {
            return spawn_prefill(system, ctx, *one, exec);
          };
          break;
        case config::Role::decode:
          spawn = [&system, ctx, one, exec = executors.at(inst.executor)] {
            return spawn_decode(system, ctx, *one, exec);
          };
          break;
        case config::Role::router:
          spawn = [&system, ctx, one] { return spawn_router(system, ctx, *one); };
          break;
        case config::Role::gateway: {
          auto gateway = start_gateway(system, ctx, inst);
          if (!gateway.ok()) return gateway.error();
          for (const auto& a : (*gateway)->actors()) actors.push_back(a);
          for (auto& s : (*gateway)->supervised()) runtime::supervise(env_.supervisor, s);
          gateways_.push_back(std::move(gateway).value());
          break;
        }
        case config::Role::kv_offload:
          if (manifest_.kv_offload.enabled) {
            if (Status ok = check_tier2_directory(manifest_, node_); !ok.ok()) return ok.error();
          }
          spawn = [&system, ctx, one] { return spawn_kv_offload(system, ctx, *one); };
          break;
      }
      if (spawn) supervise_shell(inst, spawn, actors);
    }
    return {};
  }

  void stop() override {
    for (auto& g : gateways_) g->stop();
  }
  void begin_drain() override {
    for (auto& g : gateways_) g->begin_drain();
  }
  uint64_t open_requests() const override {
    uint64_t open = 0;
    for (const auto& g : gateways_) open += g->open_requests();
    return open;
  }

 private:
  // Spawns a prefill, decode, router or kv-offload shell and hands it to the supervisor.
  void supervise_shell(const config::Instance& inst, const std::function<caf::actor()>& spawn,
                       std::vector<caf::actor>& actors) {
    caf::actor first = spawn();
    actors.push_back(first);
    messages::ActorName name{node_, std::string(config::to_string(inst.role)), inst.name};
    runtime::Bridge* bridge = env_.bridge;
    runtime::supervise(env_.supervisor,
                       {name.to_string(), std::string(config::to_string(inst.role)),
                        [bridge, name, spawn] {
                          bridge->unregister_actor(name);
                          return spawn();
                        },
                        std::make_shared<runtime::ActorSlot>(first)});
  }

  const config::Manifest& manifest_;
  std::string node_;
  runtime::NodeEnv& env_;
  std::vector<std::unique_ptr<GatewayService>> gateways_;
};

}  // namespace

std::unique_ptr<runtime::NodeServices> make_node_services(const config::Manifest& manifest,
                                                          const std::string& node,
                                                          runtime::NodeEnv& env) {
  return std::make_unique<Services>(manifest, node, env);
}

}  // namespace tandem::actors
