// tandem/obs: the node's admin HTTP server (/metrics, /health, and owner-supplied routes).
//
// Built on KJ's HTTP library (kj::HttpServer). It runs its own KJ event loop on its own
// thread, started by start() and stopped by stop() (or the destructor) from any other thread.
// Only GET is served: an unknown path gets 404, a known path with another method gets 405
// (with an `Allow: GET` header). A handler that throws gets 500 with the message.
//
// THREADING: handlers run on the server's HTTP thread, one request at a time, concurrently
// with the rest of the program. They must be thread-safe with respect to whatever they read
// (Registry::render_prometheus() is). A handler must not block for long: it stalls every
// other admin request.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/result.hpp"
#include "runtime/obs/metrics.hpp"

namespace tandem::obs {

struct AdminResponse {
  uint32_t status = 200;     // HTTP status code
  std::string content_type;  // e.g. "text/plain; charset=utf-8"
  std::string body;
};

using AdminHandler = std::function<AdminResponse()>;

struct AdminRoute {
  std::string path;  // exact path, e.g. "/metrics"; the query string is ignored when matching
  AdminHandler handler;
};

// GET /metrics: the registry in Prometheus text format. `registry` must outlive the server.
AdminRoute metrics_route(const Registry& registry);

// What /health reports: healthy -> 200, else 503; `detail` is the body (one line is fine).
struct HealthStatus {
  bool healthy = false;
  std::string detail;
};
// GET /health: calls `check` on the HTTP thread (so it must be thread-safe).
AdminRoute health_route(std::function<HealthStatus()> check);

class AdminHttpServer {
 public:
  // host: an address or name ("127.0.0.1", "0.0.0.0", "::1"); port 0 picks a free port.
  // Routes must have distinct paths starting with '/' (asserted: the owner builds them).
  AdminHttpServer(std::string host, uint16_t port, std::vector<AdminRoute> routes);
  ~AdminHttpServer();  // stop() + join
  AdminHttpServer(const AdminHttpServer&) = delete;
  AdminHttpServer& operator=(const AdminHttpServer&) = delete;

  // Every route then asks for `Authorization: Bearer <token>` (compared in constant time)
  // and answers 401 without it. Before start().
  void require_bearer_token(std::string token);

  // Binds and starts serving; returns once the socket listens (or binding failed).
  // Errors: failed "admin http: cannot listen on HOST:PORT: <reason>" (port in use, bad
  // address). Precondition (asserted): not started before.
  Status start();

  // The port actually bound (useful with port 0). Precondition (asserted): start() succeeded.
  uint16_t port() const;

  // Stops accepting, drops open connections, ends the loop and joins the thread. Idempotent;
  // callable from any thread except the HTTP thread itself (i.e. not from a handler).
  void stop();

 private:
  struct Shared;  // state shared with the HTTP thread (fulfiller, bound port, start result)
  void run();     // the HTTP thread's body

  std::string host_;
  uint16_t port_requested_;
  std::vector<AdminRoute> routes_;
  std::string token_;  // "" = no token asked for
  std::unique_ptr<Shared> shared_;
  std::thread thread_;
  bool started_ = false;
};

}  // namespace tandem::obs
