// The gateway: the OpenAI/Anthropic-compatible HTTP API of the cluster.
//
// The HTTP server (http_server.hpp) runs on its own thread; GatewayFront answers the cheap
// endpoints there (GET /v1/models, /health, /metrics, HEAD|GET /, auth failures) and hands
// every POST to the gateway actor. The actor parses (api_request.hpp), renders the chat
// template, tokenizes, hashes the prompt's blocks once, asks the router where to go, sends
// GenerateRequest to the chosen decode instance, and turns TokenChunks into each API's
// stream (detokenizer -> stop strings -> output parser -> renderer). A client that goes
// away cancels its request on decode (and decode cancels prefill). A request that has not
// produced a token when its decode node fails is routed again (at most retries_max times);
// after the first token it ends with an error event.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <vector>

#include "actors/common/shell.hpp"

namespace tandem::gateway {
class HttpServer;
}

namespace tandem::actors {

// Owns the HTTP server and the front handler; stops the server on destruction.
class GatewayService {
 public:
  virtual ~GatewayService() = default;
  virtual void stop() = 0;
  // Graceful: new requests get 503 shutting_down (with Retry-After) and /health 503, while
  // the ones already taken go on. Any thread.
  virtual void begin_drain() = 0;
  // Requests whose response has not ended (HTTP exchanges open). Any thread.
  virtual uint64_t open_requests() const = 0;
  // The gateway's actors: the gateway actor first, then its request preparers; the node
  // stops them at shutdown.
  virtual std::vector<caf::actor> actors() const = 0;
  // The same actors for the node's supervisor (runtime/node/supervisor.hpp), with how to
  // respawn each: "NODE/gateway/INSTANCE" and "NODE/gateway/INSTANCE/workers-preparer-0", ...
  virtual std::vector<runtime::Supervised> supervised() const = 0;
};

// Spawns the gateway actor for `instance`, loads the tokenizer and starts the HTTP server on
// the node's http_port. Errors: the tokenizer or chat template cannot be loaded, the port
// cannot be bound.
Result<std::unique_ptr<GatewayService>> start_gateway(caf::actor_system& system,
                                                      const ShellContext& ctx,
                                                      const config::Instance& instance);

}  // namespace tandem::actors
