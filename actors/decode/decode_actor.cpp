#include "actors/decode/decode_actor.hpp"

#include <deque>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "actors/common/exec_watch.hpp"
#include "actors/decode/decode_scheduler.hpp"
#include "actors/decode/pd_policy.hpp"
#include "actors/decode/spec_manifest.hpp"
#include "actors/decode/spec_step.hpp"
#include "actors/executor/executor_actor.hpp"
#include "messages/convert.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/spawn.hpp"

namespace tandem::actors {

// Completion of one RMA block read, posted from the fabric thread.
struct PullChunkDone {
  uint64_t seq = 0;
  bool ok = false;
  std::string error;
  uint64_t bytes = 0;       // the read's
  bool ends_block = false;  // the last read of a block (pulled_blocks counts it)
};

}  // namespace tandem::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::PullChunkDone)

namespace tandem::actors {
namespace {

using messages::ActorName;

struct Seq {
  ActorName reply_to;
  devices::SamplingParams sampling;
  std::vector<int32_t> history;  // prompt + generated (penalties)
  uint32_t prompt_tokens = 0;
  uint32_t output_count = 0;
  uint32_t cached_tokens = 0;  // prompt tokens not computed: prefill's hit, or ours (local)
  bool first_chunk_planned = false;  // a local prefill's first chunk starts after our hit
  std::optional<ActorName> prefill;  // remote prefill instance, when disaggregated
  std::optional<decode::PullOrder> order;
  std::vector<RemoteBlock> remote;
  std::optional<int32_t> remote_first;
  devices::SampledToken remote_first_logprobs;  // prefill's first token (when asked)
  // Logprobs of tokens sampled and not yet streamed, in order (only when asked): emit()
  // sends the first update.tokens.size() with the tokens and drops the rest.
  std::vector<devices::SampledToken> unsent_logprobs;
  bool prefill_failed = false;
  bool pull_started = false;
  decode::PullReads reads;  // the pull's block reads (pd_policy)
  bool cancelled = false;
  std::chrono::nanoseconds prefill_deadline{0};
  // Tells this sequence from an earlier one with the same id (a gateway's retry replaces a
  // held attempt): a step planned for the old one must not sample into the new one.
  uint64_t serial = 0;
};

struct DecodeMetrics {
  explicit DecodeMetrics(obs::Registry& r, const std::string& instance)
      : common(r, instance),
        fallbacks(make_counter(r, "tandem:prefill_fallbacks_total",
                               "disaggregated prefills that failed or timed out; prefilled "
                               "locally",
                               common.labels())),
        pulled_bytes(make_counter(r, "tandem:kv_pulled_bytes_total",
                                  "KV bytes pulled from prefill by RMA", common.labels())),
        pulled_blocks(make_counter(r, "tandem:kv_pulled_blocks_total",
                                   "KV blocks pulled from prefill by RMA", common.labels())),
        pull_failures(make_counter(r, "tandem:kv_pull_failures_total",
                                   "KV block reads from prefill that failed", common.labels())),
        taken(make_counter(r, "tandem:decode_requests_total",
                           "generate requests decode took (from a gateway)", common.labels())),
        cancelled(make_counter(r, "tandem:requests_cancelled_total",
                               "requests cancelled while decode held them (client gone)",
                               common.labels())),
        spec_drafts(make_counter(r, "tandem:spec_decode_num_drafts_total",
                                 "decode entries that carried draft tokens and were verified",
                                 common.labels())),
        spec_draft_tokens(make_counter(r, "tandem:spec_decode_num_draft_tokens_total",
                                       "draft tokens verified", common.labels())),
        spec_accepted_tokens(make_counter(r, "tandem:spec_decode_num_accepted_tokens_total",
                                          "draft tokens accepted", common.labels())) {}
  // Per draft position (0-based, as vLLM's): drafts whose token at that position was
  // accepted. Made on first use, so an instance shows the positions its k reaches.
  obs::Counter* accepted_at(size_t position) {
    while (spec_accepted_at.size() <= position) {
      obs::Labels labels = common.labels();
      labels.emplace_back("position", std::to_string(spec_accepted_at.size()));
      spec_accepted_at.push_back(make_counter(
          *registry, "tandem:spec_decode_num_accepted_tokens_per_pos_total",
          "draft tokens accepted, by their position in the draft", std::move(labels)));
    }
    return spec_accepted_at[position];
  }
  InstanceMetrics common;
  obs::Counter* fallbacks;
  obs::Counter* pulled_bytes;
  obs::Counter* pulled_blocks;
  obs::Counter* pull_failures;
  obs::Counter* taken;
  obs::Counter* cancelled;
  obs::Counter* spec_drafts;
  obs::Counter* spec_draft_tokens;
  obs::Counter* spec_accepted_tokens;
  std::vector<obs::Counter*> spec_accepted_at;  // <= DecodeCounters::spec_positions_max
  obs::Registry* registry = nullptr;
  decode::DecodeCounters exported;  // the scheduler's counters last exported
};

struct StepRun;  // one planned step in flight (below)

struct DecodeState {
  ShellContext ctx;
  ActorName self_name;
  std::optional<HandlerGuard> guard;  // the backstop of each message's handler
  caf::actor executor;
  ExecInfo info;
  ImportedBlocks imported;  // pulled blocks the next pass hands the executor
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<decode::DecodeScheduler> scheduler;
  std::unordered_map<uint64_t, Seq> seqs;
  // Nodes membership last reported down (at most the cluster's nodes): a request whose prefill
  // instance is on one of them prefills locally at once. The router may still pick such an
  // instance until it detects the loss itself, and decode hears of it only once.
  std::set<std::string> down_nodes;
  uint64_t seqs_created = 0;  // Seq::serial
  bool stepping = false;
  // The executor request in flight ([supervisor] executor_step_timeout_ms), and its step (for
  // ending the step's requests when it times out; null for a draft request).
  std::optional<ExecWatch> watch;
  std::shared_ptr<StepRun> exec_run;
  std::unique_ptr<DecodeMetrics> metrics;
  std::unique_ptr<KvEventReporter> kv_events;  // precise cache events to the routers
  // Requests cancelled because their tokens could not be sent: the error for the gateway is
  // retried every tick until it goes out (the gateway may be reachable again) or gives up.
  struct LostStream {
    ActorName to;
    uint64_t id = 0;
    uint32_t tokens_sent = 0;
    uint32_t attempts = 0;
  };
  static constexpr size_t lost_max = 4096;
  static constexpr uint32_t lost_attempts_max = 50;  // ticks (5 s)
  decode::LostStreams<LostStream> lost{lost_max, lost_attempts_max};
  // What the current step (or finished pull) produced for the gateways, sent as one
  // StepEvents frame per gateway when it is complete (flush_events). Bounded by the step:
  // at most a chunk and a finish per sequence in it.
  struct OutEvent {
    ActorName to;
    uint64_t id = 0;
    uint32_t first_index = 0;                      // chunk: index of tokens[0] in the output
    std::vector<int32_t> tokens;                   // chunk
    std::vector<devices::SampledToken> logprobs;   // chunk, when asked: one per token
    std::optional<wire::FinishReason> finish;      // set: a Finish, not a chunk
    uint32_t prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;  // finish
  };
  std::vector<OutEvent> outbox;
  // EAGLE-3 (info.draft_model): the scheduler's wants (scratch), sequences that ended since
  // the last draft request (their draft KV is released with it; at most kDraftForgetMax,
  // the device's own LRU bound covers any dropped), and failed draft requests.
  std::vector<decode::DecodeScheduler::DraftWant> draft_wants;
  std::vector<uint64_t> draft_forget;
  uint64_t draft_failures = 0;
  static inline const char* name = "tandem.decode";
};

using DecodeActor = caf::stateful_actor<DecodeState>;

constexpr size_t kDraftForgetMax = 4096;

// The scheduler's speculation counters, as Prometheus counters (by their increase).
void export_spec_counters(DecodeMetrics& m, const decode::DecodeCounters& now) {
  auto& was = m.exported;
  m.spec_drafts->inc(now.spec_drafts_count - was.spec_drafts_count);
  m.spec_draft_tokens->inc(now.spec_draft_tokens_count - was.spec_draft_tokens_count);
  m.spec_accepted_tokens->inc(now.spec_accepted_tokens_count - was.spec_accepted_tokens_count);
  for (size_t i = 0; i < now.spec_accepted_at.size(); ++i) {
    if (now.spec_accepted_at[i] != was.spec_accepted_at[i]) {
      m.accepted_at(i)->inc(now.spec_accepted_at[i] - was.spec_accepted_at[i]);
    }
  }
  was = now;
}

void update_metrics(DecodeState& st) {
  if (!st.metrics) return;
  export_spec_counters(*st.metrics, st.scheduler->counters());
  st.metrics->common.refresh(*st.cache, st.scheduler->waiting_count(), st.scheduler->active_count());
  st.kv_events->flush(*st.cache);
}

wire::FinishReason to_wire(decode::FinishReason reason) {
  switch (reason) {
    case decode::FinishReason::eos:
    case decode::FinishReason::stop_token: return wire::FinishReason::STOP;
    case decode::FinishReason::max_tokens:
    case decode::FinishReason::context_length: return wire::FinishReason::LENGTH;
    case decode::FinishReason::cancelled: return wire::FinishReason::CANCELLED;
    case decode::FinishReason::failed: return wire::FinishReason::ERROR;
  }
  return wire::FinishReason::ERROR;
}

bool wants_logprobs(const devices::SamplingParams& p) {
  return p.logprobs || p.logprobs_top_n > 0;
}

// The token (and a draft's verdict) is the row's argmax: no penalty changes the row, no
// logprob is reported.
// Greedy without penalties: the device returns each row's argmax (and, when logprobs are
// asked, each row scored beside it) instead of its logits.
bool argmax_suffices(const devices::SamplingParams& p) {
  return p.temperature == 0.0f && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

void write_event(wire::StepEvent::Builder b, const DecodeState::OutEvent& e) {
  if (e.finish) {
    auto f = b.initFinish();
    f.setRequestId(e.id);
    f.setReason(*e.finish);
    f.setPromptTokens(e.prompt_tokens);
    f.setCachedTokens(e.cached_tokens);
    f.setOutputTokens(e.output_tokens);
    return;
  }
  auto chunk = b.initTokenChunk();
  chunk.setRequestId(e.id);
  chunk.setFirstIndex(e.first_index);
  messages::set_tokens(chunk.initTokenIds(static_cast<unsigned>(e.tokens.size())), e.tokens);
  if (!e.logprobs.empty()) messages::set_logprobs(chunk, e.logprobs);
}

// An upper bound of an event's encoded size (capnp words: ids, pointers, list headers).
uint64_t event_bytes_bound(const DecodeState::OutEvent& e) {
  uint64_t bytes = 96 + 8 * uint64_t{e.tokens.size()};
  for (const auto& l : e.logprobs) bytes += 48 + 16 * uint64_t{l.top.size()};
  return bytes;
}

// Tells the gateway that a stream lost tokens and was cancelled. Its kind is an
// unavailability (`unimplemented`, as for a lost device), not a failed generation: the gateway
// routes the request again while nothing was streamed, else answers 503 with Retry-After
// (never the 500 of a server fault: the tokens were generated, the path to the client was not
// there).
Status send_lost(DecodeState& st, const DecodeState::LostStream& l) {
  return st.ctx.bridge->send(st.self_name, l.to, l.id, [&](wire::Envelope::Builder b) {
    auto e = b.getBody().initError();
    e.setRequestId(l.id);
    e.setKind(messages::to_wire(ErrorKind::unimplemented));
    e.setMessage("decode could not send the generated tokens; the request was cancelled");
    e.setTokensSent(l.tokens_sent);
  });
}

// Each tick: sends the errors not sent yet; keeps those that still cannot go.
void retry_lost(DecodeState& st) {
  std::string why;
  st.lost.retry(
      [&](const DecodeState::LostStream& l) {
        Status sent = send_lost(st, l);
        why = sent.ok() ? "" : sent.error().describe();
        return sent.ok();
      },
      [&](const DecodeState::LostStream& l) {
        st.ctx.log->warn("decode {}: request {}: could not tell {} that it failed: {}",
                         st.self_name.instance, l.id, l.to.to_string(), why);
      });
}

// Queues what `update` means for the gateway (a chunk, a finish) in the outbox; the caller
// flushes it once the step's updates are all in (flush_events).
void emit(DecodeActor* self, const decode::SeqUpdate& update) {
  auto& st = self->state;
  auto it = st.seqs.find(update.seq);
  if (it == st.seqs.end()) return;
  Seq& s = it->second;
  if (!update.tokens.empty() && !s.cancelled) {
    // The scheduler streams a prefix of what was sampled (it stops at EOS, a stop token or
    // the limit): the logprobs sent are those of exactly the tokens sent.
    DecodeState::OutEvent chunk{s.reply_to, update.seq, s.output_count, update.tokens};
    if (wants_logprobs(s.sampling)) {
      RT_ASSERT(s.unsent_logprobs.size() >= update.tokens.size(), update.seq,
                s.unsent_logprobs.size(), update.tokens.size());
      auto first = s.unsent_logprobs.begin();
      chunk.logprobs.assign(first, first + static_cast<ptrdiff_t>(update.tokens.size()));
    }
    st.outbox.push_back(std::move(chunk));
  }
  s.unsent_logprobs.clear();
  s.history.insert(s.history.end(), update.tokens.begin(), update.tokens.end());
  s.output_count += static_cast<uint32_t>(update.tokens.size());
  if (!update.finished) return;
  if (!s.cancelled) {
    DecodeState::OutEvent finish{s.reply_to, update.seq};
    finish.finish = to_wire(*update.finished);
    finish.prompt_tokens = s.prompt_tokens;
    finish.cached_tokens = s.cached_tokens;
    finish.output_tokens = s.output_count;
    st.outbox.push_back(std::move(finish));
  }
  st.seqs.erase(it);
}

// A frame of events could not be sent: each of its streams has a hole (or lacks its finish)
// now. Stop generating those (free the KV) and tell their gateway, if it can still be
// reached; the gateway also notices the gap or the missing finish itself.
void on_events_lost(DecodeState& st, std::span<const DecodeState::OutEvent> events,
                    const Error& why) {
  std::unordered_set<uint64_t> done;
  for (const auto& e : events) {
    if (!done.insert(e.id).second) continue;  // its first event says what the gateway has
    st.ctx.log->warn("decode {}: request {}: tokens not sent ({}); cancelling it",
                     st.self_name.instance, e.id, why.describe());
    if (auto it = st.seqs.find(e.id); it != st.seqs.end()) {
      (void)st.scheduler->cancel(e.id);
      st.seqs.erase(it);
    }
    DecodeState::LostStream lost{e.to, e.id, e.finish ? e.output_tokens : e.first_index, 0};
    if (!send_lost(st, lost).ok()) st.lost.push(lost);  // the tick retries it
  }
}

// Sends the outbox: per gateway (in order of first appearance), its events in order, in as
// few StepEvents frames as frame_bytes_max allows.
void flush_events(DecodeState& st) {
  if (st.outbox.empty()) return;
  std::vector<DecodeState::OutEvent> events = std::move(st.outbox);
  st.outbox.clear();
  uint64_t frame_budget = st.ctx.manifest->fabric.frame_bytes_max / 2;  // envelope, slack
  std::vector<bool> sent(events.size(), false);
  std::vector<DecodeState::OutEvent> frame;
  for (size_t first = 0; first < events.size(); ++first) {
    if (sent[first]) continue;
    const ActorName to = events[first].to;
    frame.clear();
    uint64_t bytes = 0;
    auto send_frame = [&] {
      Status ok = st.ctx.bridge->send(st.self_name, to, 0, [&](wire::Envelope::Builder b) {
        auto list = b.getBody().initStepEvents().initEvents(static_cast<unsigned>(frame.size()));
        for (unsigned i = 0; i < frame.size(); ++i) write_event(list[i], frame[i]);
      });
      if (!ok.ok()) on_events_lost(st, frame, ok.error());
      frame.clear();
      bytes = 0;
    };
    for (size_t i = first; i < events.size(); ++i) {
      if (sent[i] || !(events[i].to == to)) continue;
      sent[i] = true;
      uint64_t size = event_bytes_bound(events[i]);
      if (!frame.empty() && bytes + size > frame_budget) send_frame();
      bytes += size;
      frame.push_back(std::move(events[i]));
    }
    send_frame();
  }
}

void pump(DecodeActor* self);

void finish_pull(DecodeActor* self, uint64_t id, bool ok) {
  auto& st = self->state;
  auto it = st.seqs.find(id);
  RT_ASSERT(it != st.seqs.end(), id);
  Seq& s = it->second;
  if (!ok) st.metrics->fallbacks->inc();
  if (s.prefill) {  // release the hold on prefill either way
    (void)st.ctx.bridge->send(st.self_name, *s.prefill, id, [&](wire::Envelope::Builder b) {
      auto done = b.getBody().initKvPullDone();
      done.setRequestId(id);
      done.setOk(ok);
    });
  }
  s.unsent_logprobs.clear();
  if (ok && wants_logprobs(s.sampling)) s.unsent_logprobs.push_back(s.remote_first_logprobs);
  if (ok && s.order) {
    for (uint32_t index : s.order->pull_block_indexes) {
      st.imported.add(s.order->block_table[index], st.info.layout.blocks_total);
    }
  }
  auto update = st.scheduler->on_pull_done(id, ok, ok ? *s.remote_first : 0);
  if (s.cancelled) {
    st.seqs.erase(it);
  } else if (update.ok()) {
    emit(self, *update);
    update_metrics(st);  // before the events leave (see on the step's result)
    flush_events(st);
  }
  update_metrics(st);
  pump(self);
}

// Starts the RMA reads once both the local blocks (PullOrder) and the remote descriptors
// (PrefillResult) are known; falls back when the prefill failed.
void try_pull(DecodeActor* self, uint64_t id) {
  auto& st = self->state;
  Seq& s = st.seqs.at(id);
  auto* fabric = st.ctx.bridge->fabric();
  bool match = fabric != nullptr && s.order && s.remote.size() == s.order->block_table.size();
  decode::PullStart start = decode::pull_start(s.order.has_value(), s.pull_started,
                                               s.prefill_failed, s.cancelled,
                                               s.remote_first.has_value(), match);
  if (start == decode::PullStart::wait) return;  // no order yet, or prefill has not answered
  s.pull_started = true;
  if (!s.remote_first || s.prefill_failed || s.cancelled) return finish_pull(self, id, false);
  const auto& order = *s.order;
  if (start == decode::PullStart::fail) {
    st.ctx.log->warn("decode {}: request {}: prefill described {} blocks, expected {}",
                     st.self_name.instance, id, s.remote.size(), order.block_table.size());
    return finish_pull(self, id, false);
  }
  // Each block's reads, planned from its segments against our pool before any read starts: a
  // block whose parts do not fit ours (another shape, inner order, or layers missing) is
  // refused whole, and decode prefills locally.
  std::vector<std::vector<devices::KvCopy>> plans;
  plans.reserve(order.pull_block_indexes.size());
  size_t reads = 0;
  for (uint32_t index : order.pull_block_indexes) {
    const RemoteBlock& rb = s.remote[index];
    auto plan = devices::plan_block_copy(std::span<const devices::KvSource>(&rb.source, 1),
                                         st.info.layout, order.block_table[index]);
    if (!plan.ok()) {
      st.ctx.log->warn("decode {}: request {}: prefill's KV block {} cannot be read into ours: {}",
                       st.self_name.instance, id, index, plan.error().describe());
      return finish_pull(self, id, false);
    }
    reads += plan.value().size();
    plans.push_back(std::move(plan).value());
  }
  caf::actor me = caf::actor_cast<caf::actor>(self);
  if (auto done = s.reads.start(static_cast<uint32_t>(reads))) return finish_pull(self, id, *done);
  for (size_t b = 0; b < plans.size(); ++b) {
    const RemoteBlock& rb = s.remote[order.pull_block_indexes[b]];
    auto peer = fabric->peer(rb.address);
    for (size_t c = 0; c < plans[b].size(); ++c) {
      const devices::KvCopy& copy = plans[b][c];
      bool last = c + 1 == plans[b].size();
      Status started =
          peer.ok()
              ? fabric->read(
                    *peer, rb.region, copy.src_offset, *st.info.local, copy.dst_offset, copy.bytes,
                    [me, id, bytes = copy.bytes, last](Status done) {
                      caf::anon_send(
                          me, PullChunkDone{id, done.ok(), done.ok() ? "" : done.error().describe(),
                                            bytes, last});
                    })
              : Status(peer.error());
      if (!started.ok()) {
        caf::anon_send(me, PullChunkDone{id, false, started.error().describe(), 0, false});
      }
    }
  }
}

void on_chunk_done(DecodeActor* self, const PullChunkDone& done) {
  auto& st = self->state;
  auto it = st.seqs.find(done.seq);
  if (it == st.seqs.end()) return;
  Seq& s = it->second;
  RT_ASSERT(s.reads.left() > 0, done.seq);
  if (!done.ok && !s.reads.failed()) {
    st.ctx.log->warn("decode {}: KV pull of request {} failed: {}", st.self_name.instance,
                     done.seq, done.error);
  }
  if (done.ok) {
    st.metrics->pulled_bytes->inc(static_cast<double>(done.bytes));
    if (done.ends_block) st.metrics->pulled_blocks->inc();
  } else {
    st.metrics->pull_failures->inc();
  }
  if (auto pulled = s.reads.read_done(done.ok)) finish_pull(self, done.seq, *pulled);
}

// Runs one planned step: prefill chunks first, then decode tokens, then samples.
struct StepRun {
  decode::DecodePlan plan;
  std::vector<uint64_t> serials;  // per entry: the Seq::serial it was planned for
  std::vector<size_t> prefill_entries, decode_entries;  // indexes into plan.entries
  std::shared_ptr<const devices::StepOutput> prefill_out, decode_out;
};

bool request_drafts(DecodeActor* self, const std::vector<decode::SampledTokens>& sampled,
                    const std::vector<size_t>& decoded);
void pump(DecodeActor* self);

// An executor request goes out for `run` (null: drafts); its generation for watch_answered.
uint64_t watch_start(DecodeState& st, std::shared_ptr<StepRun> run) {
  st.exec_run = std::move(run);
  return st.watch->start(ExecWatch::Clock::now());
}

// True when the answer is for the request in flight; false for a late one (its request timed
// out and its step already ended): the executor answers again, so steps resume.
void on_cancel(DecodeActor* self, uint64_t id);

// The executor's device is lost: every request held here ends with that error (their gateways
// may retry them elsewhere), and new ones are refused (on_generate).
void fail_all(DecodeActor* self) {
  auto& st = self->state;
  std::vector<std::pair<uint64_t, ActorName>> held;
  for (const auto& [id, s] : st.seqs) held.emplace_back(id, s.reply_to);
  for (const auto& [id, to] : held) {
    // unimplemented: this instance cannot serve it; another may (retried), else 503.
    send_error(st.ctx, st.self_name, to, id,
               make_error(ErrorKind::unimplemented, st.watch->stall_reason()));
    on_cancel(self, id);
  }
}

// The step's executor did not answer within executor_step_timeout_ms: it is unavailable, not
// broken. Each request in the step ends with an `unimplemented` error, as when the device is
// lost (fail_all): its gateway routes it again while nothing was streamed, else answers 503
// (never the 500 of a failed generation).
void end_step_unavailable(DecodeActor* self, const StepRun& run) {
  auto& st = self->state;
  RT_ASSERT(run.serials.size() == run.plan.entries.size(), run.serials.size());
  std::unordered_set<uint64_t> seen;
  std::vector<std::pair<uint64_t, ActorName>> held;
  for (size_t i = 0; i < run.plan.entries.size(); ++i) {
    auto it = st.seqs.find(run.plan.entries[i].seq);
    if (it == st.seqs.end() || it->second.serial != run.serials[i]) continue;  // gone, replaced
    if (seen.insert(it->first).second) held.emplace_back(it->first, it->second.reply_to);
  }
  RT_ASSERT(held.size() <= run.plan.entries.size(), held.size());
  for (const auto& [id, to] : held) {
    send_error(st.ctx, st.self_name, to, id,
               make_error(ErrorKind::unimplemented, st.watch->stall_reason()));
    on_cancel(self, id);
  }
}

bool watch_answered(DecodeActor* self, uint64_t gen, const ExecResult* result = nullptr) {
  auto& st = self->state;
  if (result) {
    lose_device(st.ctx, *st.watch, st.self_name, "decode", result->device_lost, "its requests",
                [self] { fail_all(self); });
  }
  if (st.watch->answered(gen, ExecWatch::Clock::now())) {
    st.exec_run.reset();
    return true;
  }
  st.ctx.log->warn("decode {}: {}", st.self_name.instance, st.watch->late_text());
  pump(self);
  return false;
}

void finish_step(DecodeActor* self, const std::shared_ptr<StepRun>& run, const std::string& error) {
  auto& st = self->state;
  st.stepping = false;
  std::vector<decode::SampledTokens> sampled;
  std::vector<size_t> decoded;  // indexes into `sampled` of the decode pass's sequences
  auto sample_entry = [&](size_t entry_index, const devices::SeqOutput& out, uint32_t row,
                          bool in_decode_pass) {
    const auto& entry = run->plan.entries[entry_index];
    auto it = st.seqs.find(entry.seq);
    if (!entry.sample || it == st.seqs.end()) return;
    if (it->second.serial != run->serials[entry_index]) return;  // replaced meanwhile
    Seq& s = it->second;
    if (entry.draft_tokens_count > 0 || s.sampling.temperature == 0.0f) {
      // {last, drafts}: rows 0..d verify the drafts (spec_step.hpp); greedy without drafts is
      // one argmax there (no softmax over the vocabulary).
      std::span<const int32_t> drafts(entry.tokens.data() + 1, entry.draft_tokens_count);
      auto emitted = decode::verify_step(s.sampling, s.output_count,
                                         {out.logits, out.tokens, out.scored},
                                         st.info.model.vocab_size, drafts, s.history);
      if (!emitted.ok()) {
        st.ctx.log->warn("decode {}: request {}: verification failed: {}",
                         st.self_name.instance, entry.seq, emitted.error().describe());
        return;
      }
      decode::SampledTokens one{entry.seq, {}};
      for (auto& t : emitted->tokens) {
        one.tokens.push_back(t.token);
        if (wants_logprobs(s.sampling)) s.unsent_logprobs.push_back(std::move(t));
      }
      sampled.push_back(std::move(one));
      if (in_decode_pass) decoded.push_back(sampled.size() - 1);
      return;
    }
    auto token = sample_at(s.sampling, s.output_count, out, row, s.history,
                           st.info.model.vocab_size);
    if (!token.ok()) return;
    sampled.push_back({entry.seq, {token->token}});
    if (in_decode_pass) decoded.push_back(sampled.size() - 1);
    if (wants_logprobs(s.sampling)) s.unsent_logprobs.push_back(*token);
  };
  if (error.empty()) {
    for (size_t i = 0; i < run->prefill_entries.size(); ++i)
      sample_entry(run->prefill_entries[i], run->prefill_out->seqs[i], 0, false);
    for (size_t i = 0; i < run->decode_entries.size(); ++i) {
      const auto& out = run->decode_out->seqs[i];
      sample_entry(run->decode_entries[i], out, 0, true);
    }
  } else {
    st.ctx.log->error("decode {}: step failed: {}", st.self_name.instance, error);
  }
  // Entries without a sampled token (a failed step) finish with reason `failed`.
  for (const auto& update : st.scheduler->on_step_result(run->plan.step_id, sampled)) {
    if (update.finished && st.info.draft_model && st.draft_forget.size() < kDraftForgetMax) {
      st.draft_forget.push_back(update.seq);
    }
    emit(self, update);
  }
  // The step's counters are exported before its events leave, so a client that has its
  // answer scrapes counters that include the step that produced it.
  update_metrics(st);
  flush_events(st);
  if (st.info.draft_model && error.empty() && request_drafts(self, sampled, decoded)) return;
  pump(self);
}

// EAGLE-3: asks the executor's draft model for the next drafts of the running sequences the
// scheduler wants them for that were in this step's decode pass (the device kept their
// target states), giving each the tokens the step emitted for it. True when a request went
// out: its answer resumes the loop (pump), and no step is planned meanwhile (`stepping`), so
// the states the device kept stay the ones the request refers to.
bool request_drafts(DecodeActor* self, const std::vector<decode::SampledTokens>& sampled,
                    const std::vector<size_t>& decoded) {
  auto& st = self->state;
  st.scheduler->model_draft_wants(st.draft_wants);
  std::unordered_map<uint64_t, const decode::SampledTokens*> emitted;
  for (size_t i : decoded) {
    if (i < sampled.size()) emitted.emplace(sampled[i].seq, &sampled[i]);
  }
  auto batch = std::make_shared<std::vector<devices::DraftSeq>>();
  for (const auto& want : st.draft_wants) {
    auto it = emitted.find(want.seq);
    if (it == emitted.end() || it->second->tokens.empty()) continue;
    batch->push_back({want.seq, it->second->tokens, want.tokens});
  }
  if (batch->empty()) return false;
  auto forget = std::make_shared<std::vector<uint64_t>>(std::move(st.draft_forget));
  st.draft_forget.clear();
  st.stepping = true;
  uint64_t gen = watch_start(st, nullptr);
  self->request(st.executor, caf::infinite, atoms::exec_run::value,
                ExecBatch{ExecKind::draft, nullptr, nullptr, batch, forget})
      .then(
          [self, gen](const ExecResult& r) {
            if (!watch_answered(self, gen, &r)) return;
            auto& st = self->state;
            st.stepping = false;
            if (r.ok && r.drafts) {
              for (const auto& d : *r.drafts) st.scheduler->set_model_drafts(d.seq_id, d.tokens);
            } else if (st.draft_failures++ == 0) {  // once: the next steps would say the same
              st.ctx.log->warn("decode {}: the draft model failed ({}); decoding without its "
                               "drafts where it fails",
                               st.self_name.instance, r.error);
            }
            pump(self);
          },
          [self, gen](caf::error& e) {
            if (!watch_answered(self, gen)) return;
            auto& st = self->state;
            st.stepping = false;
            if (st.draft_failures++ == 0) {
              st.ctx.log->warn("decode {}: draft request failed: {}", st.self_name.instance,
                               to_string(e));
            }
            pump(self);
          });
  return true;
}

void run_decode_part(DecodeActor* self, const std::shared_ptr<StepRun>& run) {
  auto& st = self->state;
  if (run->decode_entries.empty()) return finish_step(self, run, "");
  auto batch = std::make_shared<std::vector<devices::DecodeSeq>>();
  for (size_t i : run->decode_entries) {
    const auto& e = run->plan.entries[i];
    // Greedy without penalties or logprobs needs only each row's argmax from the device.
    auto it = st.seqs.find(e.seq);
    bool argmax_only = it != st.seqs.end() && argmax_suffices(it->second.sampling);
    int32_t top_n = argmax_only && wants_logprobs(it->second.sampling)
                        ? it->second.sampling.logprobs_top_n
                        : -1;
    batch->push_back({e.seq, {e.block_table.begin(), e.block_table.end()}, e.start_position,
                      e.tokens, argmax_only, top_n});
  }
  batch->front().imported = st.imported.take();
  uint64_t gen = watch_start(st, run);
  self->request(st.executor, caf::infinite, atoms::exec_run::value,
                ExecBatch{ExecKind::decode, nullptr, batch})
      .then(
          [self, run, gen](const ExecResult& r) {
            if (!watch_answered(self, gen, &r)) return;
            bool sized = r.ok && r.output->seqs.size() == run->decode_entries.size();
            run->decode_out = r.output;
            finish_step(self, run, sized ? "" : (r.ok ? "wrong batch size" : r.error));
          },
          [self, run, gen](caf::error& e) {
            if (watch_answered(self, gen)) finish_step(self, run, "executor: " + to_string(e));
          });
}

void run_step(DecodeActor* self, decode::DecodePlan plan) {
  auto& st = self->state;
  auto run = std::make_shared<StepRun>();
  run->plan = std::move(plan);
  auto batch = std::make_shared<std::vector<devices::PrefillSeq>>();
  for (size_t i = 0; i < run->plan.entries.size(); ++i) {
    const auto& e = run->plan.entries[i];
    auto planned = st.seqs.find(e.seq);
    run->serials.push_back(planned == st.seqs.end() ? 0 : planned->second.serial);
    // One token (or a final one-token chunk), or a running sequence's {last, drafts}.
    bool is_decode = e.sample && (e.tokens.size() == 1 || e.draft_tokens_count > 0);
    (is_decode ? run->decode_entries : run->prefill_entries).push_back(i);
    if (!is_decode) {
      if (auto it = st.seqs.find(e.seq); it != st.seqs.end() && !it->second.first_chunk_planned) {
        it->second.first_chunk_planned = true;
        it->second.cached_tokens = std::max(it->second.cached_tokens, e.start_position);
      }
      batch->push_back({e.seq, {e.block_table.begin(), e.block_table.end()}, e.start_position,
                        e.tokens});
    }
  }
  st.stepping = true;
  if (batch->empty()) return run_decode_part(self, run);
  batch->front().imported = st.imported.take();
  uint64_t gen = watch_start(st, run);
  self->request(st.executor, caf::infinite, atoms::exec_run::value,
                ExecBatch{ExecKind::prefill, batch, nullptr})
      .then(
          [self, run, gen](const ExecResult& r) {
            if (!watch_answered(self, gen, &r)) return;
            if (!r.ok || r.output->seqs.size() != run->prefill_entries.size()) {
              return finish_step(self, run, r.ok ? "wrong batch size" : r.error);
            }
            run->prefill_out = r.output;
            run_decode_part(self, run);
          },
          [self, run, gen](caf::error& e) {
            if (watch_answered(self, gen)) finish_step(self, run, "executor: " + to_string(e));
          });
}

void pump(DecodeActor* self) {
  auto& st = self->state;
  if (st.stepping || !st.scheduler || st.watch->stalled()) return;
  auto plan = st.scheduler->plan_step();
  auto pulls = std::move(plan.pulls);
  // The step goes first: a pull that ends synchronously below (a failed prefill) calls
  // pump() again, which must see the step in flight.
  if (!plan.entries.empty()) run_step(self, std::move(plan));
  for (auto& pull : pulls) {
    auto it = st.seqs.find(pull.seq);
    RT_ASSERT(it != st.seqs.end(), pull.seq);
    it->second.order = std::move(pull);
    try_pull(self, it->first);
  }
}

Status check_prompt(const DecodeState& st, const std::vector<int32_t>& prompt) {
  uint32_t vocab = st.info.model.vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || uint32_t(prompt[i]) >= vocab) {
      return make_error(ErrorKind::invalid, "prompt token " + std::to_string(i) + " is " +
                                                std::to_string(prompt[i]) +
                                                ", outside the vocabulary [0, " +
                                                std::to_string(vocab) + ")");
    }
  }
  return {};
}

// `tier2_source`: the router's remote tier-2 copy of the prompt, passed on ("" = none).
void send_prefill_request(DecodeActor* self, uint64_t id, const Seq& s,
                          const std::vector<kv::BlockHash>& hashes, wire::SamplingParams::Reader sp,
                          capnp::Text::Reader tier2_source) {
  auto& st = self->state;
  Status sent = st.ctx.bridge->send(st.self_name, *s.prefill, id, [&](wire::Envelope::Builder b) {
    auto req = b.getBody().initPrefillRequest();
    req.setRequestId(id);
    std::vector<int32_t> prompt(s.history.begin(), s.history.begin() + s.prompt_tokens);
    messages::set_tokens(req.initPromptTokenIds(static_cast<unsigned>(prompt.size())), prompt);
    messages::set_hashes(req.initBlockHashes(static_cast<unsigned>(hashes.size())), hashes);
    req.setSampling(sp);
    req.setHoldTimeoutMs(st.ctx.manifest->prefill.hold_timeout_ms);
    req.setTier2Source(tier2_source);
  });
  if (!sent.ok()) {
    st.ctx.log->warn("decode {}: prefill {} unreachable ({}); prefilling {} locally",
                     st.self_name.instance, s.prefill->to_string(), sent.error().describe(), id);
    st.seqs.at(id).prefill_failed = true;
  }
}

void on_cancel(DecodeActor* self, uint64_t id);

void on_generate(DecodeActor* self, wire::Envelope::Reader envelope) {
  auto& st = self->state;
  auto req = envelope.getBody().getGenerateRequest();
  uint64_t id = req.getRequestId();
  auto reply_to = messages::ActorName::parse(req.getReplyTo().cStr());
  ActorName from = messages::get_name(envelope.getSource());
  if (!reply_to.ok()) return send_error(st.ctx, st.self_name, from, id, reply_to.error());
  // Tokens go back to the gateway that asked, never to one it names.
  if (*reply_to != from) {
    return send_error(st.ctx, st.self_name, from, id,
                      make_error(ErrorKind::invalid, "replyTo must be the sender"));
  }
  if (st.watch->lost()) {
    return send_error(st.ctx, st.self_name, *reply_to, id,
                      make_error(ErrorKind::unimplemented, st.watch->stall_reason()));
  }
  auto hashes = messages::get_hashes(req.getBlockHashes());
  auto sampling = messages::get_sampling(req.getSampling(), st.info.model.vocab_size);
  auto prompt = messages::get_tokens(req.getPromptTokenIds());
  Status prompt_ok = check_prompt(st, prompt);
  for (const Status& s : {hashes.ok() ? Status() : Status(hashes.error()),
                          sampling.ok() ? Status() : Status(sampling.error()), prompt_ok}) {
    if (!s.ok()) return send_error(st.ctx, st.self_name, *reply_to, id, s.error());
  }
  if (auto held = st.seqs.find(id); held != st.seqs.end()) {
    if (decode::on_duplicate(held->second.reply_to == *reply_to) == decode::Duplicate::refuse) {
      return send_error(st.ctx, st.self_name, *reply_to, id,
                        make_error(ErrorKind::invalid, "duplicate request id"));
    }
    // The gateway retries a request it gave up on here: the new attempt replaces the old.
    st.ctx.log->info("decode {}: request {} sent again by its gateway; replacing it",
                     st.self_name.instance, id);
    on_cancel(self, id);
    if (st.seqs.count(id)) {  // its KV pull is still in flight: it goes when the reads end
      return send_error(st.ctx, st.self_name, *reply_to, id,
                        make_error(ErrorKind::failed, "the request's previous attempt is still "
                                                      "pulling its KV here; retry"));
    }
  }
  auto limits = req.getLimits();
  uint32_t room = st.ctx.manifest->model.max_model_tokens - std::min<uint32_t>(
      static_cast<uint32_t>(prompt.size()), st.ctx.manifest->model.max_model_tokens);
  uint32_t max_tokens = limits.getMaxTokens() == 0 ? room : limits.getMaxTokens();
  std::string prefill_name = req.getPrefillInstance();
  decode::DecodeRequest core{id, prompt, *hashes, std::max<uint32_t>(max_tokens, 1),
                             std::nullopt, sampling->stop_token_ids,
                             prefill_name.empty() ? decode::KvSource::local : decode::KvSource::pull};
  core.speculate = !limits.getNoSpeculation();
  if (!limits.getIgnoreEos()) {
    core.eos_token = st.info.model.eos_id;
    // A model that emits BOS starts a new document (llama2.c models end stories this way).
    core.stop_token_ids.push_back(st.info.model.bos_id);
  }
  // Decode reuses whole blocks (a pull reads whole blocks).
  uint32_t cached = st.cache->match(*hashes) / st.cache->sub_blocks_per_block() *
                    st.info.layout.block_tokens;
  if (Status s = st.scheduler->submit(std::move(core)); !s.ok()) {
    return send_error(st.ctx, st.self_name, *reply_to, id, s.error());
  }
  Seq seq{*reply_to, *sampling, prompt, static_cast<uint32_t>(prompt.size()), 0, cached};
  seq.serial = ++st.seqs_created;
  if (!prefill_name.empty()) {
    auto prefill = messages::ActorName::parse(prefill_name);
    seq.prefill = prefill.ok() ? std::optional<ActorName>(*prefill) : std::nullopt;
    seq.prefill_failed = !prefill.ok() || st.down_nodes.count(prefill->node) > 0;
    seq.prefill_deadline =
        now_ns() + std::chrono::milliseconds(st.ctx.manifest->decode.prefill_timeout_ms);
  }
  auto [it, inserted] = st.seqs.emplace(id, std::move(seq));
  RT_ASSERT(inserted, id);
  st.metrics->taken->inc();
  if (it->second.prefill_failed) {
    st.ctx.log->warn("decode {}: request {}: prefill instance {} is down; prefilling locally",
                     st.self_name.instance, id, prefill_name);
  } else if (it->second.prefill) {
    send_prefill_request(self, id, it->second, *hashes, req.getSampling(), req.getTier2Source());
  }
  update_metrics(st);
  pump(self);
}

void prefill_failed(DecodeActor* self, uint64_t id, const std::string& why);

void on_prefill_result(DecodeActor* self, wire::PrefillResult::Reader result) {
  auto& st = self->state;
  auto it = st.seqs.find(result.getRequestId());
  if (it == st.seqs.end() || it->second.remote_first || it->second.prefill_failed) return;
  Seq& s = it->second;
  auto top = messages::get_top(result.getFirstTokenTop(), "PrefillResult.firstTokenTop");
  if (!top.ok()) return prefill_failed(self, it->first, top.error().describe());
  s.remote_first_logprobs.token = result.getFirstTokenId();
  s.remote_first_logprobs.logprob = std::min(0.0f, result.getFirstTokenLogprob());
  s.remote_first_logprobs.top = std::move(top).value();
  for (auto block : result.getBlocks()) s.remote.push_back(read_block_descriptor(block));
  s.remote_first = result.getFirstTokenId();
  s.cached_tokens = std::max(s.cached_tokens, result.getCachedTokens());
  try_pull(self, it->first);
}

void prefill_failed(DecodeActor* self, uint64_t id, const std::string& why) {
  auto& st = self->state;
  auto it = st.seqs.find(id);
  if (it == st.seqs.end() || !it->second.prefill || it->second.remote_first ||
      it->second.prefill_failed) {
    return;
  }
  st.ctx.log->warn("decode {}: prefill of request {} failed ({}); prefilling locally",
                   st.self_name.instance, id, why);
  it->second.prefill_failed = true;
  (void)st.ctx.bridge->send(st.self_name, *it->second.prefill, id, [&](wire::Envelope::Builder b) {
    b.getBody().initCancel().setRequestId(id);
  });
  try_pull(self, id);
}

void on_cancel(DecodeActor* self, uint64_t id) {
  auto& st = self->state;
  auto it = st.seqs.find(id);
  if (it == st.seqs.end()) return;
  Seq& s = it->second;
  s.cancelled = true;
  st.metrics->cancelled->inc();
  (void)st.scheduler->cancel(id);
  if (s.prefill && !s.pull_started) {
    (void)st.ctx.bridge->send(st.self_name, *s.prefill, id, [&](wire::Envelope::Builder b) {
      b.getBody().initCancel().setRequestId(id);
    });
  }
  // A pull in flight keeps the sequence until its reads end (finish_pull forgets it).
  bool pulling = s.pull_started && s.reads.left() > 0;
  if (!pulling && st.scheduler->stage(id) != decode::SeqStage::pulling) st.seqs.erase(it);
  update_metrics(st);
  pump(self);
}

// A message about request `id` counts only from the peer it concerns: its prefill instance
// (results, errors) or the gateway it streams to (cancels). Others are dropped.
bool from_request_peer(DecodeState& st, uint64_t id, wire::Envelope::Reader envelope,
                       bool prefill) {
  auto it = st.seqs.find(id);
  if (it == st.seqs.end()) return false;
  ActorName from = messages::get_name(envelope.getSource());
  const Seq& s = it->second;
  bool ok = prefill ? (s.prefill && *s.prefill == from) : s.reply_to == from;
  if (!ok) {
    st.ctx.log->warn("decode {}: dropped a message about request {} from {}, which does not "
                     "serve it", st.self_name.instance, id, from.to_string());
  }
  return ok;
}

void on_frame(DecodeActor* self, const runtime::InboundFrame& in) {
  auto& st = self->state;
  auto envelope = in.frame->envelope();
  auto body = envelope.getBody();
  switch (body.which()) {
    case wire::Envelope::Body::GENERATE_REQUEST:
      return on_generate(self, envelope);
    case wire::Envelope::Body::PREFILL_RESULT:
      if (!from_request_peer(st, body.getPrefillResult().getRequestId(), envelope, true)) return;
      return on_prefill_result(self, body.getPrefillResult());
    case wire::Envelope::Body::ERROR:
      if (!from_request_peer(st, body.getError().getRequestId(), envelope, true)) return;
      return prefill_failed(self, body.getError().getRequestId(), body.getError().getMessage());
    case wire::Envelope::Body::CANCEL:
      if (!from_request_peer(st, body.getCancel().getRequestId(), envelope, false)) return;
      return on_cancel(self, body.getCancel().getRequestId());
    case wire::Envelope::Body::KV_RESYNC:  // a router lost track of this cache's events
      st.ctx.log->info("decode {}: KV snapshot for {} ({})", st.self_name.instance,
                       messages::get_name(envelope.getSource()).to_string(),
                       std::string(body.getKvResync().getReason()));
      st.kv_events->request_snapshot();
      return update_metrics(st);
    case wire::Envelope::Body::PING:
      return runtime::answer_ping(st.ctx.bridge, st.self_name, envelope);
    default:
      st.ctx.log->warn("decode {}: ignoring message kind {}", st.self_name.instance,
                       static_cast<int>(body.which()));
  }
}

void on_membership(DecodeActor* self, const runtime::MembershipEvent& event) {
  auto& st = self->state;
  if (event.kind == runtime::MembershipEvent::Kind::down) {
    st.down_nodes.insert(event.node);
  } else {
    st.down_nodes.erase(event.node);
  }
  if (event.kind == runtime::MembershipEvent::Kind::up) return;
  std::vector<uint64_t> failed, orphaned;
  for (const auto& [id, s] : st.seqs) {
    if (s.prefill && s.prefill->node == event.node) failed.push_back(id);
    if (s.reply_to.node == event.node) orphaned.push_back(id);
  }
  for (uint64_t id : failed) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    Seq& s = it->second;
    if (s.remote_first && !s.pull_started && !s.prefill_failed) {
      // Prefill answered, but the KV it holds went with its node before decode could pull it
      // (the sequence was still waiting for decode blocks): prefill locally instead.
      st.ctx.log->warn("decode {}: request {}: node {} went down before its KV was pulled; "
                       "prefilling locally",
                       st.self_name.instance, id, event.node);
      s.prefill_failed = true;
      try_pull(self, id);
      continue;
    }
    prefill_failed(self, id, "node " + event.node + " is down");
  }
  for (uint64_t id : orphaned) on_cancel(self, id);  // nobody left to stream to
}

decode::DecodeConfig scheduler_config(const config::Manifest& m) {
  decode::DecodeConfig c;
  c.block_tokens = m.model.block_tokens;
  c.waiting_max = m.decode.waiting_max;
  c.seqs_max = m.decode.seqs_max;
  c.step_tokens_max = m.decode.step_tokens_max;
  c.max_model_tokens = m.model.max_model_tokens;
  c.spec = decode::spec_config(m.speculative);
  return c;
}

caf::behavior running(DecodeActor* self) {
  self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
  return {
      [self](const runtime::InboundFrame& in) {
        auto& st = self->state;
        st.guard->run_frame(st.self_name, in, [self, &in] { on_frame(self, in); });
      },
      [self](const PullChunkDone& done) { on_chunk_done(self, done); },
      [self](const runtime::MembershipEvent& event) { on_membership(self, event); },
      [](const runtime::InstanceLoadReport&) {},  // for the router; decode needs none
      [self](runtime::atoms::tick) {
        auto& st = self->state;
        auto now = now_ns();
        std::vector<uint64_t> late;
        for (const auto& [id, s] : st.seqs) {
          bool waiting = s.prefill && !s.remote_first && !s.prefill_failed;
          if (decode::prefill_timed_out(waiting, now, s.prefill_deadline)) late.push_back(id);
        }
        for (uint64_t id : late) prefill_failed(self, id, "no answer in time");
        if (!st.lost.empty()) retry_lost(st);
        if (st.watch->expired(ExecWatch::Clock::now())) {
          st.ctx.log->error(
              "decode {}: {}; its step's requests end with an error and no step "
              "runs until it answers",
              st.self_name.instance, st.watch->stall_reason());
          auto run = std::exchange(st.exec_run, nullptr);
          if (run) {
            end_step_unavailable(self, *run);
            finish_step(self, run, st.watch->stall_reason());
          } else {
            st.stepping = false;  // a draft request: decoding goes on without its drafts
          }
        }
        update_metrics(st);
        if (st.watch->stalled()) {
          report_not_ready(self, st.ctx, st.self_name, st.watch->stall_reason());
        } else {
          report_load(self, st.ctx, st.self_name, *st.cache, st.scheduler->waiting_count(),
                      st.scheduler->active_count());
        }
        self->delayed_send(self, shell_tick_interval, runtime::atoms::tick::value);
      },
  };
}

}  // namespace

caf::actor spawn_decode(caf::actor_system& system, const ShellContext& ctx,
                        const config::Instance& instance, caf::actor executor) {
  ActorName name{ctx.bridge->node(), "decode", instance.name};
  auto actor = runtime::spawn_fn(system, [ctx, name, executor](DecodeActor* self) -> caf::behavior {
    auto& st = self->state;
    st.ctx = ctx;
    st.self_name = name;
    st.guard.emplace(ctx, "decode");
    st.watch.emplace(std::chrono::milliseconds(ctx.manifest->supervisor.executor_step_timeout_ms));
    st.executor = executor;
    if (ctx.node_actor) {
      self->send(ctx.node_actor, runtime::atoms::subscribe::value, caf::actor_cast<caf::actor>(self));
    }
    await_exec_info(
        self, executor, "decode", [self](const ExecInfo& info) {
          auto& st = self->state;
          auto config = scheduler_config(*st.ctx.manifest);
          // Drafts are sized with the row cost the executor measured when it opened, if it did.
          if (info.row_cost > 0) {
            config.spec.row_cost = info.row_cost;
            config.spec.batch_row_costs = info.batch_row_costs;
          }
          if (Status valid = config.validate(info.layout.blocks_total); !valid.ok()) {
            st.ctx.log->error("decode {}: {}", st.self_name.instance, valid.error().describe());
            st.info.ok = false;
            st.info.error = valid.error().describe();
            self->send(self, runtime::atoms::tick::value);
            return;
          }
          st.cache = std::make_unique<kv::PrefixCache>(
              info.layout.blocks_total, info.layout.block_tokens,
              std::min(st.ctx.manifest->model.sub_block_tokens, info.layout.block_tokens));
          st.scheduler = std::make_unique<decode::DecodeScheduler>(config, *st.cache);
          st.metrics = std::make_unique<DecodeMetrics>(*st.ctx.metrics, st.self_name.instance);
          st.metrics->registry = st.ctx.metrics;
          if (config.spec.method != decode::SpecMethod::none) {
            make_gauge(*st.ctx.metrics, "tandem:spec_decode_row_cost",
                       "one more row's cost in a decode pass, in one-row passes, as drafts are "
                       "sized (measured when the executor opened, or [speculative] row_cost)",
                       st.metrics->common.labels())
                ->set(config.spec.row_cost);
          }
          st.kv_events = std::make_unique<KvEventReporter>(st.ctx, st.self_name);
          self->become(running(self));
        });
    return {
        [self](const runtime::InboundFrame& in) {  // only if the device failed
          auto envelope = in.frame->envelope();
          if (envelope.getBody().which() != wire::Envelope::Body::GENERATE_REQUEST) return;
          auto& st = self->state;
          auto req = envelope.getBody().getGenerateRequest();
          auto to = messages::ActorName::parse(req.getReplyTo().cStr());
          send_error(st.ctx, st.self_name, to.ok() ? *to : messages::get_name(envelope.getSource()),
                     req.getRequestId(),
                     make_error(ErrorKind::unimplemented, "decode has no device: " + st.info.error));
        },
        [](const runtime::MembershipEvent&) {},
        [](const runtime::InstanceLoadReport&) {},
        [self](runtime::atoms::tick) { not_ready_tick(self); },  // only if the device failed
    };
  });
  ctx.bridge->register_actor(name, actor);
  return actor;
}

}  // namespace tandem::actors
