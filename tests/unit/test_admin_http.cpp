// The admin HTTP server, exercised with a plain blocking socket client written here.
#include <arpa/inet.h>
#include <doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "runtime/obs/admin_http.hpp"

using tandem::obs::AdminHttpServer;
using tandem::obs::AdminResponse;
using tandem::obs::AdminRoute;

namespace {

struct HttpReply {
  std::string status_line;
  std::string headers;  // raw header block, lower-cased names kept as sent
  std::string body;
};

int connect_local(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval timeout{5, 0};  // a hung server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// Sends one request, half-closes, reads to EOF and splits the reply.
HttpReply http_request(uint16_t port, const std::string& method, const std::string& path) {
  int fd = connect_local(port);
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  ::shutdown(fd, SHUT_WR);  // the server closes after answering: we read to EOF
  std::string raw;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n >= 0);  // < 0 means the 5 s timeout passed
    if (n == 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  HttpReply reply;
  size_t line_end = raw.find("\r\n");
  size_t head_end = raw.find("\r\n\r\n");
  REQUIRE(line_end != std::string::npos);
  REQUIRE(head_end != std::string::npos);
  reply.status_line = raw.substr(0, line_end);
  reply.headers = raw.substr(line_end + 2, head_end - line_end - 2);
  reply.body = raw.substr(head_end + 4);
  return reply;
}

bool has_header(const HttpReply& reply, const std::string& line) {
  return reply.headers.find(line) != std::string::npos;
}

}  // namespace

TEST_CASE("GET /metrics and /health; 404 for unknown paths; 405 for other methods") {
  tandem::obs::Registry registry;
  registry.counter("tandem:requests_total", "Requests.", {{"instance", "gw-0"}}).value()->inc(3);
  std::atomic<bool> healthy{true};
  AdminHttpServer server(
      "127.0.0.1", 0,
      {tandem::obs::metrics_route(registry), tandem::obs::health_route([&healthy]() {
         return tandem::obs::HealthStatus{healthy.load(), healthy ? "ok" : "fabric down"};
       })});
  REQUIRE(server.start().ok());
  uint16_t port = server.port();
  CHECK(port != 0);

  HttpReply metrics = http_request(port, "GET", "/metrics");
  CHECK(metrics.status_line == "HTTP/1.1 200 OK");
  CHECK(has_header(metrics, "Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  CHECK(metrics.body == registry.render_prometheus());
  CHECK(metrics.body.find("tandem:requests_total{instance=\"gw-0\"} 3\n") != std::string::npos);

  CHECK(http_request(port, "GET", "/metrics?x=1").status_line == "HTTP/1.1 200 OK");

  HttpReply health = http_request(port, "GET", "/health");
  CHECK(health.status_line == "HTTP/1.1 200 OK");
  CHECK(health.body == "ok\n");
  healthy = false;
  health = http_request(port, "GET", "/health");
  CHECK(health.status_line == "HTTP/1.1 503 Service Unavailable");
  CHECK(health.body == "fabric down\n");

  HttpReply missing = http_request(port, "GET", "/nope");
  CHECK(missing.status_line == "HTTP/1.1 404 Not Found");
  CHECK(missing.body == "not found: /nope\n");

  HttpReply post = http_request(port, "POST", "/metrics");
  CHECK(post.status_line == "HTTP/1.1 405 Method Not Allowed");
  CHECK(has_header(post, "Allow: GET"));
  CHECK(post.body == "method not allowed: POST /metrics (only GET)\n");

  server.stop();
  server.stop();  // idempotent
}

TEST_CASE("a throwing handler gives 500; custom routes and content types pass through") {
  AdminHttpServer server(
      "127.0.0.1", 0,
      {AdminRoute{"/boom", []() -> AdminResponse { throw std::runtime_error("no state yet"); }},
       AdminRoute{"/json", []() {
                    return AdminResponse{200, "application/json", "{}"};
                  }}});
  REQUIRE(server.start().ok());
  HttpReply boom = http_request(server.port(), "GET", "/boom");
  CHECK(boom.status_line == "HTTP/1.1 500 Internal Server Error");
  CHECK(boom.body == "handler for /boom failed: no state yet\n");
  HttpReply json = http_request(server.port(), "GET", "/json");
  CHECK(has_header(json, "Content-Type: application/json"));
  CHECK(json.body == "{}");
}

TEST_CASE("binding a busy port is an error naming host:port") {
  AdminHttpServer first("127.0.0.1", 0, {});
  REQUIRE(first.start().ok());
  uint16_t busy = first.port();
  AdminHttpServer second("127.0.0.1", busy, {});
  auto status = second.start();
  REQUIRE_FALSE(status.ok());
  CHECK(status.error().kind == tandem::ErrorKind::failed);
  std::string expected = "admin http: cannot listen on 127.0.0.1:" + std::to_string(busy);
  CHECK(status.error().message.find(expected) == 0);
  second.stop();  // harmless after a failed start
  // The first server still answers.
  CHECK(http_request(busy, "GET", "/x").status_line == "HTTP/1.1 404 Not Found");
}

TEST_CASE("a bad host is an error, not a crash") {
  AdminHttpServer server("no.such.host.invalid", 0, {});
  auto status = server.start();
  REQUIRE_FALSE(status.ok());
  CHECK(status.error().message.find("no.such.host.invalid:0") != std::string::npos);
}

TEST_CASE("stop is clean: quick, frees the port, and drops an idle open connection") {
  auto server = std::make_unique<AdminHttpServer>("127.0.0.1", 0, std::vector<AdminRoute>{});
  REQUIRE(server->start().ok());
  uint16_t port = server->port();
  int idle = connect_local(port);  // a client that never sends anything
  auto begin = std::chrono::steady_clock::now();
  std::thread stopper([&server]() { server->stop(); });  // from another thread
  stopper.join();
  auto elapsed = std::chrono::steady_clock::now() - begin;
  CHECK(elapsed < std::chrono::seconds(2));
  char byte;
  CHECK(::recv(idle, &byte, 1, 0) == 0);  // the server closed it
  ::close(idle);
  server.reset();
  // The port is free again: a new server can bind it.
  AdminHttpServer again("127.0.0.1", port, {});
  CHECK(again.start().ok());
}
