#include "actors/prefill/prefill_actor.hpp"

#include <map>
#include <unordered_map>

#include "actors/common/exec_watch.hpp"
#include "actors/executor/executor_actor.hpp"
#include "actors/prefill/prefill_scheduler.hpp"
#include "actors/prefill/tier2_policy.hpp"
#include "messages/convert.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/spawn.hpp"

namespace tandem::actors::prefill_msgs {
// An RMA read of a staged tier-2 block into this instance's pool ended.
struct Tier2ReadDone {
  uint64_t request = 0;
  uint64_t serial = 0;  // of the wait it belongs to (a request id may come back)
  uint32_t index = 0;
  bool ok = false;
};
}  // namespace tandem::actors::prefill_msgs

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::prefill_msgs::Tier2ReadDone)

namespace tandem::actors {
namespace {

using messages::ActorName;
using prefill_msgs::Tier2ReadDone;

struct Pending {
  ActorName requester;
  devices::SamplingParams sampling;
  std::vector<int32_t> prompt;
  std::optional<devices::SampledToken> first;
};

// A prompt whose missing blocks were asked of tier 2: submitted when the staged blocks have
// been read into the pool (or at once on a miss, an error or lookup_timeout_ms).
struct Tier2Wait {
  ActorName requester;
  ActorName source;  // the kv-offload asked (this node's, or the router's remote copy)
  prefill::PrefillRequest core;
  std::vector<kv::BlockHash> block_hashes;  // the prompt's full blocks' (every k-th prefix hash)
  devices::SamplingParams sampling;
  std::vector<int32_t> prompt;
  uint64_t serial = 0;
  uint32_t device_hit = 0;           // leading whole blocks the pool already had when asked
  uint32_t asked = 0;                // block positions asked for after those
  uint32_t partial = 0;              // sub-blocks of the last fresh block (0: all whole)
  bool probe = false;                // fewer than the prompt lacks (tier2_blocks_to_ask)
  std::chrono::nanoseconds sent{0};  // lookup sent
  std::chrono::nanoseconds replied{0};
  bool reading = false;              // RMA reads of staged blocks in flight
  bool cancelled = false;
  std::vector<kv::BlockIndex> head;   // the pool's cached head, held while filling
  std::vector<kv::BlockIndex> fresh;  // pool blocks being filled (ref 1 each)
  std::vector<int8_t> read_ok;        // per fresh block: -1 reading, 0 failed, 1 read
  uint32_t reads_left = 0;
};

// Blocks offered to tier 2 (one extra reference each) until OffloadStoreDone or the hold
// timeout (kv-offload stores nothing read later than half of it).
struct OffloadPin {
  std::vector<kv::BlockIndex> blocks;
  std::chrono::nanoseconds deadline{0};
};

struct PrefillState {
  ShellContext ctx;
  ActorName self_name;
  std::optional<HandlerGuard> guard;  // the backstop of each message's handler
  caf::actor executor;
  ExecInfo info;
  ImportedBlocks imported;  // tier-2 loaded blocks the next pass hands the executor
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<prefill::PrefillScheduler> scheduler;
  std::unordered_map<uint64_t, Pending> pending;
  bool stepping = false;
  // The executor request in flight ([supervisor] executor_step_timeout_ms) and its plan.
  std::optional<ExecWatch> watch;
  std::shared_ptr<prefill::PrefillPlan> exec_plan;
  std::unique_ptr<InstanceMetrics> metrics;
  std::unique_ptr<KvEventReporter> kv_events;  // precise cache events to the routers
  // Tier 2 (issue 13): this node's kv-offload instance when kv_offload.enabled.
  std::optional<ActorName> offload;
  obs::Counter* tier2_remote_lookups = nullptr;  // lookups sent to another node's kv-offload
  std::map<uint64_t, Tier2Wait> tier2;  // prompts waiting for a lookup (<= prefill.queue_max)
  std::map<uint64_t, OffloadPin> pins;  // offered blocks kv-offload may be reading
  prefill::Tier2RateBook rates;  // measured: compute, and reads per kind of source
  uint64_t tier2_serial = 0;
  obs::Counter* tier2_loaded_blocks = nullptr;
  obs::Counter* tier2_offered_blocks = nullptr;
  static inline const char* name = "tandem.prefill";
};

using PrefillActor = caf::stateful_actor<PrefillState>;

void submit_now(PrefillActor* self, const ActorName& from, prefill::PrefillRequest core,
                const devices::SamplingParams& sampling, std::vector<int32_t> prompt);
void offer_to_tier2(PrefillActor* self, const prefill::PrefillDone& done);

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
  const auto hashes = prefill::block_hashes(done, st.cache->sub_blocks_per_block());
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
      fill_block_descriptor(blocks[i], st.info.fabric_address, st.info.region,
                            uint64_t(done.block_table[i]) * layout.block_bytes(),
                            i < hashes.size() ? &hashes[i] : nullptr, layout);
    }
  });
  if (!sent.ok()) {
    st.ctx.log->warn("prefill {}: cannot answer {}: {}", st.self_name.instance, done.request,
                     sent.error().describe());
    (void)st.scheduler->cancel(done.request);
    st.pending.erase(it);
    return;
  }
  offer_to_tier2(self, done);
}

void pump(PrefillActor* self);

// Ends pending request `id` (if still pending) with `error` to its requester.
void end_pending(PrefillActor* self, uint64_t id, const Error& error) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end()) return;
  (void)st.scheduler->cancel(id);
  send_error(st.ctx, st.self_name, it->second.requester, id, error);
  st.pending.erase(it);
}

void fail_plan(PrefillActor* self, const prefill::PrefillPlan& plan, const std::string& why) {
  auto& st = self->state;
  st.ctx.log->error("prefill {}: step failed: {}", st.self_name.instance, why);
  for (const auto& chunk : plan.chunks) {
    end_pending(self, chunk.request, make_error(ErrorKind::failed, "prefill failed: " + why));
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
  // The compute rate of the tier-2 cost rule: this step's tokens over its device time.
  st.rates.computed(static_cast<double>(plan.tokens_count),
                    static_cast<double>(result.compute_ns) / 1e9);
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

// The device is lost: every request not yet prefilled ends with that error now (its decode
// instance falls back to prefilling itself), instead of waiting for decode's prefill timeout.
// Prefilled ones stay: their KV is pulled, or released by KvPullDone or the hold timeout.
void fail_waiting(PrefillActor* self) {
  auto& st = self->state;
  std::vector<uint64_t> waiting;
  for (const auto& [id, p] : st.pending) {
    if (!p.first) waiting.push_back(id);
  }
  for (uint64_t id : waiting) {
    end_pending(self, id, make_error(ErrorKind::failed, st.watch->stall_reason()));
  }
  update_metrics(st);
}

// True when the answer is for the request in flight; false for a late one (it timed out and its
// step already ended): the executor answers again, so steps resume.
bool watch_answered(PrefillActor* self, uint64_t gen, const ExecResult* result = nullptr) {
  auto& st = self->state;
  if (result) {
    lose_device(st.ctx, *st.watch, st.self_name, "prefill", result->device_lost,
                "requests waiting for a prefill", [self] { fail_waiting(self); });
  }
  if (st.watch->answered(gen, ExecWatch::Clock::now())) {
    st.exec_plan.reset();
    return true;
  }
  st.ctx.log->warn("prefill {}: {}", st.self_name.instance, st.watch->late_text());
  pump(self);
  return false;
}

void pump(PrefillActor* self) {
  auto& st = self->state;
  if (st.stepping || !st.scheduler || st.watch->stalled()) return;
  auto plan = st.scheduler->plan_step();
  if (!plan) return;
  auto batch = std::make_shared<std::vector<devices::PrefillSeq>>();
  for (const auto& c : plan->chunks) {
    batch->push_back({c.request, {c.block_table.begin(), c.block_table.end()}, c.start_position,
                      c.tokens});
    if (c.copy) batch->back().copies.push_back({c.copy->src, c.copy->dst});
  }
  if (!batch->empty()) batch->front().imported = st.imported.take();
  st.stepping = true;
  auto kept = std::make_shared<prefill::PrefillPlan>(std::move(*plan));
  st.exec_plan = kept;
  uint64_t gen = st.watch->start(ExecWatch::Clock::now());
  self->request(st.executor, caf::infinite, atoms::exec_run::value,
                ExecBatch{ExecKind::prefill, batch, nullptr})
      .then(
          [self, kept, gen](const ExecResult& r) {
            if (watch_answered(self, gen, &r)) on_step(self, *kept, r);
          },
          [self, kept, gen](caf::error& e) {
            if (!watch_answered(self, gen)) return;
            on_step(self, *kept, ExecResult{false, "executor: " + to_string(e), nullptr, 0});
          });
}

// --- Tier 2 (issue 13) ---

// Write-behind: offers the request's full blocks to tier 2, and with sub-blocks its trailing
// partial block under its last full sub-block's prefix hash (kv-offload skips those it holds),
// pinned by one more reference until OffloadStoreDone. Never waits: with kv_offload.stores_max
// offers in flight, or no fabric, nothing is offered.
void offer_to_tier2(PrefillActor* self, const prefill::PrefillDone& done) {
  auto& st = self->state;
  const uint32_t k = st.cache->sub_blocks_per_block();
  const auto& layout = st.info.layout;
  const auto hashes = prefill::tier2_offer_hashes(
      done, k,
      st.ctx.manifest->kv_offload.partial_blocks
          ? prefill::tier2_partial_gain_min(layout.block_bytes(), layout.block_tokens / k, k,
                                            st.rates.of(false))
          : k);  // no partial has k sub-blocks
  size_t full = hashes.size();
  if (!st.offload || full == 0 || st.pins.count(done.request) ||
      st.pins.size() >= st.ctx.manifest->kv_offload.stores_max) {
    return;
  }
  std::vector<kv::BlockIndex> blocks(done.block_table.begin(), done.block_table.begin() + full);
  Status sent = st.ctx.bridge->send(st.self_name, *st.offload, done.request,
                                    [&](wire::Envelope::Builder b) {
    auto offer = b.getBody().initOffloadStore();
    offer.setRequestId(done.request);
    auto list = offer.initBlocks(static_cast<unsigned>(full));
    for (unsigned i = 0; i < full; ++i) {
      fill_block_descriptor(list[i], st.info.fabric_address, st.info.region,
                            uint64_t(blocks[i]) * layout.block_bytes(), &hashes[i], layout);
    }
  });
  if (!sent.ok()) return;
  st.cache->retain(blocks);  // the scheduler's hold is still on them: they are referenced
  auto hold = std::chrono::milliseconds(st.ctx.manifest->kv_offload.hold_timeout_ms);
  st.pins.emplace(done.request, OffloadPin{std::move(blocks), now_ns() + hold});
  st.tier2_offered_blocks->inc(full);
}

void release_pin(PrefillState& st, uint64_t id) {
  auto it = st.pins.find(id);
  if (it == st.pins.end()) return;
  st.cache->release(it->second.blocks);
  st.pins.erase(it);
}

// Where to ask for the blocks this node's pool lacks: the router's remote copy when it names
// a kv-offload instance of the manifest (tier 2 enabled), else this node's kv-offload. A name
// that is not one is ignored (the request is served either way), never trusted.
std::optional<ActorName> tier2_source(const PrefillState& st, std::string_view named) {
  if (named.empty() || !st.ctx.manifest->kv_offload.enabled) return st.offload;
  auto parsed = ActorName::parse(named);
  if (!parsed.ok() || parsed->role != "kv-offload") return st.offload;
  const config::Node* node = st.ctx.manifest->find_node(parsed->node);
  if (node == nullptr) return st.offload;
  for (const auto& inst : node->instances) {
    if (inst.role == config::Role::kv_offload && inst.name == parsed->instance) return *parsed;
  }
  return st.offload;
}

// Asks tier 2 for the blocks after the pool's hit, when the cost rule says it pays. Returns
// whether the prompt now waits for the answer (else the caller submits it).
bool ask_tier2(PrefillActor* self, const ActorName& from, prefill::PrefillRequest& core,
               const devices::SamplingParams& sampling, std::vector<int32_t>& prompt,
               const std::optional<ActorName>& source) {
  auto& st = self->state;
  if (!source || st.ctx.bridge->fabric() == nullptr || st.info.local == nullptr) return false;
  // Tier 2 holds whole blocks and partial ones: from the pool's whole-block hit, the blocks
  // after it, then the trailing partial one.
  const uint32_t k = st.cache->sub_blocks_per_block();
  std::vector<kv::BlockHash> block_hashes = kv::block_hashes_of(core.prefix_hashes, k);
  const prefill::Tier2Lack lack =
      prefill::tier2_lack(core.prefix_hashes, k, st.cache->match(core.prefix_hashes),
                          st.ctx.manifest->kv_offload.partial_blocks);
  const uint32_t hit = lack.first;
  const uint32_t lacking = lack.positions();
  if (lacking == 0 || st.tier2.size() >= st.ctx.manifest->prefill.queue_max) return false;
  bool remote = source->node != st.self_name.node;
  prefill::Tier2Rates& rates = st.rates.of(remote);
  ++rates.eligible_count;
  const auto& layout = st.info.layout;
  uint32_t waiting = 0;  // waits on this kind of source (<= prefill.queue_max)
  for (const auto& [other, w] : st.tier2) waiting += (w.source.node != st.self_name.node) == remote;
  uint32_t ask = prefill::tier2_blocks_to_ask(lacking, layout.block_bytes(), layout.block_tokens,
                                              rates, waiting);
  if (ask == 0) return false;
  uint64_t id = core.id;
  const prefill::Tier2Ask asked = prefill::tier2_ask(core.prefix_hashes, k, lack, ask);
  Status sent = st.ctx.bridge->send(st.self_name, *source, id, [&](wire::Envelope::Builder b) {
    auto q = b.getBody().initOffloadLookup();
    q.setRequestId(id);
    messages::set_hashes(q.initBlockHashes(static_cast<unsigned>(asked.block_hashes.size())),
                         asked.block_hashes);
    if (!asked.sub_hashes.empty()) {
      messages::set_hashes(q.initSubBlockHashes(static_cast<unsigned>(asked.sub_hashes.size())),
                           asked.sub_hashes);
      q.setSubBlocks(k);
      q.setSubBlocksHeld(asked.held);
      q.setPartialGainMin(prefill::tier2_partial_gain_min(
          layout.block_bytes(), layout.block_tokens / k, k, rates));
    }
    fill_kv_layout(q.initLayout(), layout);
    q.setBudgetNs(static_cast<uint64_t>(
        prefill::tier2_budget_s(ask, layout.block_tokens, rates) * 1e9));
  });
  if (!sent.ok()) return false;
  if (remote) st.tier2_remote_lookups->inc();
  Tier2Wait w{from, *source, std::move(core), std::move(block_hashes), sampling,
              std::move(prompt)};
  w.serial = ++st.tier2_serial;
  w.device_hit = hit;
  w.asked = ask;
  w.probe = ask < lacking;
  w.sent = now_ns();
  st.tier2.emplace(id, std::move(w));
  return true;
}

// The wait is over (blocks read, a miss, an error, a timeout): releases what it holds, tells
// kv-offload it may free the staging, and submits the prompt (unless it was cancelled). A
// probe that read every block it asked for (`again`) asks for the rest first, by the rates it
// just measured.
void end_wait(PrefillActor* self, std::map<uint64_t, Tier2Wait>::iterator it, bool staged,
              bool again = false) {
  auto& st = self->state;
  Tier2Wait w = std::move(it->second);
  st.tier2.erase(it);
  uint64_t id = w.core.id;
  if (staged) {
    (void)st.ctx.bridge->send(st.self_name, w.source, id, [&](wire::Envelope::Builder b) {
      auto done = b.getBody().initKvPullDone();
      done.setRequestId(id);
      done.setOk(true);
    });
  }
  if (w.cancelled) return;
  if (again && ask_tier2(self, w.requester, w.core, w.sampling, w.prompt, w.source)) return;
  submit_now(self, w.requester, std::move(w.core), w.sampling, std::move(w.prompt));
}

// Every RMA read ended: commits the read prefix to the pool's prefix cache (a block read
// later than half the hold timeout after the reply may come from a reused staging slot: not
// committed), then the prompt goes to the scheduler, which finds those blocks cached.
void finish_reads(PrefillActor* self, std::map<uint64_t, Tier2Wait>::iterator it) {
  auto& st = self->state;
  Tier2Wait& w = it->second;
  auto half = std::chrono::milliseconds(st.ctx.manifest->kv_offload.hold_timeout_ms) / 2;
  bool in_time = now_ns() - w.replied <= half;
  size_t loaded = 0;
  while (in_time && loaded < w.fresh.size() && w.read_ok[loaded] == 1) ++loaded;
  kv::PrefixHashes q{w.core.prefix_hashes, st.cache->sub_blocks_per_block()};
  for (size_t i = 0; i < loaded; ++i) {
    st.imported.add(w.fresh[i], st.info.layout.blocks_total);
    size_t at = w.device_hit + i;
    const bool partial = w.partial > 0 && i + 1 == w.fresh.size();
    (void)st.cache->commit(w.fresh[i], q.slots(at, partial ? w.partial : q.k), q.parent(at));
  }
  st.cache->release(w.fresh);  // committed ones stay cached (evictable), the rest are free
  st.cache->release(w.head);
  st.tier2_loaded_blocks->inc(loaded);
  if (loaded > 0) {
    double seconds = static_cast<double>((now_ns() - w.sent).count()) / 1e9;
    prefill::Tier2Rates& rates = st.rates.of(w.source.node != st.self_name.node);
    rates.read_bytes_per_s = prefill::ewma(
        rates.read_bytes_per_s,
        static_cast<double>(loaded * st.info.layout.block_bytes()) / std::max(seconds, 1e-9));
  }
  end_wait(self, it, true, w.probe && in_time && w.partial == 0 && loaded == w.asked);
}

// `from`: the kv-offload that answered (this node's or a remote one).
void on_lookup_reply(PrefillActor* self, const ActorName& from,
                     wire::OffloadLookupReply::Reader reply) {
  auto& st = self->state;
  uint64_t id = reply.getRequestId();
  auto it = st.tier2.find(id);
  auto blocks = reply.getBlocks();
  if (it == st.tier2.end() || it->second.reading || it->second.source != from) {
    // Timed out meanwhile (or an answer from another source): free its staging there.
    if (blocks.size() > 0) {
      (void)st.ctx.bridge->send(st.self_name, from, id, [&](wire::Envelope::Builder b) {
        b.getBody().initKvPullDone().setRequestId(id);
      });
    }
    return;
  }
  Tier2Wait& w = it->second;
  w.replied = now_ns();
  // A read is never faster than the source's disk (its own measurement, in the answer).
  prefill::Tier2Rates& source_rates = st.rates.of(w.source.node != st.self_name.node);
  source_rates.read_bytes_per_s =
      prefill::at_most_disk(source_rates.read_bytes_per_s, reply.getDiskBytesPerS());
  if (blocks.size() == 0) {
    prefill::Tier2Rates& rates = st.rates.of(w.source.node != st.self_name.node);
    rates.lookup_overhead_s = prefill::ewma(
        rates.lookup_overhead_s, static_cast<double>((w.replied - w.sent).count()) / 1e9);
    return end_wait(self, it, false);
  }
  // Only the staged blocks that continue the prompt's chain, in order, of our block size: whole
  // blocks, then at most one partial block of the prompt's (its last).
  uint64_t block_bytes = st.info.layout.block_bytes();
  kv::PrefixHashes q{w.core.prefix_hashes, st.cache->sub_blocks_per_block()};
  size_t usable = 0;
  w.partial = 0;
  for (auto d : blocks) {
    size_t at = w.device_hit + usable;
    auto h = d.getBlockHash();
    if (d.getLengthBytes() != block_bytes || h.size() != 32) break;
    kv::BlockHash hash;
    std::memcpy(hash.bytes.data(), h.begin(), 32);
    if (at < w.block_hashes.size() && hash == w.block_hashes[at]) {
      ++usable;
      continue;
    }
    w.partial = q.partial_of(at, hash);
    usable += w.partial > 0;
    break;
  }
  // Fresh blocks for the staged ones, holding the pool's cached head of the prompt meanwhile
  // (else the fresh blocks could evict that head, and the prompt would match nothing).
  std::span<const kv::BlockHash> head(w.core.prefix_hashes.data(),
                                      size_t{w.device_hit} * st.cache->sub_blocks_per_block());
  auto alloc = usable > 0 ? st.cache->acquire(head, static_cast<uint32_t>(usable), 0,
                                              kv::PrefixCache::Query::internal)
                          : Result<kv::Allocation>(make_error(ErrorKind::overloaded, "none"));
  if (!alloc.ok()) return end_wait(self, it, true);
  if (alloc->cached.size() < w.device_hit) {  // the head was evicted meanwhile: no use
    st.cache->release(alloc->cached);
    st.cache->release(alloc->fresh);
    return end_wait(self, it, true);
  }
  w.head = std::move(alloc->cached);
  w.fresh = std::move(alloc->fresh);
  w.read_ok.assign(usable, -1);
  w.reads_left = static_cast<uint32_t>(usable);
  w.reading = true;
  auto* fabric = st.ctx.bridge->fabric();
  caf::actor me = caf::actor_cast<caf::actor>(self);
  for (uint32_t i = 0; i < usable; ++i) {
    RemoteBlock at = read_block_descriptor(blocks[i]);
    auto peer = fabric->peer(at.address);
    Tier2ReadDone fail{id, w.serial, i, false};
    Status started =
        !peer.ok() ? Status(peer.error())
                   : fabric->read(*peer, at.region, at.offset_bytes, *st.info.local,
                                  uint64_t(w.fresh[i]) * block_bytes, block_bytes,
                                  [me, fail](Status done) {
                                    Tier2ReadDone r = fail;
                                    r.ok = done.ok();
                                    caf::anon_send(me, r);
                                  });
    if (!started.ok()) caf::anon_send(me, fail);
  }
}

void on_tier2_read(PrefillActor* self, const Tier2ReadDone& done) {
  auto& st = self->state;
  auto it = st.tier2.find(done.request);
  if (it == st.tier2.end() || it->second.serial != done.serial || !it->second.reading) return;
  Tier2Wait& w = it->second;
  RT_ASSERT(done.index < w.read_ok.size() && w.read_ok[done.index] == -1, done.index);
  w.read_ok[done.index] = done.ok ? 1 : 0;
  if (--w.reads_left == 0) finish_reads(self, it);
}

// Lookups not answered within lookup_timeout_ms: the prompt is computed (a late answer is
// released when it comes). Reads in flight always end (the fabric calls back).
void expire_tier2(PrefillActor* self) {
  auto& st = self->state;
  auto limit = std::chrono::milliseconds(st.ctx.manifest->kv_offload.lookup_timeout_ms);
  auto now = now_ns();
  for (auto it = st.tier2.begin(); it != st.tier2.end();) {
    auto next = std::next(it);
    if (!it->second.reading && now - it->second.sent > limit) end_wait(self, it, false);
    it = next;
  }
  for (auto it = st.pins.begin(); it != st.pins.end();) {
    auto next = std::next(it);
    if (now > it->second.deadline) release_pin(st, it->first);
    it = next;
  }
}

void submit_now(PrefillActor* self, const ActorName& from, prefill::PrefillRequest core,
                const devices::SamplingParams& sampling, std::vector<int32_t> prompt) {
  auto& st = self->state;
  uint64_t id = core.id;
  if (st.watch->lost()) {  // no step runs again: the requester (decode) falls back at once
    return send_error(st.ctx, st.self_name, from, id,
                      make_error(ErrorKind::failed, st.watch->stall_reason()));
  }
  if (Status s = st.scheduler->submit(std::move(core)); !s.ok()) {
    return send_error(st.ctx, st.self_name, from, id, s.error());
  }
  st.pending.emplace(id, Pending{from, sampling, std::move(prompt), std::nullopt});
  update_metrics(st);
  pump(self);
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
  if (st.pending.count(id) || st.tier2.count(id)) {
    return send_error(st.ctx, st.self_name, from, id,
                      make_error(ErrorKind::invalid, "duplicate request id"));
  }
  prefill::PrefillRequest core{id, messages::get_tokens(req.getPromptTokenIds()), *hashes};
  std::vector<int32_t> prompt = core.tokens;
  auto source = tier2_source(st, std::string_view(req.getTier2Source().cStr()));
  if (ask_tier2(self, from, core, *sampling, prompt, source)) return;
  submit_now(self, from, std::move(core), *sampling, std::move(prompt));
}

// A pull-done or cancel for request `id` counts only from the decode instance that asked for
// it (while prefill still knows who that is).
bool from_asker(PrefillState& st, uint64_t id, wire::Envelope::Reader envelope) {
  auto it = st.pending.find(id);
  if (it == st.pending.end()) return true;  // nothing of it left here that a stranger could end
  ActorName from = messages::get_name(envelope.getSource());
  if (it->second.requester == from) return true;
  st.ctx.log->warn("prefill {}: dropped a message about request {} from {}, which did not ask "
                   "for it", st.self_name.instance, id, from.to_string());
  return false;
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
      if (!from_asker(st, id, envelope)) return;
      if (st.scheduler->pull_done(id).ok()) st.pending.erase(id);
      return update_metrics(st);
    }
    case wire::Envelope::Body::OFFLOAD_LOOKUP_REPLY:
      return on_lookup_reply(self, messages::get_name(envelope.getSource()),
                             body.getOffloadLookupReply());
    case wire::Envelope::Body::OFFLOAD_STORE_DONE:
      return release_pin(st, body.getOffloadStoreDone().getRequestId());
    case wire::Envelope::Body::CANCEL: {
      uint64_t id = body.getCancel().getRequestId();
      if (!from_asker(st, id, envelope)) return;
      if (auto w = st.tier2.find(id); w != st.tier2.end()) {
        if (w->second.reading) {
          w->second.cancelled = true;  // its reads end first; then it is dropped
        } else {
          st.tier2.erase(w);  // a late lookup answer is released when it comes
        }
      }
      if (st.scheduler->cancel(id).ok()) st.pending.erase(id);
      update_metrics(st);
      return pump(self);
    }
    case wire::Envelope::Body::KV_RESYNC:  // a router lost track of this cache's events
      st.ctx.log->info("prefill {}: KV snapshot for {} ({})", st.self_name.instance,
                       messages::get_name(envelope.getSource()).to_string(),
                       std::string(body.getKvResync().getReason()));
      st.kv_events->request_snapshot();
      return update_metrics(st);
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

// This node's kv-offload instance (the first one), when kv_offload.enabled.
void init_tier2(PrefillState& st) {
  obs::Labels l = {{"instance", st.self_name.instance}};
  st.tier2_loaded_blocks = make_counter(*st.ctx.metrics, "tandem:prefill_tier2_loaded_blocks_total",
                                        "blocks read from tier 2 into the pool instead of "
                                        "computed", l);
  st.tier2_offered_blocks = make_counter(*st.ctx.metrics,
                                         "tandem:prefill_tier2_offered_blocks_total",
                                         "computed blocks offered to tier 2", l);
  st.tier2_remote_lookups = make_counter(*st.ctx.metrics,
                                         "tandem:prefill_tier2_remote_lookups_total",
                                         "tier-2 lookups sent to another node's kv-offload (the "
                                         "router's remote copy)", l);
  if (!st.ctx.manifest->kv_offload.enabled) return;
  const config::Node* node = st.ctx.manifest->find_node(st.self_name.node);
  if (node == nullptr) return;
  for (const auto& inst : node->instances) {
    if (inst.role == config::Role::kv_offload) {
      st.offload = ActorName{node->name, "kv-offload", inst.name};
      return;
    }
  }
}

caf::behavior running(PrefillActor* self) {
  self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
  return {
      [self](const runtime::InboundFrame& in) {
        auto& st = self->state;
        st.guard->run_frame(st.self_name, in, [self, &in] { on_frame(self, in); });
      },
      [self](const Tier2ReadDone& done) {
        (void)self->state.guard->run("a tier-2 read", [self, &done] { on_tier2_read(self, done); });
      },
      [self](runtime::atoms::tick) {
        auto& st = self->state;
        expire_tier2(self);
        for (uint64_t id : st.scheduler->expire_holds(now_ns())) {
          st.ctx.log->warn("prefill {}: hold of request {} expired before decode pulled it",
                           st.self_name.instance, id);
          st.pending.erase(id);
        }
        if (st.watch->expired(ExecWatch::Clock::now())) {
          st.ctx.log->error(
              "prefill {}: {}; its step's requests end with an error and no step "
              "runs until it answers",
              st.self_name.instance, st.watch->stall_reason());
          if (auto plan = std::exchange(st.exec_plan, nullptr)) {
            on_step(self, *plan, ExecResult{false, st.watch->stall_reason(), nullptr, 0});
          }
        }
        update_metrics(st);
        pump(self);
        if (st.watch->stalled()) {
          report_not_ready(self, st.ctx, st.self_name, st.watch->stall_reason());
          self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
          return;
        }
        const auto& layout = st.info.layout;
        Tier2Reads reads{
            prefill::tier2_reads_pay(layout.block_bytes(), layout.block_tokens, st.rates.local),
            prefill::tier2_reads_pay(layout.block_bytes(), layout.block_tokens, st.rates.remote)};
        // Prompts waiting for tier 2 are work in front of a new prompt too: what they will
        // compute once their blocks are read.
        uint64_t pending = st.scheduler->pending_tokens();
        for (const auto& [id, w] : st.tier2) {
          pending += prefill::tokens_after_tier2(w.core.tokens.size(), w.device_hit + w.asked,
                                                 st.info.layout.block_tokens);
        }
        report_load(self, st.ctx, st.self_name, *st.cache, st.scheduler->queued_count(),
                    st.scheduler->held_count(), PrefillLoadExtras{reads, pending});
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
    st.watch.emplace(std::chrono::milliseconds(ctx.manifest->supervisor.executor_step_timeout_ms));
    st.executor = executor;
    // Messages wait in the mailbox until the executor has answered with its device.
    await_exec_info(
        self, executor, "prefill", [self](const ExecInfo& info) {
          auto& st = self->state;
          auto config = scheduler_config(*st.ctx.manifest);
          st.cache = std::make_unique<kv::PrefixCache>(
              info.layout.blocks_total, info.layout.block_tokens,
              std::min(st.ctx.manifest->model.sub_block_tokens, info.layout.block_tokens));
          st.scheduler = std::make_unique<prefill::PrefillScheduler>(config, *st.cache);
          st.metrics = std::make_unique<InstanceMetrics>(*st.ctx.metrics, st.self_name.instance);
          st.kv_events = std::make_unique<KvEventReporter>(st.ctx, st.self_name);
          init_tier2(st);
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
