// The executor actor over a sim device: a modelled pass (time_factor > 0) is answered at its
// modelled end, passes asked for back to back end one after another, and the actor holds no
// thread meanwhile (it answers other messages while a pass is pending).
#include <doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "actors/executor/executor_actor.hpp"
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

struct Harness {
  explicit Harness(double time_factor, int step_us)
      : manifest(testing::parse_manifest_or_fail(manifest_text(time_factor, step_us))),
        system(testing::tandem_actor_config(cfg)),
        local(manifest, "local") {
    actors::ShellContext ctx{&manifest, local.bridge.get(), local.log, &registry, {}};
    executor = actors::spawn_executor(system, ctx, *manifest.find_executor("ed"));
    local.bridge->set_ready();
  }
  // The executor's KV registration must end before the bridge's fabric does (as in a node).
  ~Harness() {
    caf::scoped_actor self{system};
    self->send_exit(executor, caf::exit_reason::user_shutdown);
    self->wait_for(executor);
  }

  config::Manifest manifest;
  caf::actor_system_config cfg;
  caf::actor_system system;
  testing::LocalBridge local;
  obs::Registry registry;
  caf::actor executor;
};

actors::ExecBatch prefill_batch(uint64_t seq) {
  auto batch = std::make_shared<std::vector<devices::PrefillSeq>>();
  batch->push_back({seq, {static_cast<uint32_t>(seq)}, 0, {1, 2, 3}});
  return {actors::ExecKind::prefill, batch, nullptr};
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

TEST_CASE("executor over sim, time_factor 1: answers at the modelled end, one pass at a time, "
          "without holding a thread") {
  constexpr double step_s = 0.060;  // far above the host work of a 3-token pass
  Harness h(1.0, static_cast<int>(step_s * 1e6));
  caf::scoped_actor self{h.system};
  self->request(h.executor, caf::infinite, actors::atoms::exec_info::value)
      .receive([&](const actors::ExecInfo& info) { REQUIRE_MESSAGE(info.ok, info.error); },
               [&](caf::error& e) { FAIL(to_string(e)); });

  auto t0 = Clock::now();
  auto first = self->request(h.executor, caf::infinite, actors::atoms::exec_run::value,
                             prefill_batch(1));
  auto second = self->request(h.executor, caf::infinite, actors::atoms::exec_run::value,
                              prefill_batch(2));
  auto info = self->request(h.executor, caf::infinite, actors::atoms::exec_info::value);
  // While both passes are pending the executor answers at once: no thread is held.
  Clock::time_point t_info, t_first, t_second;
  info.receive([&](const actors::ExecInfo&) { t_info = Clock::now(); },
               [&](caf::error& e) { FAIL(to_string(e)); });
  Clock::time_point ready_first, ready_second;
  first.receive(
      [&](const actors::ExecResult& r) {
        t_first = Clock::now();
        REQUIRE_MESSAGE(r.ok, r.error);
        REQUIRE(r.output->seqs.size() == 1);
        CHECK(r.output->seqs[0].seq_id == 1);
        ready_first = r.output->ready_at;
      },
      [&](caf::error& e) { FAIL(to_string(e)); });
  second.receive(
      [&](const actors::ExecResult& r) {
        t_second = Clock::now();
        REQUIRE_MESSAGE(r.ok, r.error);
        CHECK(r.output->seqs[0].seq_id == 2);
        ready_second = r.output->ready_at;
      },
      [&](caf::error& e) { FAIL(to_string(e)); });
  CHECK(seconds(t_info - t0) < step_s / 2);
  // Answered no earlier than the modelled end; the second pass starts when the first ends.
  CHECK(t_first >= ready_first);
  CHECK(t_second >= ready_second);
  CHECK(seconds(ready_first - t0) >= step_s);
  CHECK(seconds(ready_second - ready_first) >= step_s);
  CHECK(seconds(t_second - t0) >= 2 * step_s);
}

TEST_CASE("executor over sim, time_factor 0: a pass is answered at once") {
  Harness h(0.0, 60000);
  caf::scoped_actor self{h.system};
  auto t0 = Clock::now();
  self->request(h.executor, caf::infinite, actors::atoms::exec_run::value, prefill_batch(1))
      .receive(
          [&](const actors::ExecResult& r) {
            REQUIRE_MESSAGE(r.ok, r.error);
            CHECK(r.output->ready_at == Clock::time_point{});
          },
          [&](caf::error& e) { FAIL(to_string(e)); });
  CHECK(seconds(Clock::now() - t0) < 0.060);
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
