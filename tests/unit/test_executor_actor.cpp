// The executor actor over a sim device: a modelled pass (time_factor > 0) is answered at its
// modelled end, passes asked for back to back end one after another, and the actor holds no
// thread meanwhile (it answers other messages while a pass is pending). Timing runs on CAF's
// test coordinator: virtual time, advanced by the test, so nothing depends on the machine's
// speed or load.
#include <doctest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/executor/executor_actor.hpp"
#include "runtime/node/spawn.hpp"
#include "tests/support/local_bridge.hpp"
#include "tests/support/process.hpp"
#include "tests/support/sim_cluster.hpp"

using namespace tandem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// The tests' one-node sim cluster (tests/support/sim_cluster.hpp) with every pass modelled
// to take at least STEP_US microseconds (the sim's fixed per-step overhead).
std::string manifest_text(double time_factor, int step_us) {
  std::string text = testing::one_node_sim_manifest("exec-actor", testing::free_port());
  std::string from = "time_factor = 0\n";
  auto at = text.find(from);
  RT_ASSERT(at != std::string::npos, "the support manifest sets time_factor");
  text.replace(at, from.size(), "time_factor = " + std::to_string(time_factor) +
                                    "\nstep_overhead_us = " + std::to_string(step_us) + "\n");
  return text;
}

// The executor in an actor system on CAF's test coordinator (scheduler.policy = testing):
// no worker threads, messages run when the test calls run(), and time moves only when the
// test advances it.
struct Harness {
  explicit Harness(double time_factor, int step_us)
      : manifest(testing::parse_manifest_or_fail(manifest_text(time_factor, step_us))),
        system(testing_config(cfg)),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(system.scheduler())),
        local(manifest, "local") {
    actors::ShellContext ctx{&manifest, local.bridge.get(), local.log, &registry, {}};
    executor = actors::spawn_executor(system, ctx, *manifest.find_executor("ed"));
    sched.run();
    local.bridge->set_ready();
  }
  // The executor's KV registration must end before the bridge's fabric does (as in a node).
  ~Harness() {
    caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
    sched.run();
  }
  static caf::actor_system_config& testing_config(caf::actor_system_config& c) {
    testing::tandem_actor_config(c);
    c.set("scheduler.policy", caf::atom("testing"));
    return c;
  }
  Clock::time_point now() const { return sched.clock().now(); }

  config::Manifest manifest;
  caf::actor_system_config cfg;
  caf::actor_system system;
  caf::scheduler::test_coordinator& sched;
  testing::LocalBridge local;
  obs::Registry registry;
  caf::actor executor;
};

// What a client of the executor saw: each answer and the virtual time it arrived.
struct Answers {
  std::optional<Clock::time_point> info_at, first_at, second_at;
  std::optional<actors::ExecResult> first, second;
};

actors::ExecBatch prefill_batch(uint64_t seq) {
  auto batch = std::make_shared<std::vector<devices::PrefillSeq>>();
  batch->push_back({seq, {static_cast<uint32_t>(seq)}, 0, {1, 2, 3}});
  return {actors::ExecKind::prefill, batch, nullptr};
}

// Asks the executor for prefill pass `seq`; records the answer and the virtual time it came,
// as the first or the second answer.
void ask_pass(caf::event_based_actor* self, const caf::actor& exec, uint64_t seq,
              std::shared_ptr<Answers> seen, bool second) {
  self->request(exec, caf::infinite, actors::atoms::exec_run::value, prefill_batch(seq))
      .then([=](const actors::ExecResult& r) {
        (second ? seen->second_at : seen->first_at) = self->clock().now();
        (second ? seen->second : seen->first) = r;
      });
}

}  // namespace

TEST_CASE("executor over sim, time_factor 1: answers at the modelled end, one pass at a time, "
          "without holding a thread") {
  constexpr double step_s = 0.060;  // the modelled pass: dominated by the fixed overhead
  Harness h(1.0, static_cast<int>(step_s * 1e6));
  auto seen = std::make_shared<Answers>();
  auto t0 = h.now();
  auto exec = h.executor;
  runtime::spawn_fn(h.system, [seen, exec](caf::event_based_actor* self) {
    ask_pass(self, exec, 1, seen, false);
    ask_pass(self, exec, 2, seen, true);
    self->request(exec, caf::infinite, actors::atoms::exec_info::value)
        .then([=](const actors::ExecInfo& info) {
          CHECK_MESSAGE(info.ok, info.error);
          seen->info_at = self->clock().now();
        });
  });
  h.sched.run();
  // Both passes are pending and the executor answered exec_info at once: no thread is held,
  // and no virtual time has passed.
  REQUIRE(seen->info_at.has_value());
  CHECK(*seen->info_at == t0);
  CHECK_FALSE(seen->first.has_value());
  CHECK_FALSE(seen->second.has_value());

  // Just before the first pass's modelled end nothing is answered; at its end, the first.
  h.sched.advance_time(std::chrono::microseconds(static_cast<int>(step_s * 1e6) - 1));
  h.sched.run();
  CHECK_FALSE(seen->first.has_value());
  while (!seen->first.has_value() && h.sched.clock().has_pending_timeout()) {
    h.sched.trigger_timeout();
    h.sched.run();
  }
  REQUIRE(seen->first.has_value());
  REQUIRE_MESSAGE(seen->first->ok, seen->first->error);
  REQUIRE(seen->first->output->seqs.size() == 1);
  CHECK(seen->first->output->seqs[0].seq_id == 1);
  Clock::time_point ready_first = seen->first->output->ready_at;
  CHECK(*seen->first_at == ready_first);  // answered at its modelled end, not before
  CHECK(ready_first - t0 >= std::chrono::microseconds(static_cast<int>(step_s * 1e6)));
  CHECK_FALSE(seen->second.has_value());  // the device runs one pass at a time

  while (!seen->second.has_value() && h.sched.clock().has_pending_timeout()) {
    h.sched.trigger_timeout();
    h.sched.run();
  }
  REQUIRE(seen->second.has_value());
  REQUIRE_MESSAGE(seen->second->ok, seen->second->error);
  CHECK(seen->second->output->seqs[0].seq_id == 2);
  Clock::time_point ready_second = seen->second->output->ready_at;
  CHECK(*seen->second_at == ready_second);
  // The second pass started when the first ended.
  CHECK(ready_second - ready_first >= std::chrono::microseconds(static_cast<int>(step_s * 1e6)));
}

TEST_CASE("executor over sim, time_factor 0: a pass is answered at once") {
  Harness h(0.0, 60000);
  auto seen = std::make_shared<Answers>();
  auto t0 = h.now();
  auto exec = h.executor;
  runtime::spawn_fn(h.system, [seen, exec](caf::event_based_actor* self) {
    ask_pass(self, exec, 1, seen, false);
  });
  h.sched.run();  // no time advanced, no timer triggered
  REQUIRE(seen->first.has_value());
  REQUIRE_MESSAGE(seen->first->ok, seen->first->error);
  CHECK(seen->first->output->ready_at == Clock::time_point{});
  CHECK(*seen->first_at == t0);
  CHECK_FALSE(h.sched.clock().has_pending_timeout());
}

TEST_CASE("device_spec: an executor's own sim values override [sim]") {
  std::string text = manifest_text(0.0, 60000);
  std::string from = "device = \"sim\"\n";
  text.replace(text.find(from), from.size(), from + "sim = { step_overhead_us = 1234 }\n");
  config::Manifest manifest = testing::parse_manifest_or_fail(text);
  const config::Instance* executor = manifest.find_executor("ep");
  REQUIRE(executor != nullptr);
  devices::DeviceSpec spec = actors::device_spec(manifest, *executor);
  CHECK(spec.sim.at("step_overhead_us") == 1234.0);  // the executor's value
  CHECK(spec.sim.at("vocab") == 32000.0);            // from [sim]
  CHECK(spec.sim.at("time_factor") == 0.0);
}

TEST_CASE(
    "executor over cpu: the device runs on a thread of its own; the executor answers exec_info "
    "while passes run, and answers the passes in order") {
  // A real scheduler (the cpu device computes in wall time), one cpu executor, three passes of
  // a long prompt submitted back to back, then exec_info: the executor answers exec_info while
  // the first pass is still computing, then each pass, in order. A blocking executor (the
  // device called on the actor's thread) would answer exec_info after all three.
  std::string text = manifest_text(0.0, 1);
  for (const char* from : {"device = \"sim\"\ndevices = [1]\n"}) {
    text.replace(text.find(from), std::string(from).size(),
                 "device = \"cpu\"\ndevices = [1]\nthreads = 1\n");
  }
  std::string path = "path = \"" + testing::model_dir() + "\"";
  text.replace(text.find(path), path.size(),
               "path = \"" + testing::model_dir() + "/stories15M.bin\"");
  text.replace(text.find("max_model_tokens = 2048"), 23, "max_model_tokens = 256");
  config::Manifest manifest = testing::parse_manifest_or_fail(text);
  // Declared before the actor system, so they outlive it: its destructor waits for the executor
  // to end, and with it the device thread and the KV pool's registration with the fabric.
  testing::LocalBridge local(manifest, "local");
  obs::Registry registry;
  caf::actor_system_config cfg;
  testing::tandem_actor_config(cfg);
  caf::actor_system system(cfg);
  actors::ShellContext ctx{&manifest, local.bridge.get(), local.log, &registry, {}};
  caf::actor exec = actors::spawn_executor(system, ctx, *manifest.find_executor("ed"));
  local.bridge->set_ready();

  struct Seen {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> order;  // "info" and "pass N", as they arrived
    std::vector<actors::ExecResult> passes;
  };
  auto seen = std::make_shared<Seen>();
  auto note = [seen](std::string what, std::optional<actors::ExecResult> r) {
    std::lock_guard lock(seen->mu);
    seen->order.push_back(std::move(what));
    if (r) seen->passes.push_back(std::move(*r));
    seen->cv.notify_all();
  };
  // The device opens first (loading the weights); then the passes.
  runtime::spawn_fn(system, [exec, note](caf::event_based_actor* self) {
    self->request(exec, caf::infinite, actors::atoms::exec_info::value)
        .then([self, exec, note](const actors::ExecInfo& info) {
          if (!info.ok) return note("no device: " + info.error, std::nullopt);
          for (uint64_t seq = 1; seq <= 3; ++seq) {
            auto batch = std::make_shared<std::vector<devices::PrefillSeq>>();
            std::vector<int32_t> tokens(240);
            for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 100 + int32_t(i % 500);
            std::vector<uint32_t> table;
            for (uint32_t b = 0; b < 15; ++b) table.push_back(uint32_t(seq) * 16 + b);
            batch->push_back({seq, table, 0, tokens});
            self->request(exec, caf::infinite, actors::atoms::exec_run::value,
                          actors::ExecBatch{actors::ExecKind::prefill, batch, nullptr})
                .then([note, seq](const actors::ExecResult& r) {
                  note("pass " + std::to_string(seq), r);
                });
          }
          self->request(exec, caf::infinite, actors::atoms::exec_info::value)
              .then([note](const actors::ExecInfo&) { note("info", std::nullopt); });
        });
  });
  {
    std::unique_lock lock(seen->mu);
    REQUIRE(seen->cv.wait_for(lock, 120s, [&] { return seen->order.size() == 4; }));
  }
  CHECK(seen->order == std::vector<std::string>{"info", "pass 1", "pass 2", "pass 3"});
  for (const auto& r : seen->passes) {
    CHECK_MESSAGE(r.ok, r.error);
    CHECK(r.compute_ns > 0);
  }
  caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
}
