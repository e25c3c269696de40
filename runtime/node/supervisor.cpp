#include "runtime/node/supervisor.hpp"

#include <chrono>
#include <vector>

#include "runtime/base/assert.hpp"

namespace tandem::runtime {

void NodeHealth::set_down(const std::string& name, std::string reason) {
  RT_ASSERT(!name.empty());
  RT_ASSERT(!reason.empty(), name);
  std::lock_guard<std::mutex> lock(mu_);
  down_[name] = std::move(reason);
}

void NodeHealth::set_up(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  down_.erase(name);
}

bool NodeHealth::whole() const {
  std::lock_guard<std::mutex> lock(mu_);
  return down_.empty();
}

std::string NodeHealth::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, why] : down_) {
    if (!out.empty()) out += "; ";
    out += name + " is down (" + why + ")";
  }
  return out;
}

void NodeHealth::set_device_lost(const std::string& instance, std::string reason) {
  RT_ASSERT(!instance.empty());
  RT_ASSERT(!reason.empty(), instance);
  std::lock_guard<std::mutex> lock(mu_);
  lost_.emplace(instance, std::move(reason));
}

std::string NodeHealth::devices_lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [instance, why] : lost_) {
    if (!out.empty()) out += "; ";
    out += instance + ": " + why;
  }
  return out;
}

namespace {

struct RestartChild {
  size_t index = 0;
};

}  // namespace
}  // namespace tandem::runtime

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::runtime::RestartChild)

namespace tandem::runtime {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  Supervised spec;
  RestartBudget budget;
  caf::actor_addr current;  // empty while down
  obs::Counter* crashes;
  obs::Counter* restarts;
};

struct SupervisorState {
  SupervisorDeps deps;
  std::vector<Child> children;  // <= SupervisorDeps::children_max
  std::map<caf::actor_addr, size_t> by_addr;
  // The children's slots again, for stopping them at exit (the functor must not read state).
  std::shared_ptr<std::vector<std::shared_ptr<ActorSlot>>> slots;
  static inline const char* name = "tandem.supervisor";
};

using SupervisorActor = caf::stateful_actor<SupervisorState>;

void watch(SupervisorActor* self, size_t index, const caf::actor& actor) {
  auto& st = self->state;
  RT_ASSERT(index < st.children.size(), index);
  RT_ASSERT(static_cast<bool>(actor), st.children[index].spec.name);
  st.children[index].current = actor.address();
  st.children[index].spec.slot->set(actor);
  st.by_addr[actor.address()] = index;
  self->monitor(actor);
}

void on_down(SupervisorActor* self, const caf::down_msg& down) {
  auto& st = self->state;
  auto it = st.by_addr.find(down.source);
  if (it == st.by_addr.end()) return;
  size_t index = it->second;
  st.by_addr.erase(it);
  Child& child = st.children[index];
  child.current = caf::actor_addr{};
  if (down.reason == caf::exit_reason::user_shutdown) return;  // the node is stopping
  child.spec.slot->set(caf::actor{});
  child.crashes->inc();
  std::string why = "exited: " + to_string(down.reason);
  if (!child.budget.allow(Clock::now())) {
    const RestartPolicy& p = child.budget.policy();
    std::string stays = why + "; restarted " + std::to_string(p.restarts_max) + " times within " +
                        std::to_string(p.window_ms.count()) +
                        " ms already, so it stays down until the node restarts";
    st.deps.log->error("supervisor: {} {}", child.spec.name, stays);
    st.deps.health->set_down(child.spec.name, stays);
    return;
  }
  st.deps.log->error("supervisor: {} {}; restarting it in {} ms", child.spec.name, why,
                     child.budget.policy().delay_ms.count());
  st.deps.health->set_down(child.spec.name, why + "; restarting");
  self->delayed_send(self, child.budget.policy().delay_ms, RestartChild{index});
}

void restart(SupervisorActor* self, size_t index) {
  auto& st = self->state;
  RT_ASSERT(index < st.children.size(), index);
  Child& child = st.children[index];
  RT_ASSERT(!child.current, "restarting a live actor", child.spec.name);
  caf::actor replacement = child.spec.respawn();
  watch(self, index, replacement);
  child.restarts->inc();
  st.deps.health->set_up(child.spec.name);
  st.deps.log->warn("supervisor: {} restarted ({} restart(s) within {} ms)", child.spec.name,
                    child.budget.recent_count(), child.budget.policy().window_ms.count());
}

void adopt(SupervisorActor* self, Supervised& spec) {
  auto& st = self->state;
  if (st.children.size() >= SupervisorDeps::children_max) {
    st.deps.log->error("supervisor: {} children already; {} is not supervised",
                       SupervisorDeps::children_max, spec.name);
    return;
  }
  RT_ASSERT(spec.slot != nullptr, spec.name);
  RT_ASSERT(static_cast<bool>(spec.respawn), spec.name);
  caf::actor first = spec.slot->get();
  RT_ASSERT(static_cast<bool>(first), "supervising an empty slot", spec.name);
  obs::Labels labels = {{"role", spec.role}};
  auto crashes = st.deps.metrics->counter(
      "tandem:actor_crashes_total", "supervised actors that exited with an error", labels);
  auto restarts = st.deps.metrics->counter(
      "tandem:actor_restarts_total", "supervised actors restarted by the node", labels);
  RT_ASSERT(crashes.ok() && restarts.ok(), spec.role);
  st.slots->push_back(spec.slot);
  st.children.push_back(Child{std::move(spec), RestartBudget(st.deps.policy), {}, *crashes,
                              *restarts});
  watch(self, st.children.size() - 1, first);
}

std::string debug_crash(SupervisorActor* self, const std::string& name) {
  auto& st = self->state;
  for (const Child& child : st.children) {
    if (child.spec.name != name) continue;
    caf::actor actor = child.spec.slot->get();
    if (!actor) return name + " is down already\n";
    st.deps.log->warn("supervisor: TEST HOOK debug-crash: making {} exit with an error", name);
    self->send_exit(actor, caf::make_error(caf::sec::runtime_error, "debug-crash test hook"));
    return "crashed " + name + "\n";
  }
  std::string known;
  for (const Child& child : st.children) known += " " + child.spec.name;
  return "no supervised actor " + name + "; supervised:" + known + "\n";
}

caf::behavior supervisor_behavior(SupervisorActor* self, SupervisorDeps deps) {
  RT_ASSERT(deps.metrics != nullptr);
  RT_ASSERT(deps.health != nullptr);
  self->state.deps = std::move(deps);
  self->set_down_handler([self](caf::down_msg& down) { on_down(self, down); });
  auto slots = std::make_shared<std::vector<std::shared_ptr<ActorSlot>>>();
  self->state.slots = slots;
  self->attach_functor([slots](const caf::error&) {
    for (const auto& slot : *slots) {
      if (caf::actor actor = slot->get()) {
        caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
      }
    }
  });
  return {
      [self](Supervised& spec) { adopt(self, spec); },
      [self](const RestartChild& r) { restart(self, r.index); },
      [self](const DebugCrash& crash) { return debug_crash(self, crash.name); },
  };
}

}  // namespace

caf::actor spawn_supervisor(caf::actor_system& system, SupervisorDeps deps) {
  return system.spawn(supervisor_behavior, std::move(deps));
}

void supervise(const caf::actor& supervisor, Supervised child) {
  RT_ASSERT(static_cast<bool>(supervisor), child.name);
  caf::anon_send(supervisor, std::move(child));
}

}  // namespace tandem::runtime
