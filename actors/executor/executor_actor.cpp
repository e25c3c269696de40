#include "actors/executor/executor_actor.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "actors/executor/sim_markup.hpp"
#include "devices/kv_memory.hpp"
#include "devices/pass_cost.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/spawn.hpp"

namespace tandem::actors {

devices::DeviceSpec device_spec(const config::Manifest& manifest,
                                const config::Instance& instance) {
  RT_ASSERT(instance.role == config::Role::executor, instance.name);
  devices::DeviceSpec spec;
  spec.kind = instance.device;
  spec.model_path = manifest.model.path;
  spec.block_tokens = manifest.model.block_tokens;
  spec.blocks_total = instance.kv_blocks;
  spec.threads = instance.threads;
  spec.seed = std::hash<std::string>{}(instance.name);
  spec.sim = manifest.sim_params(instance);
  spec.rbln.library = manifest.rbln.library;
  spec.rbln.artifacts = manifest.rbln.artifacts;
  spec.rbln.compiler = manifest.rbln.compiler;
  spec.rbln.cache_dir = manifest.rbln.cache_dir;
  spec.rbln.prefill_chunk = manifest.rbln.prefill_chunk;
  spec.rbln.kv_element_bytes = manifest.rbln.kv_element_bytes;
  spec.rbln.device_ids = instance.device_ids;
  spec.rbln.model_name = manifest.model.name;
  spec.rbln.served_names = manifest.model.served_names;
  spec.rbln.max_model_tokens = manifest.model.max_model_tokens;
  spec.rbln.run_timeout_ms = manifest.supervisor.executor_step_timeout_ms;
  spec.rbln.kv_on_device = manifest.rbln.kv_on_device;
  spec.rbln.pool_read_remotely = false;  // until a prefill instance below uses this executor
  // rbln: a decode instance's steps must fit the largest compiled decode bucket.
  for (const auto& node : manifest.nodes) {
    for (const auto& user : node.instances) {
      if (user.role == config::Role::decode && user.executor == instance.name) {
        spec.rbln.decode_seqs_max = manifest.decode.seqs_max;
        spec.rbln.data_parallel = manifest.rbln.decode_data_parallel;
        if (manifest.speculative.method != config::SpeculativeMethod::none) {
          spec.rbln.draft_tokens_max = manifest.speculative.draft_tokens_max;
        }
      }
      // Only a prefill instance's blocks are read out of the pool by RMA (decode's P/D pull,
      // tier-2 write-behind): KV in device memory is staged back to the host pool only then.
      if (user.role == config::Role::prefill && user.executor == instance.name) {
        spec.rbln.pool_read_remotely = true;
        // A prefill executor's own compiled directory (a pipelined prefill): not the cache.
        if (!manifest.rbln.prefill_artifacts.empty()) {
          spec.rbln.artifacts = manifest.rbln.prefill_artifacts;
          spec.rbln.compiler.clear();
        } else {  // the compile cache's pipelined prefill (an executor serves one instance)
          spec.rbln.pipeline_stages = manifest.rbln.prefill_pipeline_stages;
          spec.rbln.stage_layers = manifest.rbln.prefill_stage_layers;
        }
      }
    }
  }
  // EAGLE-3: the draft head sits beside the executor of each decode instance.
  if (manifest.speculative.method == config::SpeculativeMethod::eagle3) {
    for (const auto& node : manifest.nodes) {
      for (const auto& user : node.instances) {
        if (user.role == config::Role::decode && user.executor == instance.name) {
          spec.draft_model_path = manifest.speculative.draft_model;
        }
      }
    }
  }
  return spec;
}

std::vector<devices::KvPoolUse> node_kv_pools(const config::Manifest& manifest,
                                              const config::Node& node, bool with_node) {
  std::vector<devices::KvPoolUse> pools;
  for (const config::Instance& instance : node.instances) {
    if (instance.role != config::Role::executor) continue;
    auto bytes = devices::kv_pool_host_bytes(device_spec(manifest, instance));
    if (!bytes.ok()) continue;  // the executor reports its bad parameters when it starts
    std::string name = with_node ? node.name + "/" + instance.name : instance.name;
    pools.push_back({name, *bytes, instance.kv_blocks, manifest.model.block_tokens, ""});
  }
  RT_ASSERT(pools.size() <= node.instances.size(), node.name);
  std::string prefix = with_node ? "node '" + node.name + "': " : "";
  const config::FabricSection& f = manifest.fabric;
  uint64_t recv_bytes = uint64_t{f.recv_buffers} * (f.frame_bytes_max + 64);
  pools.push_back({"", recv_bytes, 0, 0,
                   prefix + "fabric receive buffers: [fabric] recv_buffers " +
                       std::to_string(f.recv_buffers) + " x frame_bytes_max " +
                       std::to_string(f.frame_bytes_max)});
  bool offload = std::any_of(node.instances.begin(), node.instances.end(), [](const auto& i) {
    return i.role == config::Role::kv_offload;
  });
  const config::KvOffloadSection& kv = manifest.kv_offload;
  if (offload && kv.enabled) {
    uint64_t block_bytes = 0;  // a tier-2 block is an executor pool's block
    for (const auto& p : pools) {
      if (p.what.empty() && p.kv_blocks > 0) block_bytes = std::max(block_bytes, p.bytes / p.kv_blocks);
    }
    pools.push_back({"", kv.host_cache_bytes, 0, 0,
                     prefix + "tier-2 host cache: [kv_offload] host_cache_bytes"});
    pools.push_back({"", uint64_t{kv.staging_blocks} * ((block_bytes + 4095) / 4096 * 4096), 0, 0,
                     prefix + "tier-2 staging: [kv_offload] staging_blocks " +
                         std::to_string(kv.staging_blocks) + " x a block"});
  }
  return pools;
}

std::optional<std::string> check_node_kv_memory(const config::Manifest& manifest,
                                                const config::Node& node, uint64_t memory_bytes) {
  std::vector<devices::KvPoolUse> pools = node_kv_pools(manifest, node, false);
  return devices::check_kv_pools_fit("node '" + node.name + "'", pools, memory_bytes);
}

namespace {

// A pass whose answer waits for its modelled end (StepOutput::ready_at).
struct PendingPass {
  caf::response_promise promise;
  ExecResult result;
  std::chrono::steady_clock::time_point answer_at;  // its modelled end (or later: a stall)
};

// Passes answered later. The prefill or decode instance that owns the executor has one pass
// in flight at a time; more than this is a bug upstream, answered with an error.
constexpr size_t kPendingMax = 64;

// The device and its KV pool registration: used by one thread at a time (the executor's, for
// the sim; its DeviceWorker's, for a device that holds the calling thread).
struct DeviceSlot {
  std::unique_ptr<devices::Device> device;
  std::unique_ptr<runtime::MemoryRegion> registration;
};

class DeviceWorker;

// What an executor exports (labelled by instance and device kind): its passes' device time, the
// passes that failed, and whether its device is ready or lost, for alerts on a lost NPU.
struct ExecutorMetrics {
  obs::Histogram* pass = nullptr;  // tandem:executor_pass_seconds (its _sum: device time)
  obs::Counter* failed = nullptr;  // tandem:executor_pass_failures_total
  obs::Gauge* ready = nullptr;     // tandem:executor_device_ready: 1 opened and not lost
  obs::Gauge* lost = nullptr;      // tandem:executor_device_lost: 1 once lost
};

ExecutorMetrics make_executor_metrics(obs::Registry* r, const config::Instance& inst) {
  if (r == nullptr) return {};
  obs::Labels l{{"instance", inst.name}, {"device", std::string(config::to_string(inst.device))}};
  return {make_histogram(*r, "tandem:executor_pass_seconds",
                         "device time of each executor pass (prefill, decode or draft)",
                         obs::exponential_buckets(0.0005, 2.0, 18), l),
          make_counter(*r, "tandem:executor_pass_failures_total", "executor passes that failed", l),
          make_gauge(*r, "tandem:executor_device_ready",
                     "1 when the executor's device is open and not lost", l),
          make_gauge(*r, "tandem:executor_device_lost",
                     "1 once the executor's device is lost (a run that never completed)", l)};
}

struct ExecutorState {
  DeviceSlot slot;                       // the sim's (the worker owns a threaded device's)
  std::unique_ptr<DeviceWorker> worker;  // cpu, rbln: the device's own thread
  ExecInfo info;
  bool opened = false;                   // info says what the device open gave
  std::vector<caf::response_promise> info_waiting;  // exec_info asked before it opened
  std::map<uint64_t, caf::response_promise> running;  // by ticket: passes the worker holds
  uint64_t next_ticket = 0;
  std::deque<PendingPass> pending;  // in answer_at order: the device runs passes one at a time
  uint32_t stall_next_ms = 0;       // TEST HOOK (atoms::stall): the next pass answers this late
  // For `tandem shell executors`: since the device opened.
  std::chrono::steady_clock::time_point opened_at;
  uint64_t passes = 0, passes_failed = 0, device_ns = 0, last_ns = 0;
  std::string last_error;  // the last failed pass's
  std::string lost;        // the device's, once lost
  ExecutorMetrics metrics;
  static inline const char* name = "tandem.executor";
};

using ExecutorActor = caf::stateful_actor<ExecutorState>;

// True when executor `inst` of this node runs a decode instance that speculates with a
// row_cost to measure, on a device whose passes take real time.
bool measures_row_cost(const ShellContext& ctx, const config::Instance& inst) {
  const config::SpeculativeSection& spec = ctx.manifest->speculative;
  if (spec.method == config::SpeculativeMethod::none || !spec.row_cost_measured ||
      inst.device == config::DeviceKind::sim) {
    return false;
  }
  for (const auto& [node, decode] : ctx.manifest->instances_of(config::Role::decode)) {
    if (node->name == ctx.bridge->node() && decode->executor == inst.name) return true;
  }
  return false;
}

// A sequence id no decode or prefill instance hands out (theirs count up from 1).
constexpr uint64_t calibration_seq_id = ~uint64_t{0};

ExecInfo open_device(DeviceSlot& st, const ShellContext& ctx, const config::Instance& inst,
                     caf::actor_clock& clock) {
  ExecInfo info;
  devices::DeviceSpec spec = device_spec(*ctx.manifest, inst);
  // Modelled passes end on the actor clock the timers below use (virtual under CAF's test
  // coordinator); the actor system, hence the clock, outlives the device.
  spec.clock = [&clock] { return clock.now(); };
  if (spec.kind == config::DeviceKind::sim) {
    auto markup = load_sim_markup(ctx.manifest->model, spec.sim);
    if (!markup.ok()) {
      info.error = "executor " + inst.name + ": " + markup.error().describe();
      return info;
    }
    spec.sim_markup = std::move(markup).value();
  }
  auto device = devices::make_device(spec);
  if (!device.ok()) {
    info.error = "executor " + inst.name + ": " + device.error().describe();
    return info;
  }
  st.device = std::move(device).value();
  devices::MemoryRegion pool = st.device->kv_region();
  auto* fabric = ctx.bridge->fabric();
  RT_ASSERT(fabric != nullptr, "the fabric opens before executors start");
  auto registered = fabric->register_memory(pool.base, pool.length_bytes);
  if (!registered.ok()) {
    info.error = "executor " + inst.name + ": cannot register the KV pool: " +
                 registered.error().describe();
    return info;
  }
  st.registration = std::move(registered).value();
  info.ok = true;
  info.model = st.device->model_config();
  info.layout = st.device->kv_layout();
  info.region = {st.registration->remote_base(), st.registration->length_bytes(),
                 st.registration->key()};
  info.fabric_address = fabric->address();
  info.local = st.registration.get();
  info.draft_model = st.device->has_draft_model();
  info.description = st.device->describe();
  if (measures_row_cost(ctx, inst)) {
    // Before anything uses the pool (the timing writes KV into its first blocks).
    const uint32_t rows = ctx.manifest->speculative.draft_tokens_max + 1;
    auto costs = devices::measure_pass_costs(*st.device, std::max<uint32_t>(rows, 2), 9,
                                             calibration_seq_id,
                                             ctx.manifest->speculative.batch_max);
    if (costs.ok()) {
      info.pass_costs = costs->by_rows;
      info.row_cost = costs->row_cost;
      info.batch_row_costs = costs->by_batch;
      std::string by_rows, by_batch;
      for (double c : costs->by_rows) {
        char cell[32];
        std::snprintf(cell, sizeof cell, " %.2f", c);
        by_rows += cell;
      }
      for (const auto& [b, c] : costs->by_batch) {
        char cell[48];
        std::snprintf(cell, sizeof cell, " %u: %.3f", b, c);
        by_batch += cell;
      }
      ctx.log->info("executor {}: decode passes of 1..{} rows cost{} one-row passes; "
                    "row_cost {:.3f} (measured; drafts are sized with it); one more row in a "
                    "pass of b sequences, per sequence's cost:{}",
                    inst.name, rows, by_rows, costs->row_cost, by_batch);
    } else {
      ctx.log->warn("executor {}: could not time its decode passes ({}); drafts are sized "
                    "with [speculative] row_cost {}",
                    inst.name, costs.error().describe(), ctx.manifest->speculative.row_cost);
    }
  }
  return info;
}

ExecResult run_draft(devices::Device& device, const ExecBatch& batch) {
  static const std::vector<uint64_t> none;
  auto start = std::chrono::steady_clock::now();
  auto drafts = device.draft(batch.draft ? std::span<const devices::DraftSeq>(*batch.draft)
                                         : std::span<const devices::DraftSeq>(),
                             batch.forget ? *batch.forget : none);
  ExecResult result;
  result.compute_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                           start)
          .count());
  if (!drafts.ok()) {
    result.error = drafts.error().describe();
    return result;
  }
  result.ok = true;
  result.drafts =
      std::make_shared<const std::vector<devices::DraftOutput>>(std::move(drafts).value());
  return result;
}

ExecResult run_pass(devices::Device& device, const ExecBatch& batch) {
  if (batch.kind == ExecKind::draft) return run_draft(device, batch);
  auto start = std::chrono::steady_clock::now();
  Result<devices::StepOutput> out =
      batch.kind == ExecKind::prefill
          ? device.prefill(std::span<const devices::PrefillSeq>(*batch.prefill))
          : device.decode(std::span<const devices::DecodeSeq>(*batch.decode));
  ExecResult result;
  result.compute_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                           start)
          .count());
  if (!out.ok()) {
    result.error = out.error().describe();
    return result;
  }
  result.ok = true;
  result.output = std::make_shared<const devices::StepOutput>(std::move(out).value());
  return result;
}

// One pass, and whether the device is lost after it (ExecResult::device_lost).
ExecResult run_batch(devices::Device& device, const ExecBatch& batch) {
  ExecResult result = run_pass(device, batch);
  result.device_lost = device.lost();
  return result;
}

// Answers every pending pass whose modelled end has come. A timer that fired a little early
// leaves the front waiting: another tick is armed for it, so no pass is ever left behind.
void deliver_ready(ExecutorActor* self) {
  auto& st = self->state;
  auto now = self->clock().now();
  while (!st.pending.empty() && st.pending.front().answer_at <= now) {
    st.pending.front().promise.deliver(std::move(st.pending.front().result));
    st.pending.pop_front();
  }
  if (!st.pending.empty()) {
    self->delayed_send(self, st.pending.front().answer_at - now, runtime::atoms::tick::value);
  }
}

// Answers pass `result` now, or at its modelled end (StepOutput::ready_at, the sim) or after a
// test stall, behind the passes still pending.
caf::result<ExecResult> answer(ExecutorActor* self, ExecResult result,
                               std::optional<caf::response_promise> promise) {
  auto& st = self->state;
  ++st.passes;
  st.device_ns += result.compute_ns;
  st.last_ns = result.compute_ns;
  if (st.metrics.pass) st.metrics.pass->observe(static_cast<double>(result.compute_ns) / 1e9);
  if (!result.ok) {
    ++st.passes_failed;
    st.last_error = result.error;
    if (st.metrics.failed) st.metrics.failed->inc();
  }
  if (!result.device_lost.empty() && st.lost.empty()) {
    st.lost = result.device_lost;
    if (st.metrics.ready) st.metrics.ready->set(0);
    if (st.metrics.lost) st.metrics.lost->set(1);
  }
  auto now = self->clock().now();
  auto answer_at = result.output ? result.output->ready_at : now;  // drafts: no model time
  if (st.stall_next_ms > 0) {
    answer_at = std::max(answer_at, now + std::chrono::milliseconds(st.stall_next_ms));
    st.stall_next_ms = 0;
  }
  if (answer_at <= now && st.pending.empty()) {
    if (!promise) return result;
    promise->deliver(std::move(result));
    return caf::delegated<ExecResult>();
  }
  if (!promise) promise = self->make_response_promise();
  answer_at = std::max(answer_at, st.pending.empty() ? answer_at : st.pending.back().answer_at);
  st.pending.push_back({*promise, std::move(result), answer_at});
  self->delayed_send(self, std::max(answer_at - now, std::chrono::steady_clock::duration{}),
                     runtime::atoms::tick::value);
  return *promise;
}

void log_opened(const ShellContext& ctx, const config::Instance& inst, const ExecInfo& info) {
  if (!info.ok) return ctx.log->error("{}", info.error);
  const auto& l = info.layout;
  ctx.log->info("executor {}: {} device, KV pool {} blocks x {} bytes ({} MiB)", inst.name,
                config::to_string(inst.device), l.blocks_total, l.block_bytes(),
                l.pool_bytes() >> 20);
}

// A device that holds the calling thread for a pass (cpu, rbln) runs on a thread of its own:
// it opens there (loading weights or compiled graphs), then runs the passes the executor
// submits, in order, one at a time; the open and each pass come back to the executor as a
// message (DeviceOpened, PassDone). So the executor actor never blocks: it answers exec_info,
// pings and further submissions while a pass runs, on the node's CAF workers. The device and
// its registration are made and destroyed on this thread; the destructor waits for the pass
// in flight (a hung rbln run ends at its own timeout) and drops the queued ones.
struct DeviceOpened {
  ExecInfo info;
};
struct PassDone {
  uint64_t ticket = 0;
  ExecResult result;
};

class DeviceWorker {
 public:
  using Open = std::function<ExecInfo(DeviceSlot&)>;
  DeviceWorker(caf::actor_addr executor, Open open)
      : executor_(std::move(executor)), open_(std::move(open)), thread_([this] { run(); }) {}
  ~DeviceWorker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // Queues a pass (the executor bounds how many it holds: kPendingMax).
  void submit(uint64_t ticket, ExecBatch batch) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back({ticket, std::move(batch)});
    }
    cv_.notify_one();
  }

 private:
  struct Job {
    uint64_t ticket;
    ExecBatch batch;
  };
  template <class Message>
  void tell(Message message) {
    if (auto hdl = caf::actor_cast<caf::actor>(executor_)) caf::anon_send(hdl, std::move(message));
  }
  void run() {
    DeviceSlot slot;
    tell(DeviceOpened{open_(slot)});
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (stop_) break;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      ExecResult result;
      if (!slot.device) {
        result.error = "executor: no device";
      } else {
        result = run_batch(*slot.device, job.batch);
      }
      tell(PassDone{job.ticket, std::move(result)});
    }
  }

  caf::actor_addr executor_;  // weak: the executor owns this worker
  Open open_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace
}  // namespace tandem::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::DeviceOpened)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::PassDone)

namespace tandem::actors {
namespace {

// Answers an exec_info: at once when the device open has ended, else when it does.
caf::result<ExecInfo> answer_info(ExecutorActor* self) {
  auto& st = self->state;
  if (st.opened) return st.info;
  if (st.info_waiting.size() >= kPendingMax) {
    ExecInfo busy;
    busy.error = "executor: too many callers waiting for the device to open";
    return busy;
  }
  st.info_waiting.push_back(self->make_response_promise());
  return st.info_waiting.back();
}

// `tandem shell executors`: one row for this executor (the node actor renders the rows of all
// of its executors as one table).
runtime::AdminResult executor_row(const ExecutorState& st, const ShellContext& ctx,
                                  const config::Instance& inst) {
  std::string ids;
  for (uint32_t id : inst.device_ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  // The state in a word; why a device failed or was lost leads the detail.
  std::string state = !st.opened         ? "opening"
                      : !st.info.ok      ? "failed"
                      : !st.lost.empty() ? "lost"
                                         : "ready";
  std::string busy = "-", last = "-", detail = st.info.description;
  if (st.opened && !st.info.ok) detail = st.info.error;
  if (!st.lost.empty()) detail = "lost: " + st.lost + "; " + detail;
  if (st.opened && st.info.ok) {
    auto up = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - st.opened_at)
                  .count();
    char buf[64];
    std::snprintf(
        buf, sizeof buf, "%.1f%%",
        up > 0 ? 100.0 * static_cast<double>(st.device_ns) / static_cast<double>(up) : 0.0);
    busy = buf;
    if (st.passes > 0) {
      std::snprintf(buf, sizeof buf, "%.2f ms", static_cast<double>(st.last_ns) / 1e6);
      last = buf;
    }
    const auto& l = st.info.layout;
    detail = (detail.empty() ? "" : detail + "; ") + "KV pool " + std::to_string(l.blocks_total) +
             " blocks x " + std::to_string(l.block_bytes()) + " bytes";
  }
  if (!st.last_error.empty())
    detail += (detail.empty() ? "" : "; ") + ("last error: " + st.last_error);
  runtime::AdminResult r;
  r.rows.push_back({"executor", "device", "devices", "state", "passes", "failed", "in flight",
                    "device busy", "last pass", "detail"});
  r.rows.push_back({ctx.bridge->node() + "/" + inst.name,
                    std::string(config::to_string(inst.device)), ids.empty() ? "-" : ids, state,
                    std::to_string(st.passes), std::to_string(st.passes_failed),
                    std::to_string(st.running.size() + st.pending.size()), busy, last, detail});
  return r;
}

caf::behavior executor_behavior(ExecutorActor* self, const ShellContext& context,
                                const config::Instance& inst) {
  self->state.metrics = make_executor_metrics(context.metrics, inst);
  if (devices::holds_thread(inst.device)) {
    caf::actor_clock* clock = &self->clock();  // the actor system outlives its actors
    self->state.worker = std::make_unique<DeviceWorker>(
        self->address(), [context, inst, clock](DeviceSlot& slot) {
          return open_device(slot, context, inst, *clock);
        });
  } else {
    self->state.info = open_device(self->state.slot, context, inst, self->clock());
    self->state.opened = true;
    self->state.opened_at = std::chrono::steady_clock::now();
    if (self->state.metrics.ready) self->state.metrics.ready->set(self->state.info.ok ? 1 : 0);
    log_opened(context, inst, self->state.info);
  }
  return {
      [self, context, inst](const runtime::LocalAdmin& cmd) -> runtime::AdminResult {
        if (cmd.command != "executors" || !cmd.args.empty()) {
          return {false, "executor " + inst.name + ": unknown command '" + cmd.command + "'\n", {}};
        }
        return executor_row(self->state, context, inst);
      },
      [self](atoms::exec_info) { return answer_info(self); },
      [self, context, inst](DeviceOpened& opened) {
        auto& st = self->state;
        st.info = std::move(opened.info);
        st.opened = true;
        st.opened_at = std::chrono::steady_clock::now();
        if (st.metrics.ready) st.metrics.ready->set(st.info.ok ? 1 : 0);
        log_opened(context, inst, st.info);
        for (auto& promise : st.info_waiting) promise.deliver(st.info);
        st.info_waiting.clear();
      },
      [self](atoms::exec_run, const ExecBatch& batch) -> caf::result<ExecResult> {
        auto& st = self->state;
        if (!st.opened || !st.info.ok) {
          return ExecResult{false, st.opened ? st.info.error : "executor: the device is not open yet",
                            nullptr, 0};
        }
        if (st.pending.size() + st.running.size() >= kPendingMax) {
          return ExecResult{false, "executor: too many passes in flight", nullptr, 0};
        }
        if (st.worker) {
          uint64_t ticket = ++st.next_ticket;
          auto promise = self->make_response_promise();
          st.running.emplace(ticket, promise);
          st.worker->submit(ticket, batch);
          return promise;
        }
        return answer(self, run_batch(*st.slot.device, batch), std::nullopt);
      },
      [self](PassDone& done) {
        auto& st = self->state;
        auto it = st.running.find(done.ticket);
        if (it == st.running.end()) return;
        caf::response_promise promise = it->second;
        st.running.erase(it);
        answer(self, std::move(done.result), promise);
      },
      [self](runtime::atoms::tick) { deliver_ready(self); },
      [self](runtime::atoms::stall, uint32_t ms) { self->state.stall_next_ms = ms; },
      [context, inst](const runtime::InboundFrame& in) {
        auto envelope = in.frame->envelope();
        if (envelope.getBody().which() == wire::Envelope::Body::PING) {
          runtime::answer_ping(context.bridge, {context.bridge->node(), "executor", inst.name},
                               envelope);
        }
      },
  };
}

}  // namespace

caf::actor spawn_executor(caf::actor_system& system, const ShellContext& ctx,
                          const config::Instance& instance) {
  messages::ActorName name{ctx.bridge->node(), "executor", instance.name};
  auto fn = [context = ctx, inst = instance](ExecutorActor* self) {
    return executor_behavior(self, context, inst);
  };
  // A device that holds the calling thread for a pass (cpu, rbln) runs on its DeviceWorker's
  // thread; the actor itself, like the sim's, runs on the node's CAF workers.
  auto actor = runtime::spawn_fn(system, fn);
  ctx.bridge->register_actor(name, actor);
  return actor;
}

}  // namespace tandem::actors
