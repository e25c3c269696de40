// The NPU executor: one per device group. It owns exactly one Device; nothing else touches
// it. Passes are submitted and complete as messages; the actor itself never blocks. A device
// whose calls block for the length of a batch (cpu, rbln) opens and runs on a thread of its
// own (DeviceWorker: the rbln device's graph runs are the runtime's async run + a bounded
// wait); the sim device, which only models time, runs inline and answers a pass at its
// modelled end (StepOutput::ready_at) from a timer. Only actors on
// the same node talk to it (plain CAF messages, never the wire): its prefill or decode
// instance.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <optional>
#include <string>

#include "actors/common/shell.hpp"
#include "devices/device.hpp"
#include "devices/kv_memory.hpp"
#include "runtime/fabric/endpoint.hpp"

namespace tandem::actors {

// What a prefill/decode shell needs to know about its executor's device, answered once.
struct ExecInfo {
  bool ok = false;
  std::string error;                 // why the device could not be created
  devices::ModelConfig model;
  devices::KvLayout layout;
  runtime::RemoteRegionRef region;   // the KV pool as registered memory, for peers' RMA reads
  std::string fabric_address;        // the endpoint that registered it
  // The KV pool registration, for RMA reads INTO the pool. Owned by the executor and valid
  // while it lives (the node stops actors before it stops the fabric).
  const runtime::MemoryRegion* local = nullptr;
  bool draft_model = false;  // the device drafts (EAGLE-3 head beside it): ExecKind::draft
  std::string description;   // Device::describe(): what it runs (`tandem shell executors`)
  // A decode executor whose instance speculates, on a device whose passes take real time
  // (cpu, rbln), with no [speculative] row_cost in the manifest: its decode passes' cost by
  // rows, measured when it opened (devices/pass_cost.hpp), and the row_cost fitted to them;
  // empty and 0 otherwise (decode then sizes drafts with the manifest's row_cost).
  std::vector<double> pass_costs;
  double row_cost = 0;
  std::vector<std::pair<uint32_t, double>> batch_row_costs;  // PassCosts::by_batch
};

// draft: the next drafts after a verified decode pass (Device::draft); its result's
// `drafts`, not `output`.
enum class ExecKind { prefill, decode, draft };

struct ExecBatch {
  ExecKind kind = ExecKind::prefill;
  std::shared_ptr<const std::vector<devices::PrefillSeq>> prefill;  // when kind == prefill
  std::shared_ptr<const std::vector<devices::DecodeSeq>> decode;    // when kind == decode
  std::shared_ptr<const std::vector<devices::DraftSeq>> draft;      // when kind == draft
  std::shared_ptr<const std::vector<uint64_t>> forget;  // draft: sequences that ended
};

struct ExecResult {
  bool ok = false;
  std::string error;
  std::shared_ptr<const devices::StepOutput> output;
  uint64_t compute_ns = 0;
  std::shared_ptr<const std::vector<devices::DraftOutput>> drafts;  // kind draft
  // Non-empty: the device takes no more work (Device::lost()); the shell stops stepping and
  // reports the instance not ready with this reason.
  std::string device_lost;
};

// Builds the device spec for `instance` (an executor) from the manifest.
devices::DeviceSpec device_spec(const config::Manifest& manifest, const config::Instance& instance);

// The startup error when the KV pools of `node`'s executors do not fit `memory_bytes`
// (devices::check_kv_pools_fit; bad sim parameters are left to the executor to report);
// nullopt when they fit. Pure (no device is created).
std::optional<std::string> check_node_kv_memory(const config::Manifest& manifest,
                                                const config::Node& node, uint64_t memory_bytes);
// The KV pools of `node`'s executors, named "EXECUTOR" (or "NODE/EXECUTOR" when
// `with_node`), for checks over several nodes of one host (`tandem up`).
std::vector<devices::KvPoolUse> node_kv_pools(const config::Manifest& manifest,
                                              const config::Node& node, bool with_node);

// Spawns the executor for `instance`, which creates its device (on its DeviceWorker's thread
// when devices::holds_thread) and registers the KV pool with the fabric (the bridge's endpoint
// must be open). Registers NODE/executor/NAME.
caf::actor spawn_executor(caf::actor_system& system, const ShellContext& ctx,
                          const config::Instance& instance);

}  // namespace tandem::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::ExecInfo)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::ExecBatch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::ExecResult)

// exec_run requests carry no CAF timeout (caf::infinite): a timed request costs two wakeups
// of CAF's clock thread per device step (set and cancel), on the latency path of every
// token. A dead executor still answers with an error (request_receiver_down); a device step
// that hangs is timed out by the shell's own tick ([supervisor] executor_step_timeout_ms,
// actors/common/exec_watch.hpp), which ends the step's requests and reports not ready.
namespace tandem::actors::atoms {
using exec_info = caf::atom_constant<caf::atom("execinfo")>;
using exec_run = caf::atom_constant<caf::atom("execrun")>;
}  // namespace tandem::actors::atoms

namespace tandem::actors {

// Asks the executor for its device (atoms::exec_info) and waits for it, messages staying in the
// mailbox, at most [supervisor] executor_open_timeout_ms: a device whose open hangs (a runtime
// loading compiled graphs that never returns) becomes the instance's error instead of a shell
// that waits forever. On a device: `on_device(info)`, which becomes the running behavior. On no
// device (the executor's error, the timeout, or a dead executor): logs it and starts the
// not-ready reports (not_ready_tick); a late answer is dropped. `role` names the shell in logs.
template <class ShellActor, class OnDevice>
void await_exec_info(ShellActor* self, const caf::actor& executor, const char* role,
                     OnDevice on_device) {
  auto timeout =
      std::chrono::milliseconds(self->state.ctx.manifest->supervisor.executor_open_timeout_ms);
  auto fail = [self, role](const std::string& error) {
    auto& st = self->state;
    st.info.ok = false;
    st.info.error = error;
    st.ctx.log->error("{} {}: no device: {}", role, st.self_name.instance, error);
    self->send(self, runtime::atoms::tick::value);  // starts the not-ready reports
  };
  self->request(executor, timeout, atoms::exec_info::value)
      .await(
          [self, fail, on_device](const ExecInfo& info) mutable {
            self->state.info = info;
            if (!info.ok) return fail(info.error);
            on_device(info);
          },
          [self, fail, timeout](const caf::error& error) {
            if (error == caf::sec::request_timeout) {
              return fail("the executor did not open its device within " +
                          std::to_string(timeout.count()) +
                          " ms ([supervisor] executor_open_timeout_ms)");
            }
            fail("the executor did not answer: " + self->system().render(error));
          });
}

}  // namespace tandem::actors
