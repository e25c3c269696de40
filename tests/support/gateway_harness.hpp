// Test support: the real gateway actor (HTTP server, parsers, templates, tokenizer, output
// parser, renderers) in one process over a real bridge, with scoped-actor stand-ins for the
// router and one decode instance. A test posts a request and scripts what decode sends back
// (token chunks, then a finish); it gets the HTTP answer and the prompt token ids the gateway
// sent to decode, so it can check both what the client saw and what the model was given.
#pragma once

#include <doctest.h>

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "actors/gateway/gateway_actor.hpp"
#include "messages/convert.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/local_bridge.hpp"
#include "tests/support/process.hpp"

namespace tandem::testing {

// One node "a": gateway gw, router rt, decode dec on executor ex (never started: the stand-ins
// answer). `model_path`, `chat_format`, `max_model_tokens` go into [model] as given.
inline std::string gateway_harness_manifest(uint16_t fabric_port, uint16_t http_port,
                                            const std::string& model_path,
                                            const std::string& chat_format,
                                            uint32_t max_model_tokens) {
  return "[cluster]\nname = \"gw-protocol\"\n[model]\nname = \"stories15M\"\npath = \"" +
         model_path + "\"\nblock_tokens = 16\nmax_model_tokens = " +
         std::to_string(max_model_tokens) + "\nchat_format = \"" + chat_format + "\"\n" +
         "[[node]]\nname = \"a\"\nhost = \"127.0.0.1\"\nfabric_port = " +
         std::to_string(fabric_port) + "\nadmin_port = " + std::to_string(free_port()) +
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

struct DecodeScript {
  std::vector<Chunk> chunks;
  uint32_t finish_tokens = 0;  // output tokens the finish reports
  wire::FinishReason reason = wire::FinishReason::LENGTH;
  bool step_events = false;  // send as decode does: one StepEvents frame per source
  // Before the router's reply: a reply from a router the gateway did not ask and an error
  // from an instance not serving the request; after it, a second reply from the router.
  // The gateway must take only the one reply it waits for.
  bool forged_routes = false;
};

struct Exchange {
  http::Response response;
  std::vector<int32_t> prompt;  // the prompt token ids the gateway sent to decode
};

class GatewayHarness {
 public:
  explicit GatewayHarness(const std::string& model_path = model_dir(),
                          const std::string& chat_format = "plain",
                          uint32_t max_model_tokens = 256)
      : http_port_(free_port()),
        manifest_(parse_manifest_or_fail(gateway_harness_manifest(
            free_port(), http_port_, model_path, chat_format, max_model_tokens))),
        system_(tandem_actor_config(cfg_)),
        local_(manifest_, "a"),
        router_(system_),
        decode_(system_) {
    using namespace std::chrono_literals;
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
    REQUIRE(eventually(5000ms, [&] {
      auto h = http::get(http_port_, "/health", 1000ms);
      return h.ok() && h.status == 200;
    }));
    auto tokenizer = text::load_tokenizer(model_path);
    REQUIRE(tokenizer.ok());
    tokenizer_ = std::move(tokenizer).value();
  }
  ~GatewayHarness() {
    service_->stop();
    for (const auto& a : service_->actors()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  uint16_t http_port() const { return http_port_; }
  text::Tokenizer& tokenizer() { return *tokenizer_; }

  // Posts `body` to `path` while the stand-ins answer: the router picks a/decode/dec, the
  // decode stand-in sends the script's chunks then its finish.
  Exchange post(const std::string& path, const std::string& body, const DecodeScript& script) {
    using namespace std::chrono_literals;
    auto answer = std::async(std::launch::async, [this, path, body] {
      return http::post(http_port_, path, body, 10000ms);
    });
    // The router stand-in: one RouteRequest, answered with the decode instance.
    runtime::InboundFrame route;
    router_->receive([&route](runtime::InboundFrame& f) { route = f; }, caf::after(5s) >> [] {});
    if (!route.frame) return {answer.get(), {}};  // answered before routing (an error)
    auto route_env = route.frame->envelope();
    REQUIRE(route_env.getBody().which() == wire::Envelope::Body::ROUTE_REQUEST);
    uint64_t id = route_env.getBody().getRouteRequest().getRequestId();
    messages::ActorName gateway = messages::get_name(route_env.getSource());
    auto reply_from = [&](const messages::ActorName& from, const std::string& decode) {
      REQUIRE(local_.bridge->send(from, gateway, id, [&decode](wire::Envelope::Builder b) {
        b.getBody().initRouteReply().setDecodeInstance(decode);
      }).ok());
    };
    if (script.forged_routes) {
      reply_from({"a", "router", "other"}, "a/decode/old");
      REQUIRE(local_.bridge->send({"a", "decode", "old"}, gateway, id, [id](wire::Envelope::Builder b) {
        auto e = b.getBody().initError();
        e.setRequestId(id);
        e.setKind(wire::ErrorKind::FAILED);
        e.setMessage("forged");
      }).ok());
    }
    reply_from({"a", "router", "rt"}, "a/decode/dec");
    if (script.forged_routes) reply_from({"a", "router", "rt"}, "a/decode/old");
    // The decode stand-in: the GenerateRequest (cancels for earlier requests are skipped).
    Exchange out;
    bool generated = false;
    for (int i = 0; i < 8 && !generated; ++i) {
      decode_->receive(
          [&generated, &out](runtime::InboundFrame& f) {
            auto body = f.frame->envelope().getBody();
            generated = body.which() == wire::Envelope::Body::GENERATE_REQUEST;
            if (!generated) return;
            for (int32_t t : body.getGenerateRequest().getPromptTokenIds()) out.prompt.push_back(t);
          },
          caf::after(5s) >> [] {});
    }
    REQUIRE(generated);
    if (script.step_events) {
      send_step_events(script, gateway, id);
    } else {
      send_chunks(script, gateway, id);
    }
    out.response = answer.get();
    return out;
  }

  // A non-streamed completion of "Once upon a time" (8 tokens at most).
  http::Response complete(const std::vector<Chunk>& chunks, uint32_t finish_tokens,
                          bool step_events = false) {
    DecodeScript script{chunks, finish_tokens, wire::FinishReason::LENGTH, step_events};
    return post("/v1/completions",
                R"({"model":"stories15M","prompt":"Once upon a time","max_tokens":8})", script)
        .response;
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
  void set_finish(wire::Finish::Builder f, const DecodeScript& script, uint64_t id) {
    f.setRequestId(id);
    f.setReason(script.reason);
    f.setPromptTokens(5);
    f.setOutputTokens(script.finish_tokens);
  }

  void send_chunks(const DecodeScript& script, const messages::ActorName& gateway, uint64_t id) {
    for (const Chunk& c : script.chunks) {
      auto from = messages::ActorName::parse(c.from);
      REQUIRE(from.ok());
      REQUIRE(local_.bridge->send(*from, gateway, id, [&c, id](wire::Envelope::Builder b) {
        auto chunk = b.getBody().initTokenChunk();
        chunk.setRequestId(id);
        chunk.setFirstIndex(c.first_index);
        messages::set_tokens(chunk.initTokenIds(static_cast<unsigned>(c.tokens.size())),
                             c.tokens);
      }).ok());
    }
    REQUIRE(local_.bridge->send({"a", "decode", "dec"}, gateway, id,
                                [this, &script, id](wire::Envelope::Builder b) {
                                  set_finish(b.getBody().initFinish(), script, id);
                                }).ok());
  }

  void send_step_events(const DecodeScript& script, const messages::ActorName& gateway,
                        uint64_t id) {
    std::vector<std::string> sources;
    for (const Chunk& c : script.chunks) {
      if (std::find(sources.begin(), sources.end(), c.from) == sources.end()) {
        sources.push_back(c.from);
      }
    }
    if (std::find(sources.begin(), sources.end(), "a/decode/dec") == sources.end()) {
      sources.push_back("a/decode/dec");
    }
    for (const std::string& source : sources) {
      std::vector<const Chunk*> mine;
      for (const Chunk& c : script.chunks) {
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
        if (finishes) set_finish(events[static_cast<unsigned>(mine.size())].initFinish(), script, id);
      }).ok());
    }
  }

  uint16_t http_port_;
  config::Manifest manifest_;
  caf::actor_system_config cfg_;
  // Before the actor system: destroyed after it, once its destructor has joined every actor
  // (a preparer still starting when a test ends creates its counters in it; ASan caught the
  // registry destroyed first).
  obs::Registry registry_;
  caf::actor_system system_;
  LocalBridge local_;
  actors::ShellContext ctx_;
  caf::scoped_actor router_, decode_;
  std::unique_ptr<actors::GatewayService> service_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
};

}  // namespace tandem::testing
