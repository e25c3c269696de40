#include "actors/gateway/gateway_actor.hpp"

#include <openssl/sha.h>

#include "runtime/base/constant_time.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "actors/gateway/admission.hpp"
#include "actors/gateway/api_request.hpp"
#include "actors/gateway/api_response.hpp"
#include "actors/gateway/decode_health.hpp"
#include "actors/gateway/http_server.hpp"
#include "actors/gateway/output_parser.hpp"
#include "actors/gateway/preparer_pool.hpp"
#include "actors/gateway/retry_policy.hpp"
#include "actors/gateway/stop_matcher.hpp"
#include "actors/gateway/token_logprobs.hpp"
#include "kvstore/hashing.hpp"
#include "messages/convert.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/spawn.hpp"
#include "runtime/obs/recent.hpp"
#include "runtime/text/chat.hpp"
#include "runtime/text/model_chat.hpp"
#include "runtime/text/stream_decoder.hpp"
#include "runtime/text/tokenizer.hpp"

namespace tandem::actors {

// An HTTP request handed from the HTTP thread to the gateway actor.
struct HttpCall {
  std::shared_ptr<const gateway::HttpRequest> request;
  std::shared_ptr<gateway::ResponseStream> out;
  uint32_t preparer = 0;  // the slot of its preparer's gateway::PreparerPool
  uint64_t cost = 0;      // what it added to that slot's load
};
struct ClientGone {
  uint64_t request_id = 0;
};
// A generation request the preparer parsed, tokenized and hashed, for the gateway actor.
struct PreparedCall {
  HttpCall call;
  gateway::ApiKind api = gateway::ApiKind::chat_completions;
  gateway::GenerateSpec spec;
  std::vector<int32_t> prompt;
  std::vector<kv::BlockHash> hashes;
  int64_t max_tokens = 0;
};

// The node is stopping (GatewayService::stop, before the HTTP server closes): end every open
// request with a 503 "shutting down" (an error event and the terminator in a stream), refuse
// new ones, and answer with the streams that were ended, for the caller to wait until their
// last bytes reached their sockets.
struct DrainRequest {};
struct Drained {
  std::vector<std::shared_ptr<gateway::ResponseStream>> streams;
};

}  // namespace tandem::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::DrainRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::Drained)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::HttpCall)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::ClientGone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::actors::PreparedCall)

namespace tandem::actors {
namespace {

using gateway::ApiError;
using gateway::ApiKind;
using messages::ActorName;
using Clock = std::chrono::steady_clock;

using gateway::retries_max;
const gateway::HttpHeaderList json_headers = {{"Content-Type", "application/json"}};
const gateway::HttpHeaderList sse_headers = {{"Content-Type", "text/event-stream"},
                                             {"Cache-Control", "no-cache"}};

ApiError api_error(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

struct Req {
  ApiKind api = ApiKind::chat_completions;
  gateway::GenerateSpec spec;
  std::shared_ptr<gateway::ResponseStream> out;
  std::unique_ptr<gateway::IdGenerator> ids;
  std::unique_ptr<gateway::Renderer> renderer;
  std::unique_ptr<gateway::OutputParser> parser;
  std::unique_ptr<text::StreamDecoder> decoder;
  std::unique_ptr<gateway::StopMatcher> stops;
  std::optional<int32_t> logprobs_prev_id;  // the token before the next one (logprob text)
  std::vector<int32_t> prompt;
  std::vector<kv::BlockHash> hashes;
  int64_t max_tokens = 0;
  uint32_t cached_tokens = 0;
  std::optional<ActorName> decode;
  // The router asked for this attempt's pick, until it answers: only its reply (or error) is
  // taken, once; anyone else's, or a second one, is dropped.
  std::optional<ActorName> router_asked;
  std::string prefill;
  std::string tier2_source;  // the router's remote tier-2 copy ("node/kv-offload/name" or "")
  uint32_t tokens_received = 0;
  uint32_t reasoning_tokens = 0;  // of tokens_received, those inside <think>...</think>
  uint32_t tokens_held = 0;       // tokens whose text the output parser still holds back
  uint32_t retries_left = retries_max;
  bool tool_calls_seen = false;
  bool finished = false;
  // A stream's 200 and first bytes wait for its first token (or its end): until then a
  // failure (decode full, no instance) is a whole error answer, not an in-stream error.
  bool head_sent = false;
  std::string pending;  // stream bytes rendered before head_sent
  Clock::time_point start, last_token, last_activity;
  bool got_first = false;
};

struct Metrics {
  obs::Histogram* ttft;
  obs::Histogram* itl;
  obs::Histogram* e2e;
  obs::Counter* prompt_tokens;
  obs::Counter* generation_tokens;
  obs::Gauge* running;
  obs::Gauge* waiting;
  obs::Counter* errors;
  obs::Registry* registry;  // for errors_by_type's series (bounded: the API's error types)
  obs::Labels labels;
  // TTFT and ITL over the last minute (RecentHistogram), p50 and p90, for `status`.
  obs::RecentHistogram recent_ttft, recent_itl;
  obs::Gauge* ttft_recent_p50;
  obs::Gauge* ttft_recent_p90;
  obs::Gauge* itl_recent_p50;
  obs::Gauge* itl_recent_p90;
  obs::Gauge* ttft_recent_count;
  // Messages about a request from a peer that is not serving it (a route reply from a router
  // not asked, an error from an instance not holding it): dropped and counted.
  obs::Counter* protocol_refused;
  // tandem:request_errors_by_type_total{type}: an error answer's OpenAI/Anthropic error type.
  void count_error(const std::string& type) {
    errors->inc();
    auto labelled = labels;
    labelled.emplace_back("type", type.empty() ? "api_error" : type);
    make_counter(*registry, "tandem:request_errors_by_type_total",
                 "requests that ended in an error, by the error's type", std::move(labelled))
        ->inc();
  }
  // From the histograms into the recent windows and their gauges (the gateway's tick).
  void refresh_recent(std::chrono::steady_clock::time_point now) {
    recent_ttft.record(now, ttft->bucket_counts());
    recent_itl.record(now, itl->bucket_counts());
    double nan = std::numeric_limits<double>::quiet_NaN();
    ttft_recent_p50->set(recent_ttft.quantile(0.5).value_or(nan));
    ttft_recent_p90->set(recent_ttft.quantile(0.9).value_or(nan));
    itl_recent_p50->set(recent_itl.quantile(0.5).value_or(nan));
    itl_recent_p90->set(recent_itl.quantile(0.9).value_or(nan));
    ttft_recent_count->set(static_cast<double>(recent_ttft.count()));
  }
};

// Written by the gateway actor, read by the HTTP thread (/health, the admission check).
// The HTTP thread answers /health from here, maybe before the gateway actor first ran: so it
// starts unhealthy with the reason of a DecodeHealth that has heard nothing yet (a /health
// 200 before any decode instance reported was a CI failure: the POSTs after it got 503).
struct Shared {
  explicit Shared(std::string starting_reason) : unhealthy_reason(std::move(starting_reason)) {
    RT_ASSERT(!unhealthy_reason.empty());
  }
  std::atomic<bool> healthy{false};
  std::atomic<bool> draining{false};  // the node is stopping: new requests get 503
  // The node drains (SIGTERM): new requests get 503 shutting_down and /health says so, while
  // the requests already taken run to their end.
  std::atomic<bool> closing{false};
  std::mutex mutex;
  std::string unhealthy_reason;  // guarded by mutex; "" when healthy

  std::string reason() {
    std::lock_guard<std::mutex> lock(mutex);
    return unhealthy_reason;
  }
};

struct GatewayState {
  ShellContext ctx;
  ActorName self_name;
  std::optional<HandlerGuard> guard;  // the backstop of each message's handler
  std::shared_ptr<text::Tokenizer> tokenizer;
  text::ChatFormat format = text::ChatFormat::plain;
  std::vector<ActorName> routers;
  std::unique_ptr<gateway::DecodeHealth> health;  // which decode instances can serve
  std::shared_ptr<Shared> shared;
  std::map<uint64_t, Req> requests;  // admitted, <= admission->running_max() when admitted
  std::optional<gateway::Admission> admission;  // who runs, waits or is refused
  std::map<uint64_t, PreparedCall> queued;     // waiting for admission, <= gateway.queue_max
  uint64_t next_id = 0;
  uint64_t id_seed = 0;
  std::unique_ptr<Metrics> metrics;
  static inline const char* name = "tandem.gateway";
  // The actor stops (a crash, the node's exit): no request is cut silently (end_all).
  ~GatewayState();
};

using GatewayActor = caf::stateful_actor<GatewayState>;

Metrics make_metrics(obs::Registry& r, const std::string& instance) {
  obs::Labels l = {{"instance", instance}};
  auto latency = obs::exponential_buckets(0.001, 2.0, 18);
  auto quantile = [&](const char* name, const char* help, const char* q) {
    obs::Labels with = l;
    with.emplace_back("quantile", q);
    return make_gauge(r, name, help, with);
  };
  constexpr auto window = std::chrono::seconds(60), step = std::chrono::seconds(5);
  constexpr const char* ttft_help = "time to first token over the last minute (NaN: none)";
  constexpr const char* itl_help = "time between output tokens over the last minute (NaN: none)";
  return Metrics{
      make_histogram(r, "tandem:time_to_first_token_seconds", "time to first token", latency, l),
      make_histogram(r, "tandem:inter_token_latency_seconds", "time between output tokens", latency,
                     l),
      make_histogram(r, "tandem:e2e_request_latency_seconds", "request latency", latency, l),
      make_counter(r, "tandem:prompt_tokens_total", "prompt tokens received", l),
      make_counter(r, "tandem:generation_tokens_total", "tokens generated", l),
      make_gauge(r, "tandem:num_requests_running", "requests in flight at the gateway", l),
      make_gauge(r, "tandem:num_requests_waiting",
                 "requests waiting for admission at the gateway (gateway.queue_max)", l),
      make_counter(r, "tandem:request_errors_total", "requests that ended in an error", l),
      &r,
      l,
      obs::RecentHistogram(latency, window, step),
      obs::RecentHistogram(latency, window, step),
      quantile("tandem:time_to_first_token_recent_seconds", ttft_help, "0.5"),
      quantile("tandem:time_to_first_token_recent_seconds", ttft_help, "0.9"),
      quantile("tandem:inter_token_latency_recent_seconds", itl_help, "0.5"),
      quantile("tandem:inter_token_latency_recent_seconds", itl_help, "0.9"),
      make_gauge(r, "tandem:time_to_first_token_recent_count",
                 "first tokens sent over the last minute", l),
      make_counter(r, "tandem:gateway_protocol_refused_total",
                   "messages about a request from a peer not serving it (dropped)", l)};
}

void update_health(GatewayState& st) {
  bool healthy = st.health->healthy();
  std::string reason = st.health->reason();
  RT_ASSERT(healthy == reason.empty(), reason);
  {
    std::lock_guard<std::mutex> lock(st.shared->mutex);
    if (reason != st.shared->unhealthy_reason) {
      st.ctx.log->info("gateway: {}", healthy ? "a decode instance is ready" : reason);
      st.shared->unhealthy_reason = std::move(reason);
    }
  }
  st.shared->healthy.store(healthy);
  st.admission->set_decode_ready(st.health->ready_count());
}

void admit_queued(GatewayActor* self);

// Ends a request with an error: a whole error response before the stream started, an error
// event in the stream after.
// A 503 with Retry-After: the text was generated but the path from decode was full, an
// overload the client retries, not a server fault.
ApiError lost_tokens_error() {
  return api_error(503, "overloaded_error",
                   "part of the generated text was lost between decode and the gateway "
                   "(decode's send queue was full); retry the request",
                   "tokens_lost");
}

// Whether an error answer tells the client to retry: it then carries Retry-After.
bool says_retry(const ApiError& e) {
  return e.http_status == 429 || e.http_status == 503 || e.code == "tokens_lost" ||
         e.code == "gateway_stopped";
}

void reply_error(ApiKind api, gateway::ResponseStream& out, const ApiError& error);

// A stream's head: the 200, the renderer's opening bytes and what was rendered meanwhile.
void open_stream(Req& r) {
  if (!r.spec.stream || r.head_sent) return;
  r.head_sent = true;
  r.out->start(200, sse_headers);
  r.out->write(std::move(r.pending));
  r.pending.clear();
}

// A request left the running set: its admission slot goes to the oldest waiting one.
void release(GatewayActor* self, uint64_t id) {
  auto& st = self->state;
  st.metrics->running->set(static_cast<double>(st.requests.size()));
  (void)st.admission->finished(id);
  admit_queued(self);
}

void fail(GatewayActor* self, uint64_t id, const ApiError& error) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  Req& r = it->second;
  st.metrics->count_error(error.type);
  if (r.decode && !r.finished) {
    (void)st.ctx.bridge->send(st.self_name, *r.decode, id, [&](wire::Envelope::Builder b) {
      b.getBody().initCancel().setRequestId(id);
    });
  }
  if (r.spec.stream && r.renderer && r.head_sent) {
    r.out->write(r.renderer->feed(gateway::StreamError{error}));
    r.out->end();
  } else {
    reply_error(r.api, *r.out, error);
  }
  st.requests.erase(it);
  release(self, id);
}

void write_events(Req& r, const std::vector<gateway::GenEvent>& events) {
  std::string bytes;
  for (const auto& e : events) {
    if (std::holds_alternative<gateway::ToolCallStart>(e)) r.tool_calls_seen = true;
    bytes += r.renderer->feed(e);
  }
  if (!r.spec.stream || bytes.empty()) return;
  if (r.head_sent) {
    r.out->write(std::move(bytes));
  } else {
    r.pending += bytes;
  }
}

// A token counts as reasoning when the parser was inside <think> before or after its text;
// tokens whose text the parser held back (a marker not yet complete, e.g. "<thi") go with
// the state the parser enters once it has decided.
void count_reasoning(Req& r, bool reasoning_before) {
  if (!r.parser) return;
  if (reasoning_before || r.parser->in_reasoning()) {
    r.reasoning_tokens += 1 + r.tokens_held;
    r.tokens_held = 0;
  } else if (r.parser->holding()) {
    ++r.tokens_held;
  } else {
    r.tokens_held = 0;
  }
}

void emit_text(Req& r, const std::string& text) {
  if (text.empty()) return;
  if (r.parser) return write_events(r, r.parser->feed(text));
  write_events(r, {gateway::TextDelta{text}});
}

void complete(GatewayActor* self, uint64_t id, gateway::FinishReason reason,
              const std::string& stop_string, uint32_t cached_tokens) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  Req& r = it->second;
  r.finished = true;
  open_stream(r);
  if (reason != gateway::FinishReason::stop_string) emit_text(r, r.decoder->finish());
  if (reason != gateway::FinishReason::stop_string) emit_text(r, r.stops->flush());
  if (r.parser) write_events(r, r.parser->finish());
  if (reason == gateway::FinishReason::stop && r.tool_calls_seen) {
    reason = gateway::FinishReason::tool_calls;
  }
  gateway::Usage usage{static_cast<int64_t>(r.prompt.size()), cached_tokens,
                       static_cast<int64_t>(r.tokens_received),
                       static_cast<int64_t>(r.reasoning_tokens)};
  RT_ASSERT(r.reasoning_tokens <= r.tokens_received, r.reasoning_tokens, r.tokens_received);
  write_events(r, {gateway::Finish{reason, stop_string}, gateway::UsageReport{usage}});
  if (r.spec.stream) {
    r.out->end();
  } else {
    r.out->send(200, json_headers, r.renderer->body());
  }
  st.metrics->e2e->observe(std::chrono::duration<double>(Clock::now() - r.start).count());
  st.requests.erase(it);
  release(self, id);
}

// Decode messages count only from the decode instance the request is on now: after a retry
// on another instance, late messages from the first one (cancelled, but its tokens may
// already be on the way) must not be mixed into the answer.
bool from_current_decode(const Req& r, const ActorName& source) {
  return r.decode && *r.decode == source;
}

void on_tokens(GatewayActor* self, wire::TokenChunk::Reader chunk, const ActorName& source) {
  auto& st = self->state;
  uint64_t id = chunk.getRequestId();
  auto it = st.requests.find(id);
  if (it == st.requests.end() || it->second.finished) return;
  Req& r = it->second;
  if (!from_current_decode(r, source)) return;
  // Chunks arrive in order over one connection; a gap means decode could not send one (its
  // send queue to this node was full). Fail the request rather than stream text with a hole.
  if (chunk.getFirstIndex() != r.tokens_received) {
    st.ctx.log->warn("gateway: request {}: tokens from index {} arrived after {}: a chunk from "
                     "decode was lost", id, chunk.getFirstIndex(), r.tokens_received);
    return fail(self, id, lost_tokens_error());
  }
  open_stream(r);  // the first token: decode took the request, the answer is 200
  auto now = Clock::now();
  std::vector<gateway::TokenLogprobs> logprobs;
  if (r.spec.sampling.logprobs) {
    auto sampled = messages::get_logprobs(chunk);
    if (!sampled.ok() || sampled->size() != chunk.getTokenIds().size()) {
      st.ctx.log->warn("gateway: request {}: bad logprobs from decode: {}", id,
                       sampled.ok() ? "none" : sampled.error().describe());
      return fail(self, id, gateway::generation_failed_error());
    }
    logprobs = gateway::token_logprobs(*sampled, r.logprobs_prev_id,
                                       [&st](std::optional<int32_t> prev, int32_t token) {
                                         return st.tokenizer->decode_piece(prev, token);
                                       });
  }
  // One getter call: each counts the whole list against the frame's traversal limit.
  const auto token_ids = chunk.getTokenIds();
  for (unsigned i = 0; i < token_ids.size(); ++i) {
    int32_t token = token_ids[i];
    if (!logprobs.empty()) write_events(r, {gateway::LogprobsDelta{{logprobs[i]}}});
    if (!r.got_first) {
      r.got_first = true;
      st.metrics->ttft->observe(std::chrono::duration<double>(now - r.start).count());
    } else {
      st.metrics->itl->observe(std::chrono::duration<double>(now - r.last_token).count());
    }
    r.last_token = now;
    ++r.tokens_received;
    st.metrics->generation_tokens->inc();
    // The end-of-sequence token ends the output; its text (an HF added token such as
    // MiniMax-M2's "[e~[") is not part of it.
    if (st.tokenizer->eos_id() == token) continue;
    auto out = r.stops->feed(r.decoder->push(token));
    const bool reasoning_before = r.parser && r.parser->in_reasoning();
    emit_text(r, out.text);
    count_reasoning(r, reasoning_before);
    if (out.matched) {
      (void)st.ctx.bridge->send(st.self_name, *r.decode, id, [&](wire::Envelope::Builder b) {
        b.getBody().initCancel().setRequestId(id);
      });
      return complete(self, id, gateway::FinishReason::stop_string, *out.matched, r.cached_tokens);
    }
  }
  r.last_activity = now;
}

void on_finish(GatewayActor* self, wire::Finish::Reader f, const ActorName& source) {
  auto& st = self->state;
  auto it = st.requests.find(f.getRequestId());
  if (it == st.requests.end() || !from_current_decode(it->second, source)) return;
  gateway::FinishReason reason = gateway::FinishReason::stop;
  switch (f.getReason()) {
    case wire::FinishReason::STOP: reason = gateway::FinishReason::stop; break;
    case wire::FinishReason::LENGTH: reason = gateway::FinishReason::length; break;
    case wire::FinishReason::STOP_STRING: reason = gateway::FinishReason::stop_string; break;
    case wire::FinishReason::CANCELLED:
    case wire::FinishReason::ERROR:
      return fail(self, f.getRequestId(), gateway::generation_failed_error());
  }
  if (f.getOutputTokens() != it->second.tokens_received) {  // the last chunk(s) were lost
    st.ctx.log->warn("gateway: request {}: decode finished after {} tokens, {} arrived",
                     f.getRequestId(), f.getOutputTokens(), it->second.tokens_received);
    return fail(self, f.getRequestId(), lost_tokens_error());
  }
  complete(self, f.getRequestId(), reason, f.getMatchedStop(),
           std::max(it->second.cached_tokens, f.getCachedTokens()));
}

void route(GatewayActor* self, uint64_t id);

// A decode error or a dead decode node: retry if nothing was streamed yet.
void on_failure(GatewayActor* self, uint64_t id, ErrorKind kind, const std::string& message) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  Req& r = it->second;
  gateway::RetryDecision decision = gateway::decide_retry(kind, r.tokens_received, r.retries_left);
  if (decision.retry) {
    --r.retries_left;
    st.ctx.log->warn("gateway: request {} failed before its first token ({}); routing again",
                     id, message);
    r.decode.reset();
    return route(self, id);
  }
  if (kind == ErrorKind::overloaded && !r.head_sent) {
    // Decode refused it (full: another gateway's load, or a cancel it had not seen yet).
    // Nothing was sent: the client gets a 429 with Retry-After, never an in-stream error.
    return fail(self, id,
                api_error(429, "rate_limit_error",
                          "no decode instance can take it now (" + message + "); retry later",
                          "rate_limit_exceeded"));
  }
  fail(self, id, api_error(decision.http_status, std::string(decision.type), message));
}

void send_generate(GatewayActor* self, uint64_t id) {
  auto& st = self->state;
  Req& r = st.requests.at(id);
  const auto& s = r.spec.sampling;
  Status sent = st.ctx.bridge->send(st.self_name, *r.decode, id, [&](wire::Envelope::Builder b) {
    auto g = b.getBody().initGenerateRequest();
    g.setRequestId(id);
    messages::set_tokens(g.initPromptTokenIds(static_cast<unsigned>(r.prompt.size())), r.prompt);
    messages::set_hashes(g.initBlockHashes(static_cast<unsigned>(r.hashes.size())), r.hashes);
    auto sp = g.initSampling();
    sp.setTemperature(static_cast<float>(s.temperature));
    sp.setTopP(static_cast<float>(s.top_p));
    sp.setTopK(s.top_k > 0 ? static_cast<int32_t>(s.top_k) : 0);
    sp.setMinP(static_cast<float>(s.min_p));
    sp.setRepetitionPenalty(static_cast<float>(s.repetition_penalty));
    sp.setPresencePenalty(static_cast<float>(s.presence_penalty));
    sp.setFrequencyPenalty(static_cast<float>(s.frequency_penalty));
    sp.setSeed(s.seed.value_or(id));
    sp.setHasSeed(s.seed.has_value());
    sp.setLogprobsTopN(s.logprobs ? static_cast<uint32_t>(s.top_logprobs) : 0);
    sp.setLogprobs(s.logprobs);
    g.getLimits().setMaxTokens(static_cast<uint32_t>(r.max_tokens));
    g.getLimits().setNoSpeculation(!s.speculative);
    g.setPrefillInstance(r.prefill);
    g.setTier2Source(r.tier2_source);
    g.setReplyTo(st.self_name.to_string());
    g.setCacheSalt(r.spec.cache_salt);
  });
  if (!sent.ok()) on_failure(self, id, sent.error().kind, "decode unreachable: " + sent.error().message);
}

void route(GatewayActor* self, uint64_t id) {
  auto& st = self->state;
  Req& r = st.requests.at(id);
  if (st.routers.empty()) {
    return fail(self, id, api_error(503, "overloaded_error", "the cluster has no router"));
  }
  const ActorName& router = st.routers[id % st.routers.size()];
  r.last_activity = Clock::now();
  r.router_asked = router;
  Status sent = st.ctx.bridge->send(st.self_name, router, id, [&](wire::Envelope::Builder b) {
    auto q = b.getBody().initRouteRequest();
    q.setRequestId(id);
    q.setPromptTokens(static_cast<uint32_t>(r.prompt.size()));
    messages::set_hashes(q.initBlockHashes(static_cast<unsigned>(r.hashes.size())), r.hashes);
  });
  if (!sent.ok()) {
    fail(self, id, api_error(503, "overloaded_error", "router unreachable: " + sent.error().message));
  }
}

void on_route_reply(GatewayActor* self, uint64_t id, wire::RouteReply::Reader reply,
                    const ActorName& source) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  Req& r = it->second;
  if (!r.router_asked || *r.router_asked != source || r.decode) {
    st.metrics->protocol_refused->inc();
    return;
  }
  r.router_asked.reset();
  auto decode = ActorName::parse(reply.getDecodeInstance().cStr());
  if (!decode.ok() || decode->role != "decode" ||
      !st.ctx.manifest->find_node(decode->node)) {
    return fail(self, id, api_error(500, "api_error", "the router picked no decode instance"));
  }
  r.decode = *decode;
  r.prefill = reply.getPrefillInstance();
  r.tier2_source = reply.getTier2Source();
  // usage.cached_tokens comes from decode (what was really not computed), not from the
  // router's belief (reply.getCachedBlocks()), which can be stale.
  send_generate(self, id);
}

gateway::ApiResult<ApiKind> api_of(const gateway::HttpRequest& request) {
  static const std::map<std::string, ApiKind> paths = {
      {"/v1/chat/completions", ApiKind::chat_completions},
      {"/v1/completions", ApiKind::completions},
      {"/v1/responses", ApiKind::responses},
      {"/v1/messages", ApiKind::messages},
      {"/v1/messages/count_tokens", ApiKind::count_tokens}};
  auto it = paths.find(request.path);
  if (it == paths.end()) {
    return api_error(404, "not_found_error", "no route for " + request.method + " " + request.path,
                     "not_found");
  }
  return it->second;
}

text::Conversation to_text(const gateway::Conversation& c) {
  text::Conversation out;
  out.tools_json = c.tools_json;
  out.add_generation_prompt = c.add_generation_prompt;
  for (const auto& m : c.messages) {
    text::ChatMessage t;
    t.role = static_cast<text::ChatRole>(static_cast<int>(m.role));
    t.content = m.content;
    t.reasoning = m.reasoning;
    t.tool_call_id = m.tool_call_id;
    t.name = m.name;
    for (const auto& call : m.tool_calls) t.tool_calls.push_back({call.id, call.name, call.arguments_json});
    out.messages.push_back(std::move(t));
  }
  return out;
}

// tool_choice "required" / named: the prompt ends with the start of a tool call (chat.hpp:
// tool_call_prefix), which the output parser is fed first; "" for auto and none.
gateway::ApiResult<std::string> forced_tool_prefix(text::ChatFormat format,
                                                   const gateway::GenerateSpec& spec) {
  const auto mode = spec.tool_choice.mode;
  if (spec.prompt_kind != gateway::PromptKind::conversation ||
      (mode != gateway::ToolChoiceMode::required && mode != gateway::ToolChoiceMode::named)) {
    return std::string();
  }
  auto prefix = text::tool_call_prefix(format, spec.tool_choice.name);
  if (!prefix.ok()) {
    return gateway::invalid_request("tool_choice", prefix.error().message);
  }
  return std::move(prefix).value();
}

// The prompt's tokens. Text prompts are encoded with a budget of `tokens_max` tokens
// (encode_capped): one far longer stops early with `exceeded` (count_tokens: SIZE_MAX).
gateway::ApiResult<text::Tokenizer::Capped> tokenize(text::Tokenizer& tokenizer,
                                                     text::ChatFormat format,
                                                     const gateway::GenerateSpec& spec,
                                                     size_t tokens_max) {
  int32_t vocab = tokenizer.vocab_size();
  switch (spec.prompt_kind) {
    case gateway::PromptKind::conversation: {
      text::Conversation conversation = to_text(spec.conversation);
      // tool_choice "none": the model is not shown the tools (and no calls are parsed).
      if (spec.tool_choice.mode == gateway::ToolChoiceMode::none) conversation.tools_json.clear();
      auto text = text::render_chat(format, conversation);
      if (!text.ok()) return gateway::invalid_request("messages", text.error().message);
      auto forced = forced_tool_prefix(format, spec);
      if (!forced.ok()) return forced.error();
      return tokenizer.encode_capped(*text + forced.value(), format == text::ChatFormat::plain,
                                     tokens_max);
    }
    case gateway::PromptKind::text:
      return tokenizer.encode_capped(spec.prompt_text, format == text::ChatFormat::plain,
                                     tokens_max);
    case gateway::PromptKind::token_ids: {
      std::vector<int32_t> ids;
      for (size_t i = 0; i < spec.prompt_token_ids.size(); ++i) {
        int64_t t = spec.prompt_token_ids[i];
        if (t < 0 || t >= vocab) {
          return gateway::invalid_request("prompt[" + std::to_string(i) + "]",
                                          "token id " + std::to_string(t) +
                                              " is outside the vocabulary [0, " +
                                              std::to_string(vocab) + ")");
        }
        ids.push_back(static_cast<int32_t>(t));
      }
      text::Tokenizer::Capped out;
      out.exceeded = ids.size() > tokens_max;
      out.ids = std::move(ids);
      return out;
    }
  }
  return gateway::invalid_request("prompt", "unsupported prompt");
}

gateway::OutputParserConfig parser_config(text::ChatFormat format, const gateway::GenerateSpec& s) {
  gateway::OutputParserConfig c;
  c.tools_json = s.conversation.tools_json;
  const bool no_tools = s.tool_choice.mode == gateway::ToolChoiceMode::none;
  if (format == text::ChatFormat::minimax_m2) {
    c.reasoning = true;
    c.starts_in_reasoning = true;
    c.tool_format = no_tools ? gateway::ToolCallFormat::none : gateway::ToolCallFormat::minimax_m2;
  } else if (format == text::ChatFormat::chatml) {
    c.reasoning = true;
    c.tool_format = no_tools ? gateway::ToolCallFormat::none : gateway::ToolCallFormat::qwen;
  }
  return c;
}

// A whole error answer; one that says retry (says_retry) carries Retry-After.
void reply_error(ApiKind api, gateway::ResponseStream& out, const ApiError& error) {
  gateway::HttpHeaderList headers = json_headers;
  if (says_retry(error)) {
    headers.push_back({"Retry-After", std::to_string(gateway::Admission::retry_after_s)});
  }
  out.send(static_cast<uint32_t>(error.http_status), std::move(headers),
           gateway::render_error_body(api, error));
}

// An overload answer (429 full, 503 nothing can serve or waited too long): retry soon.
void reply_busy(ApiKind api, gateway::ResponseStream& out, const ApiError& error) {
  RT_ASSERT(error.http_status == 429 || error.http_status == 503, error.http_status);
  RT_ASSERT(says_retry(error), error.http_status);
  reply_error(api, out, error);
}

ApiError refusal_error(const gateway::AdmissionRefusal& refusal) {
  RT_ASSERT(refusal.retry_after_s >= 1, refusal.retry_after_s);
  return api_error(refusal.http_status, refusal.type, refusal.message, refusal.code);
}

// A request names [model] name, one of its served_names, or nothing (the model's name).
std::optional<ApiError> unknown_model(const config::Manifest& m, const gateway::GenerateSpec& spec) {
  if (spec.model.empty() || m.model.serves(spec.model)) return std::nullopt;
  std::string served;
  for (const auto& name : m.model.names()) served += (served.empty() ? "'" : ", '") + name + "'";
  return api_error(404, "not_found_error",
                   "model '" + spec.model + "' does not exist; this cluster serves " + served,
                   "model_not_found");
}

std::string serving_reason(const ShellContext& ctx, Shared& shared);

// A request taken before a drain began is still served: admission ignores `closing`.
std::optional<ApiError> admit(GatewayState& st) {
  std::string reason = serving_reason(st.ctx, *st.shared);
  if (!reason.empty()) return api_error(503, "overloaded_error", reason);
  return std::nullopt;
}

void start_request(GatewayActor* self, uint64_t id, PreparedCall p) {
  auto& st = self->state;
  RT_ASSERT(st.requests.count(id) == 0, id);
  RT_ASSERT(st.requests.size() < st.ctx.manifest->gateway.requests_max, st.requests.size());
  RT_ASSERT(st.requests.size() < st.admission->running_count(), st.requests.size());
  ApiKind api = p.api;
  gateway::GenerateSpec spec = std::move(p.spec);
  int64_t max_tokens = p.max_tokens;
  Req r;
  r.api = api;
  r.out = p.call.out;
  r.prompt = std::move(p.prompt);
  r.hashes = std::move(p.hashes);
  r.max_tokens = max_tokens;
  r.start = r.last_activity = Clock::now();
  r.ids = std::make_unique<gateway::IdGenerator>(id ^ st.ctx.bridge->incarnation());
  gateway::RenderOptions options;
  // Answer under the id the client asked for (a served alias stays that alias).
  const config::ModelSection& model = st.ctx.manifest->model;
  RT_ASSERT(spec.model.empty() || model.serves(spec.model), spec.model);
  options.model = spec.model.empty() ? model.name : spec.model;
  options.created_s = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  options.stream = spec.stream;
  options.include_usage = spec.include_usage;
  options.logprobs = spec.sampling.logprobs && api != ApiKind::messages;
  options.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  options.max_output_tokens = max_tokens;
  options.temperature = spec.sampling.temperature;
  options.top_p = spec.sampling.top_p;
  options.reasoning_effort = spec.reasoning.effort;
  if (api != ApiKind::completions) {
    auto pc = parser_config(st.format, spec);
    if (pc.reasoning || pc.tool_format != gateway::ToolCallFormat::none) {
      r.parser = std::make_unique<gateway::OutputParser>(pc);
    }
  }
  r.renderer = gateway::make_renderer(api, options, *r.ids);
  // Completions continue the prompt's text: decode against its last token, so a leading space
  // of the first generated token is kept (as `tandem generate` prints it). Chat replies start
  // a message, where SentencePiece's leading space is dropped.
  std::optional<int32_t> prev_id;
  if (api == ApiKind::completions && !r.prompt.empty()) prev_id = r.prompt.back();
  r.decoder = std::make_unique<text::StreamDecoder>(*st.tokenizer, prev_id);
  r.logprobs_prev_id = prev_id;
  r.stops = std::make_unique<gateway::StopMatcher>(spec.sampling.stop);
  r.spec = std::move(spec);
  if (r.spec.stream) {
    r.pending = r.renderer->begin();  // sent with the head, at the first token (open_stream)
  } else {
    (void)r.renderer->begin();
  }
  // A forced tool call: the prompt ended with its opening; parse it as the answer's start.
  if (auto forced = forced_tool_prefix(st.format, r.spec); forced.ok() && r.parser) {
    emit_text(r, forced.value());
  }
  caf::actor me = caf::actor_cast<caf::actor>(self);
  r.out->on_cancel([me, id] { caf::anon_send(me, ClientGone{id}); });
  st.metrics->prompt_tokens->inc(r.prompt.size());
  st.requests.emplace(id, std::move(r));
  st.metrics->running->set(static_cast<double>(st.requests.size()));
  RT_ASSERT(st.requests.size() <= st.admission->running_count(), st.requests.size());
  route(self, id);
}

ApiError shutdown_error() {
  return api_error(503, "overloaded_error",
                   "the gateway is shutting down; retry the request", "shutting_down");
}

// Ends every open request with `error`: in a started stream its API's error event and the
// terminator; otherwise a whole error answer (with Retry-After when it says retry). Waiting
// requests get it too. Returns the streams ended. Sends nothing to decode (see drain()).
std::vector<std::shared_ptr<gateway::ResponseStream>> end_all(GatewayState& st,
                                                              const ApiError& error) {
  std::vector<std::shared_ptr<gateway::ResponseStream>> ended;
  for (auto& [id, r] : st.requests) {
    if (r.out->is_cancelled()) continue;
    if (r.spec.stream && r.renderer && r.head_sent) {
      r.out->write(r.renderer->feed(gateway::StreamError{error}));
      r.out->end();
    } else {
      reply_error(r.api, *r.out, error);
    }
    ended.push_back(r.out);
  }
  for (auto& [id, q] : st.queued) {
    if (q.call.out->is_cancelled()) continue;
    reply_error(q.api, *q.call.out, error);
    ended.push_back(q.call.out);
  }
  st.requests.clear();
  st.queued.clear();
  RT_ASSERT(st.requests.empty() && st.queued.empty(), "all ended");
  return ended;
}

GatewayState::~GatewayState() {
  if (requests.empty() && queued.empty()) return;
  (void)end_all(*this, api_error(500, "api_error",
                                 "the gateway actor stopped; retry the request",
                                 "gateway_stopped"));
}

// The preparer: parses, tokenizes and hashes each generation request off the gateway actor,
// so that a long prompt (100K tokens: tens of milliseconds) does not hold up the tokens the
// gateway streams meanwhile. It answers malformed requests and count_tokens itself and hands
// the rest to the gateway actor, which admits, routes and streams.
// The request's API key (Authorization: Bearer, else x-api-key) when it is one of `keys`,
// compared in constant time against every key; nullptr otherwise.
const std::string* matching_api_key(const gateway::HttpRequest& request,
                                    const std::vector<std::string>& keys) {
  std::string given;
  if (auto bearer = request.header("authorization")) {
    std::string_view v = *bearer;
    if (v.rfind("Bearer ", 0) == 0) given = std::string(v.substr(7));
  }
  if (given.empty()) {
    if (auto key = request.header("x-api-key")) given = std::string(*key);
  }
  const std::string* found = nullptr;
  for (const auto& k : keys) {  // no early exit: which key matched takes no longer to find
    if (base::equal_constant_time(given, k) && found == nullptr) found = &k;
  }
  return given.empty() ? nullptr : found;
}

// With api_keys and a cache not shared across them, the salt that keeps one key's prefix
// blocks apart from another's (a digest of the key, never the key itself); "" otherwise.
std::string tenant_salt(const config::GatewaySection& gateway,
                        const gateway::HttpRequest& request) {
  if (gateway.api_keys.empty() || gateway.share_prefix_cache_across_keys) return "";
  const std::string* key = matching_api_key(request, gateway.api_keys);
  if (key == nullptr) return "";
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key->data()), key->size(), digest);
  static const char* hex = "0123456789abcdef";
  std::string out = "tenant:";
  for (int i = 0; i < 16; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

struct PreparerState {
  ShellContext ctx;
  std::shared_ptr<text::Tokenizer> tokenizer;  // encode only here; the gateway only decodes
  text::ChatFormat format = text::ChatFormat::plain;
  kv::HashKey key_base;  // cache_salt set per request
  std::shared_ptr<runtime::ActorSlot> gateway;  // the gateway actor now; empty while down
  // The hashers of key_base without a cache_salt, kept across requests: their keyed HMAC
  // contexts are set up once instead of per request. By tenant salt ("" without per-key
  // salting; else one per API key, so at most api_keys + 1). Requests with a cache_salt get
  // their own.
  std::map<std::string, std::unique_ptr<kv::BlockHasher>> hashers;
  std::shared_ptr<gateway::PreparerPool> pool;  // the pool this preparer is a slot of
  obs::Counter* prepared = nullptr;              // its pool's requests prepared
  std::optional<HandlerGuard> guard;             // the backstop of prepare()
  static inline const char* name = "tandem.gateway.preparer";
};

using PreparerActor = caf::stateful_actor<PreparerState>;

void prepare_call(PreparerActor* self, const HttpCall& call) {
  auto& st = self->state;
  const auto& request = *call.request;
  auto api = api_of(request);
  if (!api.ok()) return reply_error(ApiKind::chat_completions, *call.out, api.error());
  auto spec = gateway::parse_request(api.value(), request.body);
  if (!spec.ok()) return reply_error(api.value(), *call.out, spec.error());
  // Before tokenizing (a long prompt for a model not served costs nothing); count_tokens too.
  if (auto missing = unknown_model(*st.ctx.manifest, spec.value())) {
    return reply_error(api.value(), *call.out, *missing);
  }
  const int64_t model_tokens_max = st.ctx.manifest->model.max_model_tokens;
  const bool counting = api.value() == ApiKind::count_tokens;
  // A prompt far over the context is rejected after tokenizing about the budget's worth.
  const size_t budget = counting ? SIZE_MAX
                                 : static_cast<size_t>(
                                       gateway::prompt_tokens_max(spec.value(), model_tokens_max));
  auto capped = tokenize(*st.tokenizer, st.format, spec.value(), budget);
  if (!capped.ok()) return reply_error(api.value(), *call.out, capped.error());
  std::vector<int32_t>& prompt = capped.value().ids;
  if (counting) {
    call.out->send(200, json_headers,
                   gateway::render_count_tokens(static_cast<int64_t>(prompt.size())));
    return;
  }
  if (capped.value().partial) {
    return reply_error(api.value(), *call.out,
                       gateway::prompt_too_long(spec.value(), static_cast<int64_t>(prompt.size()),
                                                model_tokens_max));
  }
  auto max_tokens = gateway::check_context_length(
      spec.value(), static_cast<int64_t>(prompt.size()), model_tokens_max);
  if (!max_tokens.ok()) return reply_error(api.value(), *call.out, max_tokens.error());
  // One prefix hash per full sub-block: the granularity the caches and the router match at.
  uint32_t block_tokens = st.ctx.manifest->model.sub_block_tokens;
  std::vector<kv::BlockHash> hashes;
  std::string tenant = tenant_salt(st.ctx.manifest->gateway, request);
  if (spec.value().cache_salt.empty()) {
    // One kept hasher per tenant (the unsalted one, or one per API key: a bounded set).
    auto& hasher = st.hashers[tenant];
    RT_ASSERT(st.hashers.size() <= st.ctx.manifest->gateway.api_keys.size() + 1);
    if (!hasher) {
      kv::HashKey key = st.key_base;
      key.salt = tenant;
      auto made = kv::BlockHasher::create(key, block_tokens);
      RT_ASSERT(made.ok(), "the key and block size are valid");
      hasher = std::make_unique<kv::BlockHasher>(std::move(made).value());
    }
    hasher->reset();
    hashes.reserve(prompt.size() / block_tokens);
    hasher->append(prompt, hashes);
  } else {
    kv::HashKey key = st.key_base;
    key.salt = tenant.empty() ? spec.value().cache_salt : tenant + "|" + spec.value().cache_salt;
    auto salted = kv::hash_blocks(prompt, block_tokens, key);
    RT_ASSERT(salted.ok(), "the key and block size are valid");
    hashes = std::move(salted).value();
  }
  caf::actor gateway = st.gateway->get();
  if (!gateway) {
    return reply_busy(api.value(), *call.out,
                      api_error(503, "overloaded_error",
                                "the gateway actor is restarting (see /health); retry"));
  }
  self->send(gateway, PreparedCall{call, api.value(), std::move(spec.value()),
                                   std::move(prompt), std::move(hashes),
                                   max_tokens.value()});
}

// The last word on a message whose handler failed (HandlerGuard): a 500 api_error if nothing
// was sent yet, the end of the stream if it had begun.
void answer_internal_error(ApiKind api, gateway::ResponseStream& out, const Error& error) {
  using Progress = gateway::ResponseStream::Progress;
  switch (out.progress()) {
    case Progress::idle:
      return reply_error(api, out, api_error(500, "api_error", error.message));
    case Progress::streaming:
      (void)out.end();
      return;
    case Progress::done:
      return;
  }
}

void prepare(PreparerActor* self, const HttpCall& call) {
  auto& st = self->state;
  st.prepared->inc();  // before any answer: a client that has one sees it counted
  Status done = st.guard->run("preparing a request",
                              [self, &call] { prepare_call(self, call); });
  if (!done.ok()) {
    auto api = api_of(*call.request);
    answer_internal_error(api.ok() ? api.value() : ApiKind::chat_completions, *call.out,
                          done.error());
  }
  st.pool->done(call.preparer, call.cost);
}

void on_prepared(GatewayActor* self, PreparedCall& p) {
  auto& st = self->state;
  if (p.call.out->is_cancelled()) return;  // the client left while its prompt was prepared
  if (st.shared->draining.load()) return reply_busy(p.api, *p.call.out, shutdown_error());
  if (auto refused = admit(st)) return reply_busy(p.api, *p.call.out, *refused);
  uint64_t id = st.id_seed + ++st.next_id;
  auto offer = st.admission->offer(id, Clock::now());
  switch (offer.verdict) {
    case gateway::Admission::Verdict::refused:
      return reply_busy(p.api, *p.call.out, refusal_error(offer.refusal));
    case gateway::Admission::Verdict::waiting: {
      // A waiting client that disconnects leaves the queue at once (ClientGone).
      caf::actor me = caf::actor_cast<caf::actor>(self);
      p.call.out->on_cancel([me, id] { caf::anon_send(me, ClientGone{id}); });
      st.queued.emplace(id, std::move(p));
      RT_ASSERT(st.queued.size() == st.admission->waiting_count(), st.queued.size());
      st.metrics->waiting->set(static_cast<double>(st.queued.size()));
      return;
    }
    case gateway::Admission::Verdict::admitted:
      return start_request(self, id, std::move(p));
  }
}

// A slot freed up (or decode capacity grew): start the oldest waiting requests that fit.
void admit_queued(GatewayActor* self) {
  auto& st = self->state;
  for (uint64_t id : st.admission->admit_waiting()) {
    auto it = st.queued.find(id);
    RT_ASSERT(it != st.queued.end(), id);
    PreparedCall next = std::move(it->second);
    st.queued.erase(it);
    st.metrics->waiting->set(static_cast<double>(st.queued.size()));
    if (next.call.out->is_cancelled()) {
      (void)st.admission->finished(id);
      continue;
    }
    start_request(self, id, std::move(next));
  }
  RT_ASSERT(st.queued.size() == st.admission->waiting_count(), st.queued.size());
}

// A waiting request's client went away: drop it from the queue. False if it was not queued.
bool drop_queued(GatewayState& st, uint64_t id) {
  if (!st.admission->cancel_waiting(id)) return false;
  size_t erased = st.queued.erase(id);
  RT_ASSERT(erased == 1, id);
  st.metrics->waiting->set(static_cast<double>(st.queued.size()));
  return true;
}

// Requests that waited longer than gateway.queue_timeout_ms get 503 (oldest first: FIFO).
void expire_queued(GatewayState& st, Clock::time_point now) {
  for (const auto& late : st.admission->expire(now)) {
    auto it = st.queued.find(late.id);
    RT_ASSERT(it != st.queued.end(), late.id);
    st.metrics->count_error(refusal_error(late.refusal).type);
    reply_busy(it->second.api, *it->second.call.out, refusal_error(late.refusal));
    st.queued.erase(it);
  }
  st.metrics->waiting->set(static_cast<double>(st.queued.size()));
}

void on_frame(GatewayActor* self, const runtime::InboundFrame& in) {
  auto envelope = in.frame->envelope();
  auto body = envelope.getBody();
  uint64_t correlation = envelope.getCorrelationId();
  ActorName source = messages::get_name(envelope.getSource());
  switch (body.which()) {
    case wire::Envelope::Body::ROUTE_REPLY:
      return on_route_reply(self, correlation, body.getRouteReply(), source);
    case wire::Envelope::Body::TOKEN_CHUNK:
      return on_tokens(self, body.getTokenChunk(), source);
    case wire::Envelope::Body::FINISH:
      return on_finish(self, body.getFinish(), source);
    case wire::Envelope::Body::STEP_EVENTS:
      for (auto event : body.getStepEvents().getEvents()) {
        if (event.isTokenChunk()) {
          on_tokens(self, event.getTokenChunk(), source);
        } else if (event.isFinish()) {
          on_finish(self, event.getFinish(), source);
        }
      }
      return;
    case wire::Envelope::Body::ERROR: {
      auto e = body.getError();
      auto it = self->state.requests.find(e.getRequestId());
      if (it == self->state.requests.end()) return;
      Req& r = it->second;
      // Only the router this attempt asked, or the decode instance serving it, may end it.
      bool from_router = r.router_asked && *r.router_asked == source;
      if (!from_router && !from_current_decode(r, source)) {
        self->state.metrics->protocol_refused->inc();
        return;
      }
      if (from_router) r.router_asked.reset();
      return on_failure(self, e.getRequestId(), messages::from_wire(e.getKind()),
                        runtime::sanitize_peer_text(e.getMessage().cStr(), 512));
    }
    case wire::Envelope::Body::PING:
      return runtime::answer_ping(self->state.ctx.bridge, self->state.self_name, envelope);
    default:
      return;
  }
}

void on_membership(GatewayActor* self, const runtime::MembershipEvent& event) {
  auto& st = self->state;
  if (event.kind == runtime::MembershipEvent::Kind::restarted) {
    st.health->node_restarted(event.node);
  }
  st.health->node_up(event.node, event.kind != runtime::MembershipEvent::Kind::down);
  update_health(st);
  admit_queued(self);
  if (event.kind == runtime::MembershipEvent::Kind::up) return;
  std::vector<uint64_t> affected;
  for (const auto& [id, r] : st.requests) {
    if (r.decode && r.decode->node == event.node) affected.push_back(id);
  }
  for (uint64_t id : affected) {
    on_failure(self, id, ErrorKind::disconnected, "decode node " + event.node + " failed");
  }
}

void on_tick(GatewayActor* self) {
  auto& st = self->state;
  auto now = Clock::now();
  st.metrics->refresh_recent(now);
  expire_queued(st, now);
  auto limit = std::chrono::milliseconds(st.ctx.manifest->gateway.request_timeout_ms);
  std::vector<uint64_t> late;
  std::vector<uint64_t> unrouted;
  for (const auto& [id, r] : st.requests) {
    if (!r.decode && now - r.last_activity > std::chrono::seconds(5)) {
      unrouted.push_back(id);
    } else if (now - r.last_activity > limit) {
      late.push_back(id);
    }
  }
  for (uint64_t id : unrouted) {
    fail(self, id, api_error(503, "overloaded_error", "the router did not answer within 5 s"));
  }
  for (uint64_t id : late) {
    on_failure(self, id, ErrorKind::timed_out, "no progress for " +
                                                   std::to_string(limit.count()) + " ms");
  }
}

// A pool of preparers: their load and their actors, by slot (a slot is empty while its
// preparer is down and being restarted).
struct Preparers {
  std::shared_ptr<gateway::PreparerPool> pool;
  std::vector<std::shared_ptr<runtime::ActorSlot>> actors;
};

// Why the gateway cannot serve now, "" when it can: an actor of this node is down (the
// supervisor restarts it), or no decode instance is ready. Any thread.
// Why requests cannot be served now ("" when they can); /health adds a drain.
std::string serving_reason(const ShellContext& ctx, Shared& shared) {
  std::string down = ctx.node_health ? ctx.node_health->reason() : "";
  if (shared.healthy.load()) return down;
  std::string decode = shared.reason();
  if (decode.empty()) decode = "the gateway is starting";  // never a 200 while not healthy
  return down.empty() ? decode : down + "; " + decode;
}

std::string unhealthy_reason(const ShellContext& ctx, Shared& shared) {
  if (shared.closing.load()) return "the node is draining: it takes no new requests";
  return serving_reason(ctx, shared);
}

// The Host header without its port ("[::1]:8000" -> "[::1]", "a:1" -> "a").
std::string host_without_port(std::string_view host) {
  if (!host.empty() && host.front() == '[') {
    auto close = host.find(']');
    return std::string(host.substr(0, close == std::string_view::npos ? host.size() : close + 1));
  }
  auto colon = host.find(':');
  if (colon != std::string_view::npos && host.find(':', colon + 1) == std::string_view::npos) {
    host = host.substr(0, colon);
  }
  return std::string(host);
}

// DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 sends
// "Host: evil.example". The API answers only names this node has (host, api_host,
// localhost, [gateway] allowed_hosts) and address literals, which a rebinding page cannot use.
bool host_allowed(const config::Manifest& m, const config::Node& node,
                  const gateway::HttpRequest& request) {
  auto header = request.header("host");
  if (!header) return true;  // HTTP/1.0 clients; every browser sends Host
  std::string host = host_without_port(*header);
  std::string lower;
  for (char c : host) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  bool literal = !lower.empty() && (lower.front() == '[' ||
                                    lower.find_first_not_of("0123456789.") == std::string::npos);
  if (literal || lower == "localhost" || lower == node.host || lower == node.api_host) return true;
  for (const auto& allowed : m.gateway.allowed_hosts) {
    if (allowed == "*" || allowed == lower) return true;
  }
  return false;
}

// A JSON media type (application/json, application/*+json, with parameters). Browsers send
// other bodies (text/plain, forms) across sites without asking: refusing them keeps a web
// page from driving a keyless local endpoint.
bool json_content_type(const gateway::HttpRequest& request) {
  auto type = request.header("content-type");
  if (!type) return false;
  std::string t;
  for (char c : type->substr(0, type->find(';'))) {
    if (c != ' ' && c != '\t') t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return t == "application/json" || (t.rfind("application/", 0) == 0 && t.size() > 17 &&
                                      t.compare(t.size() - 5, 5, "+json") == 0);
}

// CORS: the request's Origin when [gateway] cors_origins allows it, else nullopt.
std::optional<std::string> allowed_origin(const config::GatewaySection& g,
                                          const gateway::HttpRequest& request) {
  auto origin = request.header("origin");
  if (!origin || g.cors_origins.empty()) return std::nullopt;
  for (const auto& o : g.cors_origins) {
    if (o == "*" || o == *origin) return std::string(*origin);
  }
  return std::nullopt;
}

// Runs on the HTTP thread: cheap endpoints and authentication; POSTs go to a preparer (the
// least loaded of the long-prompt pool for bodies over long_prompt_bytes, else of the other).
class Front final : public gateway::HttpHandler {
 public:
  Front(const ShellContext& ctx, std::shared_ptr<Shared> shared,
        Preparers short_prompts, Preparers long_prompts)
      : ctx_(ctx), shared_(std::move(shared)), short_(std::move(short_prompts)),
        long_(std::move(long_prompts)),
        node_(*ctx.manifest->find_node(ctx.bridge->node())) {}

  void on_request(const gateway::HttpRequest& request,
                  std::shared_ptr<gateway::ResponseStream> out) override {
    const std::string& path = request.path;
    ApiKind api = path.rfind("/v1/messages", 0) == 0 ? ApiKind::messages : ApiKind::chat_completions;
    if (path != "/" && path != "/health" && !host_allowed(*ctx_.manifest, node_, request)) {
      reply_error(api, *out, api_error(400, "invalid_request_error",
                                       "Host '" + runtime::sanitize_peer_text(
                                                      *request.header("host"), 256) +
                                           "' is not a name of this server; add it to "
                                           "[gateway] allowed_hosts",
                                       "invalid_host"));
      return;
    }
    if (auto origin = allowed_origin(ctx_.manifest->gateway, request)) {
      out->add_header("Access-Control-Allow-Origin", *origin);
      out->add_header("Vary", "Origin");
      if (request.method == "OPTIONS") {  // the preflight
        auto asked = request.header("access-control-request-headers");
        out->send(204, {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                        {"Access-Control-Allow-Headers",
                         asked ? runtime::sanitize_peer_text(*asked, 1024)
                               : std::string("authorization, content-type, x-api-key")},
                        {"Access-Control-Max-Age", "600"}},
                  "");
        return;
      }
    }
    if (path == "/" && (request.method == "GET" || request.method == "HEAD")) {
      out->send(200, {{"Content-Type", "text/plain"}}, request.method == "HEAD" ? "" : "tandem\n");
      return;
    }
    if (path == "/health" && request.method == "GET") {
      std::string reason = unhealthy_reason(ctx_, *shared_);
      if (reason.empty()) {
        out->send(200, json_headers, R"({"status":"ok"})");
      } else {
        nlohmann::json body = {{"status", "unavailable"}, {"reason", reason}};
        out->send(503, json_headers, body.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace));
      }
      return;
    }
    if (!authorized(request)) {
      reply_error(api, *out, api_error(401, api == ApiKind::messages ? "authentication_error"
                                                                     : "invalid_request_error",
                                       "missing or invalid API key", "invalid_api_key"));
      return;
    }
    if (path == "/metrics" && request.method == "GET") {  // behind api_keys, like the API
      out->send(200, {{"Content-Type", "text/plain; version=0.0.4; charset=utf-8"}},
                ctx_.metrics->render_prometheus());
      return;
    }
    if (path == "/v1/models" && request.method == "GET") {
      out->send(200, json_headers, models_body());
      return;
    }
    if (request.method != "POST") {
      // An unknown path is 404 whatever the method; 405 only for the API's POST paths.
      bool known = path == "/v1/models" || api_of(request).ok();
      reply_error(api, *out, known ? api_error(405, "invalid_request_error",
                                               request.method + " is not allowed on " + path)
                                   : api_error(404, "not_found_error",
                                               "no route for " + request.method + " " + path,
                                               "not_found"));
      return;
    }
    if (!json_content_type(request)) {
      auto type = request.header("content-type");
      reply_error(api, *out,
                  api_error(415, "invalid_request_error",
                            "the body must be JSON: Content-Type is " +
                                (type ? "'" + runtime::sanitize_peer_text(*type, 128) + "'"
                                      : std::string("missing")) +
                                "; send Content-Type: application/json",
                            "unsupported_media_type"));
      return;
    }
    if (shared_->draining.load() || shared_->closing.load()) {
      return reply_busy(api, *out, shutdown_error());
    }
    uint64_t cost = request.body.size() + 1;
    Preparers& to = request.body.size() > ctx_.manifest->gateway.long_prompt_bytes ? long_ : short_;
    auto slot = static_cast<uint32_t>(to.pool->pick(cost));
    caf::actor preparer = to.actors[slot]->get();
    if (!preparer) {  // down and being restarted: the first live one instead
      to.pool->done(slot, cost);
      auto live = std::find_if(to.actors.begin(), to.actors.end(),
                               [](const auto& one) { return static_cast<bool>(one->get()); });
      if (live == to.actors.end()) {
        reply_busy(api, *out, api_error(503, "overloaded_error",
                                        "the gateway's preparers are restarting (see /health); "
                                        "retry"));
        return;
      }
      slot = static_cast<uint32_t>(live - to.actors.begin());
      preparer = (*live)->get();  // may be empty again (a race with a crash): then lost, 500
      to.pool->add(slot, cost);
    }
    caf::anon_send(preparer,
                   HttpCall{std::make_shared<const gateway::HttpRequest>(request), out, slot, cost});
  }

 private:
  bool authorized(const gateway::HttpRequest& request) const {
    const auto& keys = ctx_.manifest->gateway.api_keys;
    return keys.empty() || matching_api_key(request, keys) != nullptr;
  }

  // Every served id: [model] name, then served_names.
  std::string models_body() const {
    const config::ModelSection& model = ctx_.manifest->model;
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (const auto& name : model.names()) {
      data.push_back({{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "tandem"},
                      {"max_model_len", model.max_model_tokens}});
    }
    RT_ASSERT(data.size() == model.served_names.size() + 1, "models listing");
    return nlohmann::ordered_json{{"object", "list"}, {"data", data}}.dump();
  }

  ShellContext ctx_;
  std::shared_ptr<Shared> shared_;
  Preparers short_, long_;
  const config::Node& node_;  // this node, in the manifest (outlives the front)

 public:
  void close() { shared_->closing.store(true); }
};

class Service final : public GatewayService {
 public:
  Service(caf::actor_system& system, std::unique_ptr<Front> front,
          std::vector<caf::actor> actors, std::vector<runtime::Supervised> supervised)
      : system_(system), front_(std::move(front)), actors_(std::move(actors)),
        supervised_(std::move(supervised)) {
    RT_ASSERT(!supervised_.empty() && supervised_[0].role == "gateway", supervised_.size());
  }
  ~Service() override { stop(); }
  Status start(const std::string& host, uint16_t port, gateway::HttpLimits limits) {
    server_ = std::make_unique<gateway::HttpServer>(host, port, limits, *front_);
    return server_->start();
  }
  // Drains first (every open stream ends with its API's error event and terminator, and
  // those bytes reach their sockets), then closes the HTTP server. Called from main, which
  // may block: at most drain_wait twice.
  void stop() override {
    if (!server_ || stopped_) return;
    stopped_ = true;
    drain();
    server_->stop();
  }
  std::vector<caf::actor> actors() const override { return actors_; }
  std::vector<runtime::Supervised> supervised() const override { return supervised_; }
  void begin_drain() override { front_->close(); }
  uint64_t open_requests() const override {
    return server_ && !stopped_ ? server_->stats().responses_open : 0;
  }

 private:
  void drain() {
    constexpr auto drain_wait = std::chrono::seconds(2);
    caf::actor gateway = supervised_[0].slot->get();
    if (!gateway) return;  // down: its state ended its requests (~GatewayState)
    Drained drained;
    {
      caf::scoped_actor self{system_};
      self->request(gateway, drain_wait, DrainRequest{})
          .receive([&drained](Drained& d) { drained = std::move(d); },
                   [](const caf::error&) {});
    }
    // The HTTP thread writes what was queued; closing the connections before would cut it.
    auto deadline = Clock::now() + drain_wait;
    auto flushed = [&drained] {
      return std::all_of(drained.streams.begin(), drained.streams.end(), [](const auto& out) {
        return out->is_cancelled() || out->buffered_bytes() == 0;
      });
    };
    while (!flushed() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  caf::actor_system& system_;
  std::unique_ptr<Front> front_;
  std::unique_ptr<gateway::HttpServer> server_;
  std::vector<caf::actor> actors_;
  std::vector<runtime::Supervised> supervised_;
  bool stopped_ = false;
};

void on_client_gone(GatewayActor* self, const ClientGone& gone) {
  auto& st = self->state;
  if (drop_queued(st, gone.request_id)) return;
  auto it = st.requests.find(gone.request_id);
  if (it == st.requests.end()) return;
  if (it->second.decode) {
    (void)st.ctx.bridge->send(st.self_name, *it->second.decode, gone.request_id,
                              [&](wire::Envelope::Builder b) {
                                b.getBody().initCancel().setRequestId(gone.request_id);
                              });
  }
  st.requests.erase(it);
  release(self, gone.request_id);
}

// --- Admin commands (`tandem shell` requests / cancel; LocalAdmin from the node) ---

std::string age_text(Clock::duration age) {
  return runtime::format_age(std::chrono::duration_cast<std::chrono::milliseconds>(age));
}

// `requests [INSTANCE]`: what this gateway has in flight (optionally only those on one decode or
// prefill instance, by its name or node/role/instance), oldest first, and what waits for
// admission; `cancel ID`: ends one with an error to its client and a cancel to its decode.
runtime::AdminResult on_admin(GatewayActor* self, const runtime::LocalAdmin& cmd) {
  auto& st = self->state;
  const std::string who = st.self_name.to_string();
  auto now = Clock::now();
  if (cmd.command == "requests") {
    if (cmd.args.size() > 1) return {false, who + ": usage: requests [INSTANCE]\n", {}};
    auto on = [&](const std::string& full) {
      if (cmd.args.empty()) return true;
      return full == cmd.args[0] ||
             (!full.empty() && full.substr(full.rfind('/') + 1) == cmd.args[0]);
    };
    runtime::AdminResult out{
        true,
        "",
        {{"gateway", "id", "state", "age", "prompt tokens", "tokens", "decode", "prefill"}}};
    std::vector<std::pair<Clock::time_point, std::vector<std::string>>> rows;
    for (const auto& [id, r] : st.requests) {
      std::string decode = r.decode ? r.decode->to_string() : "";
      if (!on(decode) && !on(r.prefill)) continue;
      std::string state = !r.decode ? "routing" : r.tokens_received == 0 ? "prefill" : "decoding";
      rows.push_back({r.start,
                      {who, std::to_string(id), state, age_text(now - r.start),
                       std::to_string(r.prompt.size()), std::to_string(r.tokens_received),
                       decode.empty() ? "-" : decode, r.prefill.empty() ? "-" : r.prefill}});
    }
    if (cmd.args.empty()) {
      for (const auto& [id, q] : st.queued) {
        (void)q;  // waiting for admission: listed after those in flight, in arrival (id) order
        rows.push_back({Clock::time_point::max(),
                        {who, std::to_string(id), "queued", "-", "-", "0", "-", "-"}});
      }
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [at, row] : rows) out.rows.push_back(std::move(row));
    return out;
  }
  if (cmd.command != "cancel" || cmd.args.size() != 1) {
    return {false, who + ": usage: cancel ID\n", {}};
  }
  char* end = nullptr;
  uint64_t id = std::strtoull(cmd.args[0].c_str(), &end, 10);
  if (end == cmd.args[0].c_str() || *end != '\0') {
    return {false, who + ": cancel: '" + cmd.args[0] + "' is not a request id\n", {}};
  }
  if (st.requests.count(id) == 0) return {false, who + ": no request " + cmd.args[0] + "\n", {}};
  st.ctx.log->warn("gateway: request {} cancelled by an operator", id);
  // Its client gets an explicit error (in-stream when the stream has begun); decode a cancel.
  fail(self, id, api_error(503, "api_error", "cancelled by the cluster's operator", "cancelled"));
  return {true,
          who + ": request " + cmd.args[0] + " cancelled\n",
          {{"gateway", "id", "cancelled"}, {who, cmd.args[0], "yes"}}};
}

// A frame's handler failed (HandlerGuard): the request it was about (its correlation id)
// ends with a 500; if even that fails, the request is dropped (the HTTP server answers 500).
void on_frame_failed(GatewayActor* self, const runtime::InboundFrame& in, const Error& error) {
  auto& st = self->state;
  uint64_t id = 0;
  Status read = st.guard->run("reading a failed message", [&in, &id] {
    id = in.frame->envelope().getCorrelationId();
  });
  if (!read.ok() || st.requests.count(id) == 0) return;
  Status failed = st.guard->run("failing a request", [self, id, &error] {
    fail(self, id, api_error(500, "api_error", error.message));
  });
  if (!failed.ok() && st.requests.erase(id) > 0) release(self, id);
}

// The node stops: cancel every request on decode, end each with its API's error, refuse more.
Drained drain(GatewayActor* self) {
  auto& st = self->state;
  st.shared->draining.store(true);
  for (const auto& [id, r] : st.requests) {
    if (!r.decode || r.finished) continue;
    (void)st.ctx.bridge->send(st.self_name, *r.decode, id, [id = id](wire::Envelope::Builder b) {
      b.getBody().initCancel().setRequestId(id);
    });
  }
  size_t open_count = st.requests.size() + st.queued.size();
  Drained out{end_all(st, shutdown_error())};
  RT_ASSERT(out.streams.size() <= open_count, out.streams.size(), open_count);
  st.metrics->running->set(0);
  st.metrics->waiting->set(0);
  gateway::AdmissionLimits limits = st.admission->limits();
  st.admission.emplace(limits);  // every slot free again (none is used)
  st.admission->set_decode_ready(st.health->ready_count());
  st.ctx.log->info("gateway: shutting down, {} open request(s) ended with an error event",
                   out.streams.size());
  return out;
}

caf::behavior gateway_behavior(GatewayActor* self) {
  self->delayed_send(self, std::chrono::milliseconds(200), runtime::atoms::tick::value);
  const HandlerGuard& guard = *self->state.guard;  // lives as long as the state
  return {
      // First: placed after the InstanceLoadReport handler, CAF 0.17 answered LocalAdmin with
      // unexpected_message (seen with `tandem shell -c requests`); here it matches.
      [self, &guard](const runtime::LocalAdmin& cmd) -> runtime::AdminResult {
        runtime::AdminResult out;
        Status ran =
            guard.run("an admin command", [self, &cmd, &out] { out = on_admin(self, cmd); });
        if (!ran.ok()) out = {false, ran.error().describe() + "\n", {}};
        return out;
      },
      [self, &guard](PreparedCall& p) {
        Status done = guard.run("admitting a request", [self, &p] { on_prepared(self, p); });
        if (!done.ok()) answer_internal_error(p.api, *p.call.out, done.error());
      },
      [self, &guard](const ClientGone& gone) {
        (void)guard.run("ending a request", [self, &gone] { on_client_gone(self, gone); });
      },
      [self, &guard](const runtime::InboundFrame& in) {
        Status done = guard.run("handling a message", [self, &in] { on_frame(self, in); });
        if (!done.ok()) on_frame_failed(self, in, done.error());
      },
      [self, &guard](const runtime::MembershipEvent& event) {
        (void)guard.run("a membership event", [self, &event] { on_membership(self, event); });
      },
      [self, &guard](const runtime::InstanceLoadReport& report) {
        (void)guard.run("a load report", [self, &report] {
          auto& st = self->state;
          st.health->report(report.instance, report.ready, report.not_ready_reason);
          update_health(st);
          admit_queued(self);  // an instance that became ready adds capacity
        });
      },
      [self, &guard](const DrainRequest&) -> Drained {
        Drained out;
        (void)guard.run("draining", [self, &out] { out = drain(self); });
        return out;
      },
      [self, &guard](runtime::atoms::tick) {
        (void)guard.run("a tick", [self] { on_tick(self); });
        self->delayed_send(self, std::chrono::milliseconds(200), runtime::atoms::tick::value);
      },
  };
}

gateway::AdmissionLimits admission_limits(const config::Manifest& m) {
  gateway::AdmissionLimits l;
  l.requests_max = m.gateway.requests_max;
  l.queue_max = m.gateway.queue_max;
  l.queue_timeout = std::chrono::milliseconds(m.gateway.queue_timeout_ms);
  l.decode_seqs_per_instance = m.decode.seqs_max + m.decode.waiting_max;
  return l;
}

// What spawning the gateway actor takes (again, when the supervisor restarts it).
struct GatewayParts {
  caf::actor_system* system;  // outlives the gateway
  ShellContext ctx;
  ActorName name;
  std::shared_ptr<text::Tokenizer> tokenizer;
  text::ChatFormat format = text::ChatFormat::plain;
  std::vector<ActorName> routers;
  std::vector<gateway::DecodeHealth::Instance> decodes;
  std::shared_ptr<Shared> shared;
  std::shared_ptr<std::atomic<uint64_t>> spawned_count;  // incarnations of the gateway actor
};

// Spawns the gateway actor and registers it under parts.name.
caf::actor spawn_gateway_actor(const GatewayParts& parts) {
  uint64_t generation = parts.spawned_count->fetch_add(1);
  auto init = [parts, generation](GatewayActor* self) -> caf::behavior {
    auto& st = self->state;
    const ShellContext& ctx = parts.ctx;
    st.ctx = ctx;
    st.self_name = parts.name;
    st.guard.emplace(ctx, "gateway");
    st.tokenizer = parts.tokenizer;
    st.format = parts.format;
    st.routers = parts.routers;
    st.health = std::make_unique<gateway::DecodeHealth>(ctx.bridge->node(), parts.decodes);
    st.admission.emplace(admission_limits(*ctx.manifest));
    st.shared = parts.shared;
    // Request ids are unique across gateways, restarts of the node and of this actor: name
    // hash, incarnation and generation on top.
    uint64_t mixed = std::hash<std::string>{}(parts.name.to_string()) ^
                     ctx.bridge->incarnation() ^ (generation * 0x9E3779B97F4A7C15ull);
    st.id_seed = (mixed & 0xfffffff) << 32;
    st.metrics = std::make_unique<Metrics>(make_metrics(*ctx.metrics, parts.name.instance));
    update_health(st);
    if (ctx.node_actor) {
      self->send(ctx.node_actor, runtime::atoms::subscribe::value,
                 caf::actor_cast<caf::actor>(self));
    }
    return gateway_behavior(self);
  };
  auto actor = runtime::spawn_fn(*parts.system, init);
  parts.ctx.bridge->register_actor(parts.name, actor);
  return actor;
}

// What spawning a preparer takes.
struct PreparerParts {
  caf::actor_system* system;  // outlives the preparers
  ShellContext ctx;
  std::shared_ptr<text::Tokenizer> tokenizer;
  text::ChatFormat format = text::ChatFormat::plain;
  kv::HashKey key_base;
  std::shared_ptr<runtime::ActorSlot> gateway;
  std::string instance;
};

// Spawns `count` preparers (with threads of their own when `own_threads`) and appends them
// to `supervised` (a restart resets the slot's load: its mailbox was lost).
Preparers make_preparers(const PreparerParts& parts, uint32_t count, bool own_threads,
                         std::vector<runtime::Supervised>& supervised) {
  Preparers p{std::make_shared<gateway::PreparerPool>(count), {}};
  std::string pool_name = own_threads ? "threads" : "workers";
  obs::Counter* prepared = make_counter(
      *parts.ctx.metrics, "tandem:gateway_requests_prepared_total",
      "requests parsed, tokenized and hashed, by preparer pool (workers: on the node's "
      "workers; threads: long prompts, on threads of their own)",
      {{"instance", parts.instance}, {"pool", pool_name}});
  auto behavior = [parts, pool = p.pool, prepared](PreparerActor* self) -> caf::behavior {
    self->state = PreparerState{parts.ctx, parts.tokenizer, parts.format, parts.key_base,
                                parts.gateway, {}, pool, prepared, std::nullopt};
    self->state.guard.emplace(parts.ctx, "gateway-preparer");
    return {[self](const HttpCall& call) { prepare(self, call); }};
  };
  auto spawn = [system = parts.system, behavior, own_threads] {
    return own_threads ? runtime::spawn_fn<caf::detached>(*system, behavior)
                       : runtime::spawn_fn(*system, behavior);
  };
  for (uint32_t i = 0; i < count; ++i) {
    p.actors.push_back(std::make_shared<runtime::ActorSlot>(spawn()));
    std::string name = parts.ctx.bridge->node() + "/gateway/" + parts.instance + "/" +
                       pool_name + "-preparer-" + std::to_string(i);
    supervised.push_back({name, "gateway-preparer",
                          [spawn, pool = p.pool, i] {
                            pool->reset(i);
                            return spawn();
                          },
                          p.actors.back()});
  }
  return p;
}

}  // namespace

Result<std::unique_ptr<GatewayService>> start_gateway(caf::actor_system& system,
                                                      const ShellContext& ctx,
                                                      const config::Instance& instance) {
  const config::Manifest& m = *ctx.manifest;
  const config::Node* node = m.find_node(ctx.bridge->node());
  RT_ASSERT(node != nullptr && node->http_port.has_value(), "validated by the manifest");
  auto tokenizer = text::load_tokenizer(m.model.path);
  if (!tokenizer.ok()) return tokenizer.error();
  auto format = text::chat_format_for(m.model);
  if (!format.ok()) return format.error();
  GatewayParts parts{&system, ctx, {ctx.bridge->node(), "gateway", instance.name},
                     std::move(tokenizer).value(), *format, {}, {}, nullptr,
                     std::make_shared<std::atomic<uint64_t>>(0)};
  for (const auto& [n, inst] : m.instances_of(config::Role::router)) {
    parts.routers.push_back({n->name, "router", inst->name});
  }
  for (const auto& [n, inst] : m.instances_of(config::Role::decode)) {
    parts.decodes.push_back({n->name, inst->name});
  }
  parts.shared = std::make_shared<Shared>(
      gateway::DecodeHealth(ctx.bridge->node(), parts.decodes).reason());
  auto gateway_slot = std::make_shared<runtime::ActorSlot>(spawn_gateway_actor(parts));
  std::vector<runtime::Supervised> supervised = {
      {parts.name.to_string(), "gateway",
       [parts] {
         parts.ctx.bridge->unregister_actor(parts.name);
         return spawn_gateway_actor(parts);
       },
       gateway_slot}};
  kv::HashKey key_base{m.gateway.cache_secret.empty() ? "tandem:" + m.cluster.name
                                                      : m.gateway.cache_secret,
                       m.model.name, ""};
  PreparerParts preparer{&system, ctx, parts.tokenizer, *format, key_base, gateway_slot,
                         instance.name};
  // Short requests are prepared on the node's workers (no thread hop); long prompts by
  // actors with threads of their own, which the OS preempts, so that tokenizing them never
  // holds the workers that stream tokens meanwhile.
  Preparers short_prompts =
      make_preparers(preparer, config::gateway_preparers(m.gateway, *node), false, supervised);
  Preparers long_prompts =
      make_preparers(preparer, m.gateway.long_prompt_preparers, true, supervised);
  size_t short_count = short_prompts.actors.size(), long_count = long_prompts.actors.size();
  std::vector<caf::actor> actors;  // the gateway actor first (actors() contract)
  for (const runtime::Supervised& one : supervised) actors.push_back(one.slot->get());
  auto service = std::make_unique<Service>(
      system, std::make_unique<Front>(ctx, parts.shared, std::move(short_prompts),
                              std::move(long_prompts)),
      std::move(actors), std::move(supervised));
  gateway::HttpLimits limits;
  limits.body_bytes_max = m.gateway.body_bytes_max;
  limits.connections_max = m.gateway.connections_max;
  limits.connections_per_client_max = m.gateway.connections_per_client_max;
  limits.header_timeout_ms = m.gateway.header_timeout_ms;
  limits.body_timeout_ms = m.gateway.body_timeout_ms;
  if (Status s = service->start(node->api_host, *node->http_port, limits); !s.ok()) return s.error();
  ctx.log->info("gateway {}: serving the API on http://{}:{} (model {}, chat format {}; "
                "preparers: {} on the workers, {} with threads for bodies over {} bytes)",
                instance.name, node->api_host, *node->http_port, m.model.name,
                text::to_string(*format), short_count, long_count,
                m.gateway.long_prompt_bytes);
  return std::unique_ptr<GatewayService>(std::move(service));
}

}  // namespace tandem::actors
