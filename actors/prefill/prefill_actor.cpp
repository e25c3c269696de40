#include "actors/prefill/prefill_actor.hpp"

#include <unordered_map>

#include "actors/executor/executor_actor.hpp"
#include "actors/prefill/prefill_scheduler.hpp"
#include "messages/convert.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/spawn.hpp"

namespace tandem::actors {
namespace {

using messages::ActorName;

struct Pending {
  ActorName requester;
  devices::SamplingParams sampling;
  std::vector<int32_t> prompt;
  std::optional<devices::SampledToken> first;
};

struct PrefillState {
  ShellContext ctx;
  ActorName self_name;
  std::optional<HandlerGuard> guard;  // the backstop of each message's handler
  caf::actor executor;
  ExecInfo info;
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<prefill::PrefillScheduler> scheduler;
  std::unordered_map<uint64_t, Pending> pending;
  bool stepping = false;
  std::unique_ptr<InstanceMetrics> metrics;
  std::unique_ptr<KvEventReporter> kv_events;  // evictions to the routers
  static inline const char* name = "tandem.prefill";
};

using PrefillActor = caf::stateful_actor<PrefillState>;

void update_metrics(PrefillState& st) {
  if (!st.metrics || !st.scheduler) return;
  st.metrics->refresh(*st.cache, st.scheduler->queued_count(), st.scheduler->held_count());
  st.kv_events->flush(*st.cache);
}

void reply_done(PrefillActor* self, const prefill::PrefillDone& done, uint64_t compute_ns) {
  auto& st = self->state;
  auto it = st.pending.find(done.request);
  RT_ASSERT(it != st.pending.end(), done.request);
  Pending& p = it->second;
  RT_ASSERT(p.first.has_value(), "the final chunk sampled the first token", done.request);
  const auto& layout = st.info.layout;
  Status sent = st.ctx.bridge->send(st.self_name, p.requester, done.request,
                                    [&](wire::Envelope::Builder b) {
    auto r = b.getBody().initPrefillResult();
    r.setRequestId(done.request);
    r.setFirstTokenId(p.first->token);
    r.setFirstTokenLogprob(p.first->logprob);
    if (p.sampling.logprobs || p.sampling.logprobs_top_n > 0) {
      messages::set_top(r.initFirstTokenTop(), p.first->top);
    }
    r.setCachedTokens(done.cached_tokens_count);
    r.setComputeNs(compute_ns);
    auto blocks = r.initBlocks(static_cast<unsigned>(done.block_table.size()));
    for (unsigned i = 0; i < done.block_table.size(); ++i) {
      auto d = blocks[i];
      auto region = d.initRegion();
      region.setFabricAddress(st.info.fabric_address);
      region.setBaseAddress(st.info.region.remote_base);
      region.setLengthBytes(st.info.region.length_bytes);
      region.setKey(st.info.region.key);
      d.setOffsetBytes(uint64_t(done.block_table[i]) * layout.block_bytes());
      d.setLengthBytes(layout.block_bytes());
      if (i < done.block_hashes.size()) {
        d.setBlockHash(kj::arrayPtr(done.block_hashes[i].bytes.data(), 32));
      }
      auto l = d.initLayout();
      l.setBlockTokens(layout.block_tokens);
      l.setLayers(layout.layers);
      l.setKvHeads(layout.kv_heads);
      l.setHeadDim(layout.head_dim);
      l.setElementBytes(layout.element_bytes);
      l.setBlockBytes(layout.block_bytes());
    }
  });
  if (!sent.ok()) {
    st.ctx.log->warn("prefill {}: cannot answer {}: {}", st.self_name.instance, done.request,
                     sent.error().describe());
    (void)st.scheduler->cancel(done.request);
    st.pending.erase(it);
  }
}

void pump(PrefillActor* self);

void fail_plan(PrefillActor* self, const prefill::PrefillPlan& plan, const std::string& why) {
  auto& st = self->state;
  st.ctx.log->error("prefill {}: step failed: {}", st.self_name.instance, why);
  for (const auto& chunk : plan.chunks) {
    auto it = st.pending.find(chunk.request);
    if (it == st.pending.end()) continue;
    (void)st.scheduler->cancel(chunk.request);
    send_error(st.ctx, st.self_name, it->second.requester, chunk.request,
               make_error(ErrorKind::failed, "prefill failed: " + why));
    st.pending.erase(it);
  }
}

void on_step(PrefillActor* self, const prefill::PrefillPlan& plan, const ExecResult& result) {
  auto& st = self->state;
  st.stepping = false;
  auto done = st.scheduler->on_step_done(plan.step_id, now_ns());
  if (!result.ok || result.output->seqs.size() != plan.chunks.size()) {
    fail_plan(self, plan, result.ok ? "device returned a wrong batch size" : result.error);
    return pump(self);
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const auto& chunk = plan.chunks[i];
    auto it = st.pending.find(chunk.request);
    if (!chunk.last || it == st.pending.end()) continue;
    auto& p = it->second;
    auto token = sample_at(p.sampling, 0, result.output->seqs[i], 0, p.prompt,
                           st.info.model.vocab_size);
    if (!token.ok()) {
      fail_plan(self, prefill::PrefillPlan{0, {chunk}, 0}, token.error().describe());
      continue;
    }
    p.first = *token;
  }
  for (const auto& d : done) {
    if (st.pending.count(d.request)) reply_done(self, d, result.compute_ns);
  }
  update_metrics(st);
  pump(self);
}

void pump(PrefillActor* self) {
  auto& st = self->state;
  if (st.stepping || !st.scheduler) return;
  auto plan = st.scheduler->plan_step();
  if (!plan) return;
  auto batch = std::make_shared<std::vector<devices::PrefillSeq>>();
  for (const auto& c : plan->chunks) {
    batch->push_back({c.request, {c.block_table.begin(), c.block_table.end()}, c.start_position,
                      c.tokens});
  }
  st.stepping = true;
  auto kept = std::make_shared<prefill::PrefillPlan>(std::move(*plan));
  self->request(st.executor, caf::infinite, atoms::exec_run::value,
                ExecBatch{ExecKind::prefill, batch, nullptr})
      .then([self, kept](const ExecResult& r) { on_step(self, *kept, r); },
            [self, kept](caf::error& e) {
              on_step(self, *kept, ExecResult{false, "executor: " + to_string(e), nullptr, 0});
            });
}

void on_request(PrefillActor* self, wire::Envelope::Reader envelope) {
  auto& st = self->state;
  auto req = envelope.getBody().getPrefillRequest();
  ActorName from = messages::get_name(envelope.getSource());
  uint64_t id = req.getRequestId();
  auto hashes = messages::get_hashes(req.getBlockHashes());
  auto sampling = messages::get_sampling(req.getSampling(), st.info.model.vocab_size);
  if (!hashes.ok() || !sampling.ok()) {
    return send_error(st.ctx, st.self_name, from, id,
                      hashes.ok() ? sampling.error() : hashes.error());
  }
  if (st.pending.count(id)) {
    return send_error(st.ctx, st.self_name, from, id,
                      make_error(ErrorKind::invalid, "duplicate request id"));
  }
  prefill::PrefillRequest core{id, messages::get_tokens(req.getPromptTokenIds()), *hashes};
  std::vector<int32_t> prompt = core.tokens;
  if (Status s = st.scheduler->submit(std::move(core)); !s.ok()) {
    return send_error(st.ctx, st.self_name, from, id, s.error());
  }
  st.pending.emplace(id, Pending{from, *sampling, std::move(prompt), std::nullopt});
  update_metrics(st);
  pump(self);
}

void on_frame(PrefillActor* self, const runtime::InboundFrame& in) {
  auto& st = self->state;
  auto envelope = in.frame->envelope();
  auto body = envelope.getBody();
  switch (body.which()) {
    case wire::Envelope::Body::PREFILL_REQUEST:
      return on_request(self, envelope);
    case wire::Envelope::Body::KV_PULL_DONE: {
      uint64_t id = body.getKvPullDone().getRequestId();
      if (st.scheduler->pull_done(id).ok()) st.pending.erase(id);
      return update_metrics(st);
    }
    case wire::Envelope::Body::CANCEL: {
      uint64_t id = body.getCancel().getRequestId();
      if (st.scheduler->cancel(id).ok()) st.pending.erase(id);
      update_metrics(st);
      return pump(self);
    }
    case wire::Envelope::Body::PING:
      return runtime::answer_ping(st.ctx.bridge, st.self_name, envelope);
    default:
      st.ctx.log->warn("prefill {}: ignoring message kind {}", st.self_name.instance,
                       static_cast<int>(body.which()));
  }
}

prefill::PrefillConfig scheduler_config(const config::Manifest& m) {
  prefill::PrefillConfig c;
  c.block_tokens = m.model.block_tokens;
  c.queue_max = m.prefill.queue_max;
  c.running_max = m.prefill.running_max;
  c.held_max = m.prefill.held_max;
  c.step_tokens_max = m.prefill.step_tokens_max;
  c.hold_timeout_ms = std::chrono::milliseconds(m.prefill.hold_timeout_ms);
  return c;
}

caf::behavior running(PrefillActor* self) {
  self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
  return {
      [self](const runtime::InboundFrame& in) {
        auto& st = self->state;
        st.guard->run_frame(st.self_name, in, [self, &in] { on_frame(self, in); });
      },
      [self](runtime::atoms::tick) {
        auto& st = self->state;
        for (uint64_t id : st.scheduler->expire_holds(now_ns())) {
          st.ctx.log->warn("prefill {}: hold of request {} expired before decode pulled it",
                           st.self_name.instance, id);
          st.pending.erase(id);
        }
        update_metrics(st);
        pump(self);
        report_load(self, st.ctx, st.self_name, *st.cache, st.scheduler->queued_count(),
                    st.scheduler->held_count());
        self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
      },
  };
}

}  // namespace

caf::actor spawn_prefill(caf::actor_system& system, const ShellContext& ctx,
                         const config::Instance& instance, caf::actor executor) {
  ActorName name{ctx.bridge->node(), "prefill", instance.name};
  auto init = [ctx, name, executor](PrefillActor* self) -> caf::behavior {
    auto& st = self->state;
    st.ctx = ctx;
    st.self_name = name;
    st.guard.emplace(ctx, "prefill");
    st.executor = executor;
    // Messages wait in the mailbox until the executor has answered with its device.
    self->request(executor, caf::infinite, atoms::exec_info::value)
        .await([self](const ExecInfo& info) {
          auto& st = self->state;
          st.info = info;
          if (!info.ok) {
            st.ctx.log->error("prefill {}: no device: {}", st.self_name.instance, info.error);
            self->send(self, runtime::atoms::tick::value);  // starts the not-ready reports
            return;
          }
          auto config = scheduler_config(*st.ctx.manifest);
          st.cache = std::make_unique<kv::PrefixCache>(info.layout.blocks_total,
                                                       info.layout.block_tokens);
          st.scheduler = std::make_unique<prefill::PrefillScheduler>(config, *st.cache);
          st.metrics = std::make_unique<InstanceMetrics>(*st.ctx.metrics, st.self_name.instance);
          st.kv_events = std::make_unique<KvEventReporter>(st.ctx, st.self_name);
          self->become(running(self));
        });
    return {
        [self](const runtime::InboundFrame& in) {  // only if the device failed
          auto envelope = in.frame->envelope();
          if (envelope.getBody().which() != wire::Envelope::Body::PREFILL_REQUEST) return;
          auto& st = self->state;
          send_error(st.ctx, st.self_name, messages::get_name(envelope.getSource()),
                     envelope.getBody().getPrefillRequest().getRequestId(),
                     make_error(ErrorKind::unimplemented, "prefill has no device: " + st.info.error));
        },
        [self](runtime::atoms::tick) { not_ready_tick(self); },  // only if the device failed
    };
  };
  auto actor = runtime::spawn_fn(system, init);
  ctx.bridge->register_actor(name, actor);
  return actor;
}

}  // namespace tandem::actors
