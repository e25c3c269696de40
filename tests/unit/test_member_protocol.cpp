// What decode and prefill accept from the members they talk to, with the real actors on the
// sim device over a real bridge and scoped-actor stand-ins for their peers (ANCHORS, "Cluster
// authentication": a member authenticated to the cluster is still held to its part of the
// protocol). Decode streams tokens only to the gateway that sent the request (never to a
// replyTo it names), takes a cancel only from that gateway, and a prefill result or error only
// from the prefill instance it asked; prefill releases or cancels a request only for the
// decode instance that asked for it. Each stranger's message is dropped and the request goes
// on as if it had not been sent.
#include <doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/decode/decode_actor.hpp"
#include "actors/executor/executor_actor.hpp"
#include "actors/prefill/prefill_actor.hpp"
#include "kvstore/hashing.hpp"
#include "messages/convert.hpp"
#include "runtime/obs/metrics.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/local_bridge.hpp"
#include "tests/support/process.hpp"
#include "tests/support/sim_cluster.hpp"

using namespace tandem;
using namespace std::chrono_literals;
using messages::ActorName;

namespace {

const ActorName gateway_name{"local", "gateway", "gateway"};
const ActorName decode_name{"local", "decode", "decode"};
const ActorName prefill_name{"local", "prefill", "prefill"};

// The prompt: 40 tokens (two full 16-token blocks) and its block hashes.
std::vector<int32_t> prompt_tokens() {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < 40; ++i) t.push_back(100 + i * 7);
  return t;
}

std::vector<kv::BlockHash> prompt_hashes() {
  auto tokens = prompt_tokens();
  auto hashes = kv::hash_blocks(tokens, 16, kv::HashKey{"member-protocol", "stories15M", ""});
  REQUIRE(hashes.ok());
  return std::move(hashes).value();
}

// What a stand-in received about its requests.
struct Received {
  std::vector<int32_t> tokens;
  std::optional<wire::FinishReason> finish;
  uint32_t finish_output_tokens = 0;
  std::vector<std::string> errors;
  std::vector<uint64_t> cancels;
  std::vector<uint64_t> pull_dones;
  std::vector<uint64_t> prefill_requests;
  uint32_t prefill_results = 0;
  uint32_t pongs = 0;
  uint32_t frames = 0;
};

void take_chunk(Received& r, wire::TokenChunk::Reader c) {
  for (auto t : c.getTokenIds()) r.tokens.push_back(t);
}

void take_finish(Received& r, wire::Finish::Reader f) {
  r.finish = f.getReason();
  r.finish_output_tokens = f.getOutputTokens();
}

void take(Received& r, const runtime::InboundFrame& in) {
  ++r.frames;
  auto body = in.frame->envelope().getBody();
  switch (body.which()) {
    case wire::Envelope::Body::TOKEN_CHUNK:
      return take_chunk(r, body.getTokenChunk());
    case wire::Envelope::Body::FINISH:
      return take_finish(r, body.getFinish());
    case wire::Envelope::Body::STEP_EVENTS:
      for (auto e : body.getStepEvents().getEvents()) {
        if (e.which() == wire::StepEvent::TOKEN_CHUNK) take_chunk(r, e.getTokenChunk());
        if (e.which() == wire::StepEvent::FINISH) take_finish(r, e.getFinish());
      }
      return;
    case wire::Envelope::Body::ERROR:
      r.errors.emplace_back(body.getError().getMessage().cStr());
      return;
    case wire::Envelope::Body::CANCEL:
      r.cancels.push_back(body.getCancel().getRequestId());
      return;
    case wire::Envelope::Body::KV_PULL_DONE:
      r.pull_dones.push_back(body.getKvPullDone().getRequestId());
      return;
    case wire::Envelope::Body::PREFILL_REQUEST:
      r.prefill_requests.push_back(body.getPrefillRequest().getRequestId());
      return;
    case wire::Envelope::Body::PREFILL_RESULT:
      ++r.prefill_results;
      return;
    case wire::Envelope::Body::PONG:
      ++r.pongs;
      return;
    default:
      return;
  }
}

// Receives frames into `r` until `done(r)` or `timeout`; true when done.
template <class Done>
bool receive_until(caf::scoped_actor& who, Received& r, std::chrono::milliseconds timeout,
                   Done done) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done(r)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) return false;
    bool timed_out = false;
    who->receive([&](const runtime::InboundFrame& in) { take(r, in); },
                 caf::after(left) >> [&] { timed_out = true; });
    if (timed_out) return done(r);
  }
  return true;
}

// Everything that arrives within `quiet` of the last frame.
void drain(caf::scoped_actor& who, Received& r, std::chrono::milliseconds quiet = 200ms) {
  bool more = true;
  while (more) {
    who->receive([&](const runtime::InboundFrame& in) { take(r, in); },
                 caf::after(quiet) >> [&] { more = false; });
  }
}

// One node of the sim manifest in this process: the actors under test are real, every other
// member is a scoped actor registered under its manifest name (or a stranger's). Actors are
// stopped at the end, or ~actor_system waits for them.
struct Members {
  explicit Members(bool real_decode, bool real_prefill)
      : manifest(testing::parse_manifest_or_fail(
            testing::one_node_sim_manifest("member-protocol", testing::free_port()))),
        system(testing::tandem_actor_config(cfg)),
        local(manifest, "local") {
    ctx = actors::ShellContext{&manifest, local.bridge.get(), local.log, &registry, {}};
    auto instance = [&](config::Role role) {
      return manifest.instances_of(role).at(0).second;
    };
    if (real_decode) {
      auto exec = actors::spawn_executor(system, ctx, *manifest.find_executor("ed"));
      spawned.push_back(exec);
      spawned.push_back(actors::spawn_decode(system, ctx, *instance(config::Role::decode), exec));
    }
    if (real_prefill) {
      auto exec = actors::spawn_executor(system, ctx, *manifest.find_executor("ep"));
      spawned.push_back(exec);
      spawned.push_back(
          actors::spawn_prefill(system, ctx, *instance(config::Role::prefill), exec));
    }
    local.bridge->set_ready();
  }
  // Every actor is gone (and the executors' KV memory deregistered) before the bridge's
  // fabric stops, as in a node (the stand-ins, declared after this, are gone already).
  ~Members() {
    for (auto& a : spawned) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    system.await_all_actors_done();
  }

  // A stand-in for `name`, registered on the bridge.
  std::unique_ptr<caf::scoped_actor> stand_in(const ActorName& name) {
    auto s = std::make_unique<caf::scoped_actor>(system);
    local.bridge->register_actor(name, caf::actor_cast<caf::actor>(*s));
    return s;
  }

  void send(const ActorName& from, const ActorName& to, uint64_t corr,
            const std::function<void(wire::Envelope::Builder)>& fill) {
    Status sent = local.bridge->send(from, to, corr, fill);
    REQUIRE_MESSAGE(sent.ok(), sent.error().describe());
  }

  // Pings `to` from `from` (whose stand-in is `who`) until it answers: `to` is running and has
  // handled everything sent to it before (the bridge delivers in order).
  void sync(caf::scoped_actor& who, const ActorName& from, const ActorName& to, Received& r) {
    uint32_t before = r.pongs;
    for (int i = 0; i < 100 && r.pongs == before; ++i) {
      send(from, to, 0, [i](wire::Envelope::Builder b) {
        b.getBody().initPing().setNonce(static_cast<uint64_t>(i) + 1);
      });
      receive_until(who, r, 100ms, [before](const Received& got) { return got.pongs > before; });
    }
    REQUIRE_MESSAGE(r.pongs > before, (to.to_string() + " never answered a ping"));
  }

  double gauge(const std::string& series, const std::string& instance) {
    auto v = testing::http::metric_sum_parsed(registry.render_prometheus(), series,
                                              "instance=\"" + instance + "\"");
    REQUIRE(v.has_value());
    return *v;
  }

  config::Manifest manifest;
  obs::Registry registry;  // before the system: the actors' metrics live until they end
  caf::actor_system_config cfg;
  caf::actor_system system;
  testing::LocalBridge local;  // after the system: destroyed (its fabric stopped) first
  actors::ShellContext ctx;
  std::vector<caf::actor> spawned;
};

// A GenerateRequest for `id` from `from`, naming `reply_to`, prefilled by `prefill` ("" =
// decode prefills locally).
void generate(Members& m, const ActorName& from, uint64_t id, const std::string& reply_to,
              uint32_t max_tokens, const std::string& prefill = "") {
  auto tokens = prompt_tokens();
  auto hashes = prompt_hashes();
  m.send(from, decode_name, id, [&](wire::Envelope::Builder b) {
    auto g = b.getBody().initGenerateRequest();
    g.setRequestId(id);
    messages::set_tokens(g.initPromptTokenIds(static_cast<unsigned>(tokens.size())), tokens);
    messages::set_hashes(g.initBlockHashes(static_cast<unsigned>(hashes.size())), hashes);
    g.getSampling().setTemperature(0);
    g.getLimits().setMaxTokens(max_tokens);
    g.getLimits().setIgnoreEos(true);
    g.getLimits().setNoSpeculation(true);
    g.setPrefillInstance(prefill);
    g.setReplyTo(reply_to);
  });
}

void cancel(Members& m, const ActorName& from, const ActorName& to, uint64_t id) {
  m.send(from, to, id, [id](wire::Envelope::Builder b) {
    b.getBody().initCancel().setRequestId(id);
  });
}

void error_about(Members& m, const ActorName& from, const ActorName& to, uint64_t id) {
  m.send(from, to, id, [id](wire::Envelope::Builder b) {
    auto e = b.getBody().initError();
    e.setRequestId(id);
    e.setKind(wire::ErrorKind::FAILED);
    e.setMessage("prefill failed");
  });
}

bool finished(const Received& r) { return r.finish.has_value() || !r.errors.empty(); }

// A stranger's stand-in was sent nothing.
void expect_nothing(caf::scoped_actor& stranger) {
  Received r;
  drain(stranger, r);
  CHECK(r.frames == 0);
}

}  // namespace

TEST_CASE("decode: tokens go to the gateway that sent the request, never to a replyTo it names") {
  Members m(true, false);
  auto gateway = m.stand_in(gateway_name);
  const ActorName other{"local", "gateway", "other"};
  auto impostor = m.stand_in(other);
  Received g;
  m.sync(*gateway, gateway_name, decode_name, g);

  generate(m, gateway_name, 11, other.to_string(), 8);
  REQUIRE(receive_until(*gateway, g, 5000ms, finished));
  REQUIRE(g.errors.size() == 1);
  CHECK(g.errors[0].find("replyTo must be the sender") != std::string::npos);
  expect_nothing(*impostor);
  CHECK(m.gauge("tandem:decode_requests_total", "decode") == 0);  // never taken

  // The same request naming itself is served, whole.
  generate(m, gateway_name, 12, gateway_name.to_string(), 8);
  Received ok;
  REQUIRE(receive_until(*gateway, ok, 10000ms, finished));
  CHECK(ok.errors.empty());
  CHECK(ok.finish == wire::FinishReason::LENGTH);
  CHECK(ok.tokens.size() == 8);
}

TEST_CASE("decode: only the request's gateway cancels it") {
  Members m(true, false);
  auto gateway = m.stand_in(gateway_name);
  const ActorName other{"local", "gateway", "other"};
  auto impostor = m.stand_in(other);
  Received sync;
  m.sync(*gateway, gateway_name, decode_name, sync);

  // A stranger's cancel, behind the request in decode's mailbox (ahead of its first step's
  // answer), is dropped: the answer is whole.
  generate(m, gateway_name, 21, gateway_name.to_string(), 48);
  cancel(m, other, decode_name, 21);
  Received g;
  REQUIRE(receive_until(*gateway, g, 10000ms, finished));
  CHECK(g.errors.empty());
  CHECK(g.finish == wire::FinishReason::LENGTH);
  CHECK(g.tokens.size() == 48);
  CHECK(g.finish_output_tokens == 48);

  // The control: the gateway's own cancel, sent the same way, ends the request at once.
  generate(m, gateway_name, 22, gateway_name.to_string(), 48);
  cancel(m, gateway_name, decode_name, 22);
  Received c;
  m.sync(*gateway, gateway_name, decode_name, c);
  drain(*gateway, c, 300ms);
  CHECK((!c.finish || *c.finish == wire::FinishReason::CANCELLED));
  CHECK(c.tokens.size() < 48);
  CHECK(m.gauge("tandem:num_requests_running", "decode") == 0);
  CHECK(m.gauge("tandem:num_requests_waiting", "decode") == 0);
  drain(*impostor, c);
}

TEST_CASE("decode: a prefill result or error counts only from the prefill instance it asked") {
  Members m(true, false);
  auto gateway = m.stand_in(gateway_name);
  auto prefill = m.stand_in(prefill_name);
  const ActorName other{"local", "prefill", "other"};
  auto impostor = m.stand_in(other);
  Received g, p;
  m.sync(*gateway, gateway_name, decode_name, g);

  generate(m, gateway_name, 31, gateway_name.to_string(), 8, prefill_name.to_string());
  REQUIRE(receive_until(*prefill, p, 5000ms,
                        [](const Received& r) { return !r.prefill_requests.empty(); }));
  CHECK(p.prefill_requests[0] == 31);

  // A stranger's error (which would make decode give up on prefill and cancel it there) and
  // its result (KV to pull from wherever it says) are dropped.
  error_about(m, other, decode_name, 31);
  m.send(other, decode_name, 31, [](wire::Envelope::Builder b) {
    auto r = b.getBody().initPrefillResult();
    r.setRequestId(31);
    r.setFirstTokenId(7);
    r.initBlocks(3);
  });
  Received after;
  m.sync(*gateway, gateway_name, decode_name, after);
  drain(*prefill, p, 300ms);
  CHECK(p.cancels.empty());
  CHECK(after.tokens.empty());
  CHECK_FALSE(after.finish.has_value());
  CHECK(after.errors.empty());

  // The prefill instance it asked fails it: decode cancels it there and prefills locally.
  error_about(m, prefill_name, decode_name, 31);
  REQUIRE(receive_until(*gateway, after, 10000ms, finished));
  CHECK(after.errors.empty());
  CHECK(after.finish == wire::FinishReason::LENGTH);
  CHECK(after.tokens.size() == 8);
  drain(*prefill, p);
  REQUIRE(p.cancels.size() == 1);
  CHECK(p.cancels[0] == 31);
  expect_nothing(*impostor);
}

TEST_CASE("prefill: only the decode instance that asked releases or cancels a request") {
  Members m(false, true);
  auto decode = m.stand_in(decode_name);
  const ActorName other{"local", "decode", "other"};
  auto impostor = m.stand_in(other);
  Received d;
  m.sync(*decode, decode_name, prefill_name, d);

  auto tokens = prompt_tokens();
  auto hashes = prompt_hashes();
  auto ask = [&](uint64_t id) {
    m.send(decode_name, prefill_name, id, [&](wire::Envelope::Builder b) {
      auto r = b.getBody().initPrefillRequest();
      r.setRequestId(id);
      messages::set_tokens(r.initPromptTokenIds(static_cast<unsigned>(tokens.size())), tokens);
      messages::set_hashes(r.initBlockHashes(static_cast<unsigned>(hashes.size())), hashes);
      r.getSampling().setTemperature(0);
      r.setHoldTimeoutMs(600000);
    });
  };
  auto running = [&] { return m.gauge("tandem:num_requests_running", "prefill"); };
  ask(41);
  REQUIRE(receive_until(*decode, d, 10000ms, [](const Received& r) {
    return r.prefill_results > 0 || !r.errors.empty();
  }));
  REQUIRE_MESSAGE(d.errors.empty(), d.errors.at(0));
  m.sync(*decode, decode_name, prefill_name, d);
  CHECK(running() == 1);  // its blocks are held for the pull

  // A stranger's pull-done and cancel are dropped: the blocks stay held for the asker.
  m.send(other, prefill_name, 41, [](wire::Envelope::Builder b) {
    auto done = b.getBody().initKvPullDone();
    done.setRequestId(41);
    done.setOk(true);
  });
  cancel(m, other, prefill_name, 41);
  m.sync(*decode, decode_name, prefill_name, d);
  CHECK(running() == 1);

  // The asker's pull-done releases them.
  m.send(decode_name, prefill_name, 41, [](wire::Envelope::Builder b) {
    auto done = b.getBody().initKvPullDone();
    done.setRequestId(41);
    done.setOk(true);
  });
  m.sync(*decode, decode_name, prefill_name, d);
  CHECK(running() == 0);

  // And the asker's cancel ends a held request the same way.
  ask(42);
  REQUIRE(receive_until(*decode, d, 10000ms, [](const Received& r) {
    return r.prefill_results > 1 || !r.errors.empty();
  }));
  m.sync(*decode, decode_name, prefill_name, d);
  CHECK(running() == 1);
  cancel(m, decode_name, prefill_name, 42);
  m.sync(*decode, decode_name, prefill_name, d);
  CHECK(running() == 0);
  expect_nothing(*impostor);
}
