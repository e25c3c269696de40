// The gateway actor against stand-ins for the router and decode, in one process over a real
// bridge: what it accepts from decode. Tokens come only from the decode instance the request
// is on (a late chunk from another instance is ignored), and a chunk that arrives after a
// gap fails the request instead of streaming text with a hole.
#include <doctest.h>

#include <algorithm>

#include <caf/all.hpp>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/gateway/gateway_actor.hpp"
#include "messages/convert.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/local_bridge.hpp"
#include "tests/support/process.hpp"

using namespace tandem;
using namespace std::chrono_literals;
namespace http = tandem::testing::http;

namespace {

std::string manifest_text(uint16_t fabric_port, uint16_t http_port) {
  return "[cluster]\nname = \"gw-protocol\"\n[model]\nname = \"stories15M\"\npath = \"" +
         testing::model_dir() + "\"\nblock_tokens = 16\n"
         "max_model_tokens = 256\nchat_format = \"plain\"\n"
         "[[node]]\nname = \"a\"\nhost = \"127.0.0.1\"\nfabric_port = " +
         std::to_string(fabric_port) + "\nadmin_port = " + std::to_string(testing::free_port()) +
         "\nhttp_port = " + std::to_string(http_port) +
         "\n  [[node.instance]]\n  role = \"gateway\"\n  name = \"gw\"\n"
         "  [[node.instance]]\n  role = \"router\"\n  name = \"rt\"\n"
         "  [[node.instance]]\n  role = \"decode\"\n  name = \"dec\"\n  executor = \"ex\"\n"
         "  [[node.instance]]\n  role = \"executor\"\n  name = \"ex\"\n  device = \"cpu\"\n"
         "  devices = [0]\n";
}

// What the decode stand-in sends for one request, in order.
struct Chunk {
  std::string from;  // "a/decode/dec" or an impostor
  uint32_t first_index = 0;
  std::vector<int32_t> tokens;
};

class Harness {
 public:
  Harness()
      : http_port_(testing::free_port()),
        manifest_(testing::parse_manifest_or_fail(manifest_text(testing::free_port(), http_port_))),
        system_(testing::tandem_actor_config(cfg_)),
        local_(manifest_, "a"),
        router_(system_),
        decode_(system_) {
    ctx_ = actors::ShellContext{&manifest_, local_.bridge.get(), local_.log, &registry_, {}};
    local_.bridge->register_actor({"a", "router", "rt"}, caf::actor_cast<caf::actor>(router_));
    local_.bridge->register_actor({"a", "decode", "dec"}, caf::actor_cast<caf::actor>(decode_));
    const config::Instance* gw = manifest_.instances_of(config::Role::gateway).at(0).second;
    auto started = actors::start_gateway(system_, ctx_, *gw);
    REQUIRE_MESSAGE(started.ok(), started.error().describe());
    service_ = std::move(started).value();
    local_.bridge->set_ready();
    // Decode reports ready (the gateway's /health and admission need one ready decode).
    runtime::InstanceLoadReport ready;
    ready.instance = "a/decode/dec";
    ready.kv_blocks_total = 512;
    caf::anon_send(service_->actors().at(0), ready);
    REQUIRE(testing::eventually(5000ms, [&] {
      auto h = http::get(http_port_, "/health", 1000ms);
      return h.ok() && h.status == 200;
    }));
    auto tokenizer = text::load_tokenizer(testing::model_dir());
    REQUIRE(tokenizer.ok());
    tokenizer_ = std::move(tokenizer).value();
  }
  ~Harness() {
    service_->stop();
    for (const auto& a : service_->actors()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  // Posts a non-streamed completion while the stand-ins answer: the router picks
  // a/decode/dec, the decode stand-in sends `chunks` then a finish for `finish_tokens`.
  // With `step_events`, the stand-ins send as decode does: each source's chunks in one
  // StepEvents frame, the finish inside a/decode/dec's frame (after its chunks).
  http::Response complete(const std::vector<Chunk>& chunks, uint32_t finish_tokens,
                          bool step_events = false) {
    auto answer = std::async(std::launch::async, [&] {
      return http::post(http_port_, "/v1/completions",
                        R"({"model":"stories15M","prompt":"Once upon a time","max_tokens":8})",
                        10000ms);
    });
    // The router stand-in: one RouteRequest, answered with the decode instance.
    runtime::InboundFrame route;
    router_->receive([&](runtime::InboundFrame& f) { route = f; }, caf::after(5s) >> [] {});
    REQUIRE(route.frame);
    auto route_env = route.frame->envelope();
    REQUIRE(route_env.getBody().which() == wire::Envelope::Body::ROUTE_REQUEST);
    uint64_t id = route_env.getBody().getRouteRequest().getRequestId();
    messages::ActorName gateway = messages::get_name(route_env.getSource());
    REQUIRE(local_.bridge->send({"a", "router", "rt"}, gateway, id, [&](wire::Envelope::Builder b) {
      b.getBody().initRouteReply().setDecodeInstance("a/decode/dec");
    }).ok());
    // The decode stand-in: the GenerateRequest, then the scripted chunks and the finish.
    // (Cancels the gateway sent for earlier requests are skipped.)
    bool generated = false;
    for (int i = 0; i < 8 && !generated; ++i) {
      decode_->receive(
          [&](runtime::InboundFrame& f) {
            generated = f.frame->envelope().getBody().which() ==
                        wire::Envelope::Body::GENERATE_REQUEST;
          },
          caf::after(5s) >> [] {});
    }
    REQUIRE(generated);
    if (step_events) {
      send_step_events(chunks, gateway, id, finish_tokens);
      return answer.get();
    }
    for (const Chunk& c : chunks) {
      auto from = messages::ActorName::parse(c.from);
      REQUIRE(from.ok());
      REQUIRE(local_.bridge->send(*from, gateway, id, [&](wire::Envelope::Builder b) {
        auto chunk = b.getBody().initTokenChunk();
        chunk.setRequestId(id);
        chunk.setFirstIndex(c.first_index);
        messages::set_tokens(chunk.initTokenIds(static_cast<unsigned>(c.tokens.size())),
                             c.tokens);
      }).ok());
    }
    REQUIRE(local_.bridge->send({"a", "decode", "dec"}, gateway, id, [&](wire::Envelope::Builder b) {
      auto f = b.getBody().initFinish();
      f.setRequestId(id);
      f.setReason(wire::FinishReason::LENGTH);
      f.setPromptTokens(5);
      f.setOutputTokens(finish_tokens);
    }).ok());
    return answer.get();
  }

  void send_step_events(const std::vector<Chunk>& chunks, const messages::ActorName& gateway,
                        uint64_t id, uint32_t finish_tokens) {
    std::vector<std::string> sources;
    for (const Chunk& c : chunks) {
      if (std::find(sources.begin(), sources.end(), c.from) == sources.end()) {
        sources.push_back(c.from);
      }
    }
    if (std::find(sources.begin(), sources.end(), "a/decode/dec") == sources.end()) {
      sources.push_back("a/decode/dec");
    }
    for (const std::string& source : sources) {
      std::vector<const Chunk*> mine;
      for (const Chunk& c : chunks) {
        if (c.from == source) mine.push_back(&c);
      }
      bool finishes = source == "a/decode/dec";
      auto from = messages::ActorName::parse(source);
      REQUIRE(from.ok());
      REQUIRE(local_.bridge->send(*from, gateway, 0, [&](wire::Envelope::Builder b) {
        auto events = b.getBody().initStepEvents().initEvents(
            static_cast<unsigned>(mine.size() + (finishes ? 1 : 0)));
        for (unsigned i = 0; i < mine.size(); ++i) {
          auto chunk = events[i].initTokenChunk();
          chunk.setRequestId(id);
          chunk.setFirstIndex(mine[i]->first_index);
          messages::set_tokens(chunk.initTokenIds(static_cast<unsigned>(mine[i]->tokens.size())),
                               mine[i]->tokens);
        }
        if (finishes) {
          auto f = events[static_cast<unsigned>(mine.size())].initFinish();
          f.setRequestId(id);
          f.setReason(wire::FinishReason::LENGTH);
          f.setPromptTokens(5);
          f.setOutputTokens(finish_tokens);
        }
      }).ok());
    }
  }

  std::string text_of(const std::vector<int32_t>& ids, int32_t prev) {
    std::string out;
    std::optional<int32_t> p = prev;
    for (int32_t id : ids) {
      out += tokenizer_->decode_piece(p, id);
      p = id;
    }
    return out;
  }

 private:
  uint16_t http_port_;
  config::Manifest manifest_;
  caf::actor_system_config cfg_;
  caf::actor_system system_;
  testing::LocalBridge local_;
  obs::Registry registry_;
  actors::ShellContext ctx_;
  caf::scoped_actor router_, decode_;
  std::unique_ptr<actors::GatewayService> service_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
};

}  // namespace

namespace {

// The completion answers exactly `legit` (Completions continue the prompt's last token,
// "time" = 931).
void check_answer(Harness& h, const http::Response& r, const std::vector<int32_t>& legit) {
  REQUIRE_MESSAGE(r.ok(), r.error);
  CHECK(r.status == 200);
  auto body = nlohmann::json::parse(r.body, nullptr, false);
  REQUIRE_FALSE(body.is_discarded());
  CHECK(body["choices"][0]["text"] == h.text_of(legit, 931));
  CHECK(body["usage"]["completion_tokens"] == legit.size());
}

void check_lost(const http::Response& r) {
  REQUIRE_MESSAGE(r.ok(), r.error);
  CHECK(r.status == 500);
  CHECK(r.body.find("lost") != std::string::npos);
}

}  // namespace

TEST_CASE("gateway: tokens from another decode instance are ignored") {
  Harness h;
  std::vector<int32_t> legit = {263, 2217, 7826}, impostor = {1128};
  check_answer(h, h.complete({{"a/decode/old", 0, impostor}, {"a/decode/dec", 0, legit}}, 3),
               legit);
}

TEST_CASE("gateway: a chunk after a gap fails the request; so does a short finish") {
  Harness h;
  check_lost(h.complete({{"a/decode/dec", 0, {263}}, {"a/decode/dec", 2, {7826}}}, 3));
  auto short_finish = h.complete({{"a/decode/dec", 0, {263, 2217}}}, 3);
  REQUIRE_MESSAGE(short_finish.ok(), short_finish.error);
  CHECK(short_finish.status == 500);
}

TEST_CASE("gateway: StepEvents frames (decode's batched chunks and finish) answer the same, "
          "with the same checks") {
  Harness h;
  std::vector<int32_t> legit = {263, 2217, 7826}, impostor = {1128};
  check_answer(h,
               h.complete({{"a/decode/dec", 0, {263}}, {"a/decode/old", 0, impostor},
                           {"a/decode/dec", 1, {2217, 7826}}},
                          3, true),
               legit);
  check_lost(h.complete({{"a/decode/dec", 0, {263}}, {"a/decode/dec", 2, {7826}}}, 3, true));
}
