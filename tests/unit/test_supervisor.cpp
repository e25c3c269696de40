// The node's supervisor: its restart budget (pure), NodeHealth, and the actor itself on a
// real actor system — a child that exits with an error is replaced after the delay, under
// the same slot, the node is marked down meanwhile and whole after; a crash loop beyond the
// budget leaves the child down and says so; a user_shutdown exit is not a crash.
#include <doctest.h>

#include <atomic>
#include <caf/all.hpp>
#include <chrono>

#include "runtime/node/caf_types.hpp"
#include "runtime/node/device_lost_record.hpp"
#include "runtime/node/spawn.hpp"
#include "runtime/node/supervisor.hpp"
#include "runtime/obs/log.hpp"
#include "tests/support/process.hpp"

using namespace tandem;
using namespace tandem::runtime;
using namespace std::chrono_literals;

TEST_CASE("supervisor: the restart budget allows restarts_max per window, then refuses") {
  RestartBudget budget(RestartPolicy{3, 1000ms, 10ms});
  RestartBudget::Clock::time_point t0{};
  CHECK(budget.allow(t0));
  CHECK(budget.allow(t0 + 100ms));
  CHECK(budget.allow(t0 + 200ms));
  CHECK(budget.recent_count() == 3);
  CHECK_FALSE(budget.allow(t0 + 300ms));  // the fourth within a second: refused
  CHECK_FALSE(budget.allow(t0 + 999ms));
  CHECK(budget.allow(t0 + 1000ms));  // the first left the window
  CHECK(budget.recent_count() == 3);
  CHECK(budget.allow(t0 + 5000ms));  // all left: a fresh window
  CHECK(budget.recent_count() == 1);
}

TEST_CASE("supervisor: NodeHealth names every actor that is down") {
  NodeHealth health;
  CHECK(health.whole());
  CHECK(health.reason().empty());
  health.set_down("n/router/r", "exited: boom; restarting");
  health.set_down("n/decode/d", "exited: x; restarting");
  CHECK_FALSE(health.whole());
  CHECK(health.reason() == "n/decode/d is down (exited: x; restarting); n/router/r is down "
                           "(exited: boom; restarting)");
  health.set_up("n/decode/d");
  health.set_up("n/router/r");
  CHECK(health.whole());
}

TEST_CASE(
    "supervisor: NodeHealth keeps each instance's first device-lost reason, apart from "
    "what is down") {
  NodeHealth health;
  CHECK(health.devices_lost().empty());
  health.set_device_lost("n/prefill/p", "executor device lost: rbln prefill timed out");
  health.set_device_lost("n/prefill/p", "executor device lost: a later reason");
  health.set_device_lost("n/decode/d", "executor device lost: rbln_memcpy failed");
  CHECK(health.devices_lost() ==
        "n/decode/d: executor device lost: rbln_memcpy failed; n/prefill/p: executor device "
        "lost: rbln prefill timed out");
  // The gateway's reason (actors down) does not include them: a node may still serve.
  CHECK(health.whole());
  CHECK(health.reason().empty());
}

namespace {

struct Fixture {
  caf::actor_system_config cfg;
  obs::Registry registry;  // outlives the actor system (its actors may still use it)
  caf::actor_system system{cfg};
  std::shared_ptr<NodeHealth> health = std::make_shared<NodeHealth>();
  std::atomic<int> spawned{0};

  caf::actor spawn_child() {
    ++spawned;
    return runtime::spawn_fn(system, [](caf::event_based_actor*) -> caf::behavior {
      return {[](int x) { return x + 1; }};
    });
  }
  uint64_t counter(const std::string& name, const std::string& role) {
    auto c = registry.counter(name, "", {{"role", role}});
    REQUIRE(c.ok());
    return (*c)->value();
  }
};

}  // namespace

TEST_CASE("supervisor: a crashed child is replaced after the delay; the node is whole again") {
  Fixture f;
  auto log = obs::make_node_logger("t", "error");
  REQUIRE(log.ok());
  caf::actor sup = spawn_supervisor(
      f.system, SupervisorDeps{*log, &f.registry, f.health, RestartPolicy{2, 60'000ms, 300ms}});
  auto slot = std::make_shared<ActorSlot>(f.spawn_child());
  caf::actor first = slot->get();
  supervise(sup, {"t/router/r", "router", [&f] { return f.spawn_child(); }, slot});
  caf::scoped_actor self{f.system};
  auto crash = [&] {
    std::string text;
    self->request(sup, 2s, DebugCrash{"t/router/r"})
        .receive([&](const std::string& t) { text = t; }, [](caf::error&) {});
    return text;
  };
  CHECK(crash() == "crashed t/router/r\n");
  // Down and named in the health until the replacement is up (300 ms later).
  CHECK(testing::eventually(1000ms, [&] { return !f.health->whole(); }));
  CHECK(f.health->reason().find("t/router/r is down (exited: ") != std::string::npos);
  CHECK(testing::eventually(3000ms, [&] { return f.health->whole() && slot->get(); }));
  CHECK(slot->get() != first);
  CHECK(f.spawned == 2);
  CHECK(f.counter("tandem:actor_crashes_total", "router") == 1);
  CHECK(f.counter("tandem:actor_restarts_total", "router") == 1);
  // The replacement serves.
  int answer = 0;
  self->request(slot->get(), 2s, 41).receive([&](int x) { answer = x; }, [](caf::error&) {});
  CHECK(answer == 42);
  // A second crash is restarted too; the third within the window is beyond the budget.
  CHECK(crash() == "crashed t/router/r\n");
  CHECK(testing::eventually(3000ms, [&] { return f.spawned == 3 && f.health->whole(); }));
  CHECK(testing::eventually(1000ms, [&] { return static_cast<bool>(slot->get()); }));
  CHECK(crash() == "crashed t/router/r\n");
  CHECK(testing::eventually(1000ms, [&] {
    return f.health->reason().find("stays down until the node restarts") != std::string::npos;
  }));
  std::this_thread::sleep_for(500ms);
  CHECK(f.spawned == 3);
  CHECK_FALSE(static_cast<bool>(slot->get()));
  CHECK(crash() == "t/router/r is down already\n");
  CHECK(f.counter("tandem:actor_crashes_total", "router") == 3);
  CHECK(f.counter("tandem:actor_restarts_total", "router") == 2);
  self->send_exit(sup, caf::exit_reason::user_shutdown);
}

TEST_CASE("supervisor: a user_shutdown exit is not a crash; the supervisor's exit stops all") {
  Fixture f;
  auto log = obs::make_node_logger("t", "error");
  REQUIRE(log.ok());
  caf::actor sup = spawn_supervisor(
      f.system, SupervisorDeps{*log, &f.registry, f.health, RestartPolicy{2, 60'000ms, 50ms}});
  auto a = std::make_shared<ActorSlot>(f.spawn_child());
  auto b = std::make_shared<ActorSlot>(f.spawn_child());
  supervise(sup, {"t/decode/a", "decode", [&f] { return f.spawn_child(); }, a});
  supervise(sup, {"t/decode/b", "decode", [&f] { return f.spawn_child(); }, b});
  caf::scoped_actor self{f.system};
  caf::actor b_actor = b->get();
  self->monitor(b_actor);
  self->send_exit(a->get(), caf::exit_reason::user_shutdown);
  std::this_thread::sleep_for(300ms);
  CHECK(f.spawned == 2);
  CHECK(f.health->whole());
  self->send_exit(sup, caf::exit_reason::user_shutdown);
  bool b_down = false;
  self->receive([&](const caf::down_msg& d) { b_down = d.source == b_actor.address(); },
                caf::after(2s) >> [] {});
  CHECK(b_down);
}

TEST_CASE(
    "device-lost record: a node restarts for lost devices at most device_lost_restarts_max times "
    "in the window, kept in a file across processes; a damaged file counts as empty") {
  using tandem::runtime::allow_device_lost_restart;
  std::vector<int64_t> stamps;
  // Three restarts allowed in a 10 s window; the fourth loss within it stays up.
  CHECK(allow_device_lost_restart(stamps, 1000, 10000, 3));
  CHECK(allow_device_lost_restart(stamps, 2000, 10000, 3));
  CHECK(allow_device_lost_restart(stamps, 3000, 10000, 3));
  CHECK_FALSE(allow_device_lost_restart(stamps, 4000, 10000, 3));
  CHECK(stamps == std::vector<int64_t>{1000, 2000, 3000});  // a refusal records nothing
  // Once the first leaves the window, one more restart is allowed.
  CHECK(allow_device_lost_restart(stamps, 11001, 10000, 3));
  CHECK(stamps == std::vector<int64_t>{2000, 3000, 11001});
  // Stamps from the future (a clock set back) do not count; the kept list never exceeds max.
  std::vector<int64_t> skewed{50000, 60000, 5, 6, 7, 8};
  CHECK_FALSE(allow_device_lost_restart(skewed, 10, 100, 3));
  CHECK(skewed.size() == 3);

  // The file: written, read back, damaged lines skipped.
  std::string dir = tandem::testing::make_temp_dir("device-lost");
  ::setenv("STATE_DIRECTORY", dir.c_str(), 1);
  std::string path = tandem::runtime::device_lost_record_path("c", "n1", "/etc/t/m.toml");
  CHECK(path.rfind(dir + "/c-n1-", 0) == 0);
  CHECK(path != tandem::runtime::device_lost_record_path("c", "n1", "/etc/t/other.toml"));
  ::unsetenv("STATE_DIRECTORY");
  CHECK(tandem::runtime::read_device_lost_record(path).empty());  // none yet
  REQUIRE(tandem::runtime::write_device_lost_record(path, {7, 8, 9}).ok());
  CHECK(tandem::runtime::read_device_lost_record(path) == std::vector<int64_t>{7, 8, 9});
  tandem::testing::write_file(path, "12\nnot a number\n\n99999999999999999999999\n13 \n14\n");
  CHECK(tandem::runtime::read_device_lost_record(path) == std::vector<int64_t>{12, 14});
  // A record grown past its bound: the last kRecordStampsMax stamps are kept.
  std::string long_record;
  for (int i = 0; i < 1200; ++i) long_record += std::to_string(i) + "\n";
  auto kept = tandem::runtime::parse_device_lost_record(long_record);
  REQUIRE(kept.size() == tandem::runtime::kRecordStampsMax);
  CHECK(kept.front() == 200);
  CHECK(kept.back() == 1199);
  // A directory that cannot be made: the error names it.
  auto bad = tandem::runtime::write_device_lost_record(path + "/x/y", {1});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("cannot create " + path + "/x") == 0);
}
