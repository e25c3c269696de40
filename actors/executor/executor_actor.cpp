#include "actors/executor/executor_actor.hpp"

#include <chrono>

#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"

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
  for (const auto& [name, value] : manifest.sim.params) spec.sim[name] = value;
  return spec;
}

namespace {

struct ExecutorState {
  std::unique_ptr<devices::Device> device;
  std::unique_ptr<runtime::MemoryRegion> registration;
  ExecInfo info;
  static inline const char* name = "tandem.executor";
};

using ExecutorActor = caf::stateful_actor<ExecutorState>;

ExecInfo open_device(ExecutorState& st, const ShellContext& ctx, const config::Instance& inst) {
  ExecInfo info;
  auto device = devices::make_device(device_spec(*ctx.manifest, inst));
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
  return info;
}

ExecResult run_batch(devices::Device& device, const ExecBatch& batch) {
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

}  // namespace

caf::actor spawn_executor(caf::actor_system& system, const ShellContext& ctx,
                          const config::Instance& instance) {
  messages::ActorName name{ctx.bridge->node(), "executor", instance.name};
  ShellContext context = ctx;
  config::Instance inst = instance;
  auto actor = system.spawn<caf::detached>([context, inst](ExecutorActor* self) -> caf::behavior {
    self->state.info = open_device(self->state, context, inst);
    if (self->state.info.ok) {
      const auto& l = self->state.info.layout;
      context.log->info("executor {}: {} device, KV pool {} blocks x {} bytes ({} MiB)", inst.name,
                        config::to_string(inst.device), l.blocks_total, l.block_bytes(),
                        l.pool_bytes() >> 20);
    } else {
      context.log->error("{}", self->state.info.error);
    }
    return {
        [self](atoms::exec_info) { return self->state.info; },
        [self](atoms::exec_run, const ExecBatch& batch) {
          if (!self->state.device) {
            return ExecResult{false, self->state.info.error, nullptr, 0};
          }
          return run_batch(*self->state.device, batch);
        },
        [self, context, inst](const runtime::InboundFrame& in) {
          auto envelope = in.frame->envelope();
          if (envelope.getBody().which() == wire::Envelope::Body::PING) {
            runtime::answer_ping(context.bridge, {context.bridge->node(), "executor", inst.name},
                                 envelope);
          }
        },
    };
  });
  ctx.bridge->register_actor(name, actor);
  return actor;
}

}  // namespace tandem::actors
