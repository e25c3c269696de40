// The gateway HTTP server (kj-http transport), driven by a plain-socket client.
#include <doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/gateway/http_server.hpp"
#include "tests/unit/http_test_client.hpp"

using http_test::Client;
using tandem::gateway::HttpHandler;
using tandem::gateway::HttpLimits;
using tandem::gateway::HttpRequest;
using tandem::gateway::HttpServer;
using tandem::gateway::ResponseStream;

namespace {

using namespace std::chrono_literals;

// Routes: "/" (GET/HEAD), "/echo", "/stream" (kept for the test to drive), "/throw", "/drop";
// anything else: the handler's own 404.
class TestHandler final : public HttpHandler {
 public:
  void on_request(const HttpRequest& request, std::shared_ptr<ResponseStream> out) override {
    calls.fetch_add(1);
    if (request.path == "/") {
      out->send(200, {{"Content-Type", "text/plain"}}, "tandem gateway\n");
    } else if (request.path == "/echo") {
      std::string body = request.method + "|" + request.path + "|" + request.query + "|" +
                         std::string(request.header("x-TEST-header").value_or("<none>")) + "|" +
                         std::to_string(request.body.size()) + "|" + request.client_address;
      out->send(200, {{"Content-Type", "text/plain"}, {"X-Reply", "yes"}}, body);
    } else if (request.path == "/stream") {
      REQUIRE(out->start(200, {{"Content-Type", "text/event-stream"}}));
      std::lock_guard lock(mutex);
      streams.push_back(out);
      cv.notify_all();
    } else if (request.path == "/throw" || request.path == "/v1/messages/throw") {
      throw std::runtime_error("boom");
    } else if (request.path == "/drop" || request.path == "/v1/messages/drop") {
      // dropping `out` without answering: the server answers 500
    } else {
      out->send(404, {{"Content-Type", "application/json"}},
                "{\"error\":\"no route " + request.path + "\"}");
    }
  }

  // Waits until `count` streams have started; returns them.
  std::vector<std::shared_ptr<ResponseStream>> wait_streams(size_t count) {
    std::unique_lock lock(mutex);
    REQUIRE(cv.wait_for(lock, 10s, [this, count]() { return streams.size() >= count; }));
    return streams;
  }

  std::atomic<int> calls{0};
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::shared_ptr<ResponseStream>> streams;
};

struct Fixture {
  explicit Fixture(HttpLimits limits = {}) : server("127.0.0.1", 0, limits, handler) {
    auto started = server.start();
    REQUIRE(started.ok());
  }
  TestHandler handler;
  HttpServer server;
};

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

}  // namespace

TEST_CASE("GET and POST with query, headers, body and keep-alive on one connection") {
  Fixture f;
  Client client(f.server.port());
  auto first = client.request("GET", "/echo?a=1&b=2", "", "X-Test-Header: hello\r\n");
  CHECK(first.status == 200);
  CHECK(first.has_header("X-Reply: yes"));
  CHECK(first.has_header("Content-Length: "));
  CHECK(first.body.rfind("GET|/echo|a=1&b=2|hello|0|127.0.0.1:", 0) == 0);
  // The same connection serves a second request (keep-alive), with a body.
  auto second = client.request("POST", "/echo", std::string(1000, 'x'));
  CHECK(second.status == 200);
  CHECK(second.body.rfind("POST|/echo||<none>|1000|127.0.0.1:", 0) == 0);
  CHECK(f.handler.calls.load() == 2);
  CHECK(f.server.stats().connections_total == 1);
  CHECK(f.server.stats().requests_total == 2);
}

TEST_CASE("GET / and HEAD /: HEAD gets the headers without a body") {
  Fixture f;
  Client client(f.server.port());
  auto get = client.request("GET", "/");
  CHECK(get.status == 200);
  CHECK(get.body == "tandem gateway\n");
  auto head = client.request("HEAD", "/");
  CHECK(head.status == 200);
  CHECK(head.has_header("Content-Length: 15"));
  // No body bytes follow: the next response on the connection parses cleanly.
  auto again = client.request("GET", "/");
  CHECK(again.body == "tandem gateway\n");
}

TEST_CASE("unknown paths reach the handler, which answers 404") {
  Fixture f;
  Client client(f.server.port());
  auto reply = client.request("GET", "/v1/nothing");
  CHECK(reply.status == 404);
  CHECK(reply.body == "{\"error\":\"no route /v1/nothing\"}");
  CHECK(f.handler.calls.load() == 1);
}

TEST_CASE("a body over body_bytes_max gets 413 from the server, before the handler") {
  HttpLimits limits;
  limits.body_bytes_max = 1000;
  Fixture f(limits);
  {
    Client client(f.server.port());
    auto reply = client.request("POST", "/echo", std::string(1001, 'x'));
    CHECK(reply.status == 413);
    CHECK(reply.has_header("Content-Type: application/json"));
    CHECK(reply.body.find("\"code\":\"body_too_large\"") != std::string::npos);
    CHECK(reply.body.find("1001 bytes; the limit is 1000 bytes") != std::string::npos);
  }
  {  // chunked upload (no Content-Length): detected while reading
    Client client(f.server.port());
    std::string chunk(600, 'y');
    client.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n" +
                chunk + "\r\n258\r\n" + chunk + "\r\n0\r\n\r\n");
    auto reply = client.read_response();
    CHECK(reply.status == 413);
    CHECK(reply.body.find("exceeds the limit of 1000 bytes") != std::string::npos);
  }
  {  // exactly at the limit passes
    Client client(f.server.port());
    auto reply = client.request("POST", "/echo", std::string(1000, 'x'));
    CHECK(reply.status == 200);
  }
  CHECK(f.handler.calls.load() == 1);
  CHECK(f.server.stats().requests_rejected == 2);
}

TEST_CASE("request headers over header_bytes_max get 431") {
  HttpLimits limits;
  limits.header_bytes_max = 512;
  Fixture f(limits);
  Client client(f.server.port());
  auto reply = client.request("GET", "/", "", "X-Big: " + std::string(600, 'h') + "\r\n");
  CHECK(reply.status == 431);
  CHECK(reply.body.find("headers_too_large") != std::string::npos);
  CHECK(f.handler.calls.load() == 0);
}

TEST_CASE("a throwing handler or one that drops the stream yields 500") {
  Fixture f;
  Client client(f.server.port());
  auto thrown = client.request("GET", "/throw");
  CHECK(thrown.status == 500);
  CHECK(thrown.body.find("request handler failed: boom") != std::string::npos);
  Client other(f.server.port());
  auto dropped = other.request("GET", "/drop");
  CHECK(dropped.status == 500);
  CHECK(dropped.body.find("no_response") != std::string::npos);
  // Under /v1/messages the server's own 500s are Anthropic-shaped (issue 12).
  for (const char* path : {"/v1/messages/throw", "/v1/messages/drop"}) {
    Client anthropic(f.server.port());
    auto r = anthropic.request("GET", path);
    CHECK(r.status == 500);
    CHECK(r.body.rfind(R"({"type":"error","error":{"type":"api_error","message":")", 0) == 0);
  }
}

TEST_CASE("streamed chunks arrive in order and incrementally (first before end)") {
  Fixture f;
  Client client(f.server.port());
  client.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  auto stream = f.handler.wait_streams(1)[0];
  auto head = client.read_head();
  CHECK(head.status == 200);
  CHECK(head.chunked);
  CHECK(head.has_header("Content-Type: text/event-stream"));
  for (int i = 0; i < 5; ++i) {
    std::string event = "data: " + std::to_string(i) + "\n\n";
    // Written from another thread, as the gateway actor does.
    std::thread writer([&stream, event]() { CHECK(stream->write(event)); });
    writer.join();
    CHECK(client.read_chunk() == event);  // arrives before the next write and before end()
  }
  CHECK(stream->end());
  CHECK(client.read_chunk().empty());  // the terminating chunk
  CHECK(!stream->is_cancelled());
  // Keep-alive after a stream.
  CHECK(client.request("GET", "/").status == 200);
}

TEST_CASE("a client that disconnects mid-stream fires on_cancel exactly once") {
  Fixture f;
  Client client(f.server.port());
  client.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  auto stream = f.handler.wait_streams(1)[0];
  std::atomic<int> cancels{0};
  stream->on_cancel([&cancels]() { cancels.fetch_add(1); });
  REQUIRE(stream->write("data: first\n\n"));
  client.read_head();
  CHECK(client.read_chunk() == "data: first\n\n");
  client.close();
  // Keep writing (as a generator would) until the server notices.
  std::thread writer([&stream]() {
    for (int i = 0; i < 500 && stream->write("data: more\n\n"); ++i) {
      std::this_thread::sleep_for(10ms);
    }
  });
  writer.join();
  CHECK(eventually([&cancels]() { return cancels.load() == 1; }));
  CHECK(stream->is_cancelled());
  CHECK(!stream->write("data: late\n\n"));
  std::this_thread::sleep_for(50ms);
  CHECK(cancels.load() == 1);
  CHECK(f.server.stats().streams_cancelled == 1);
  // A callback registered after the cancellation fires at once, once.
  std::atomic<int> late{0};
  stream->on_cancel([&late]() { late.fetch_add(1); });
  CHECK(late.load() == 0);  // exactly once per stream: it already fired
}

TEST_CASE("on_cancel registered after a disconnect fires immediately; never after end()") {
  Fixture f;
  Client a(f.server.port());
  a.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  auto first = f.handler.wait_streams(1)[0];
  a.close();
  for (int i = 0; i < 500 && first->write("x"); ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(first->is_cancelled());
  std::atomic<int> cancels{0};
  first->on_cancel([&cancels]() { cancels.fetch_add(1); });
  CHECK(cancels.load() == 1);

  Client b(f.server.port());
  b.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  auto second = f.handler.wait_streams(2)[1];
  std::atomic<int> second_cancels{0};
  second->on_cancel([&second_cancels]() { second_cancels.fetch_add(1); });
  CHECK(second->write("done"));
  CHECK(second->end());
  b.read_head();
  CHECK(b.read_chunk() == "done");
  CHECK(b.read_chunk().empty());
  b.close();
  std::this_thread::sleep_for(100ms);
  CHECK(second_cancels.load() == 0);
}

TEST_CASE("a handler that drops a started stream cuts the connection (no clean end)") {
  Fixture f;
  Client client(f.server.port());
  client.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  auto stream = f.handler.wait_streams(1)[0];
  REQUIRE(stream->write("data: partial\n\n"));
  client.read_head();
  CHECK(client.read_chunk() == "data: partial\n\n");
  {
    std::lock_guard lock(f.handler.mutex);
    f.handler.streams.clear();
  }
  stream.reset();  // the last reference: the stream is abandoned mid-way
  CHECK(client.closed_by_peer());
  CHECK(client.pending().empty());  // no terminating chunk arrived
}

TEST_CASE("stop() with open streams cancels them, fires on_cancel and joins cleanly") {
  TestHandler handler;
  auto server = std::make_unique<HttpServer>("127.0.0.1", 0, HttpLimits{}, handler);
  REQUIRE(server->start().ok());
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<Client>(server->port()));
    clients.back()->send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  auto streams = handler.wait_streams(3);
  std::atomic<int> cancels{0};
  for (auto& s : streams) {
    s->on_cancel([&cancels]() { cancels.fetch_add(1); });
    CHECK(s->write("data: x\n\n"));
  }
  // A writer keeps going on another thread while the server stops.
  std::atomic<bool> writing{true};
  std::thread writer([&streams, &writing]() {
    while (writing.load()) {
      for (auto& s : streams) s->write("data: y\n\n");
      std::this_thread::sleep_for(1ms);
    }
  });
  server->stop();
  CHECK(cancels.load() == 3);
  for (auto& s : streams) {
    CHECK(s->is_cancelled());
    CHECK(!s->write("after stop"));
  }
  for (auto& c : clients) CHECK(c->closed_by_peer());
  server.reset();  // destroying the server while the handler still holds streams is fine
  for (auto& s : streams) CHECK(!s->write("after destroy"));
  writing = false;
  writer.join();
  CHECK(cancels.load() == 3);
}

TEST_CASE("a slow reader overflows stream_buffer_bytes_max: the stream is cancelled") {
  HttpLimits limits;
  limits.stream_buffer_bytes_max = 64 << 10;
  Fixture f(limits);
  Client client(f.server.port(), 4096);  // small receive buffer, and it never reads
  client.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  auto stream = f.handler.wait_streams(1)[0];
  std::atomic<int> cancels{0};
  stream->on_cancel([&cancels]() { cancels.fetch_add(1); });
  std::string chunk(16 << 10, 'z');
  uint64_t buffered_max = 0;
  int writes = 0;
  for (; writes < 100000 && stream->write(chunk); ++writes) {
    buffered_max = std::max(buffered_max, stream->buffered_bytes());
    if (writes % 16 == 0) std::this_thread::sleep_for(1ms);  // let the loop drain the socket
  }
  CHECK(writes < 100000);  // it did overflow
  CHECK(buffered_max <= limits.stream_buffer_bytes_max);
  CHECK(stream->is_cancelled());
  CHECK(eventually([&cancels]() { return cancels.load() == 1; }));
  CHECK(client.closed_by_peer(10000));
}

TEST_CASE("connections over connections_max get 503 and are closed") {
  HttpLimits limits;
  limits.connections_max = 2;
  Fixture f(limits);
  Client a(f.server.port());
  Client b(f.server.port());
  CHECK(a.request("GET", "/").status == 200);
  CHECK(b.request("GET", "/").status == 200);
  Client c(f.server.port());
  c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  auto reply = c.read_response();
  CHECK(reply.status == 503);
  CHECK(reply.body.find("connections_max") != std::string::npos);
  CHECK(c.closed_by_peer());
  CHECK(f.server.stats().connections_rejected == 1);
  a.close();
  CHECK(eventually([&f]() { return f.server.stats().connections_open == 1; }));
  Client d(f.server.port());
  CHECK(d.request("GET", "/").status == 200);
}

TEST_CASE("start() on a port in use fails naming host:port") {
  Fixture f;
  TestHandler other_handler;
  HttpServer other("127.0.0.1", f.server.port(), HttpLimits{}, other_handler);
  auto started = other.start();
  REQUIRE(!started.ok());
  CHECK(started.error().message.find("cannot listen on 127.0.0.1:" +
                                     std::to_string(f.server.port())) != std::string::npos);
}

TEST_CASE("HttpRequest::header is case-insensitive and returns the first match") {
  HttpRequest request;
  request.headers = {{"Content-Type", "a"}, {"X-Api-Key", "k1"}, {"x-api-key", "k2"}};
  CHECK(request.header("content-type").value() == "a");
  CHECK(request.header("X-API-KEY").value() == "k1");
  CHECK(!request.header("authorization").has_value());
}

TEST_CASE("a malformed request gets 400 with a JSON error from the server") {
  Fixture f;
  Client client(f.server.port());
  client.send("GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n");
  auto reply = client.read_response();
  CHECK(reply.status == 400);
  CHECK(reply.body.find("malformed HTTP request") != std::string::npos);
  CHECK(f.handler.calls.load() == 0);
}
