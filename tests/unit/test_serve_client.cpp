// The bench HTTP client's response parser and the /metrics summing of `tandem bench serve`.
#include <doctest.h>

#include "bench/http_stream.hpp"
#include "bench/serve_bench.hpp"

using namespace tandem;
using namespace tandem::bench;

namespace {

// Feeds `text` in pieces of `step` bytes; returns the body.
std::string feed_all(ResponseParser& p, const std::string& text, size_t step) {
  std::string body;
  for (size_t i = 0; i < text.size(); i += step) {
    REQUIRE(p.feed(text.data() + i, std::min(step, text.size() - i)).ok());
    body += p.take_body();
  }
  return body;
}

}  // namespace

TEST_CASE("response parser: chunked body split at every byte") {
  std::string text =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
      "6\r\ndata: \r\n1a\r\n{\"choices\":[{\"text\":\"a\"}]}\r\n0\r\n\r\n";
  for (size_t step = 1; step <= text.size(); ++step) {
    ResponseParser p;
    std::string body = feed_all(p, text, step);
    CHECK(p.complete());
    CHECK(p.status() == 200);
    CHECK(p.keep_alive());
    CHECK(body == "data: {\"choices\":[{\"text\":\"a\"}]}");
  }
}

TEST_CASE("response parser: content-length, close-delimited and errors") {
  ResponseParser fixed;
  CHECK(feed_all(fixed, "HTTP/1.1 429 Too Many\r\nContent-Length: 5\r\n\r\nhello", 3) == "hello");
  CHECK(fixed.complete());
  CHECK(fixed.status() == 429);

  ResponseParser open;
  CHECK(feed_all(open, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc", 4) == "abc");
  CHECK_FALSE(open.complete());
  open.on_close();
  CHECK(open.complete());
  CHECK_FALSE(open.keep_alive());

  ResponseParser bad;
  std::string junk = "SSH-2.0-OpenSSH\r\n\r\n";
  CHECK_FALSE(bad.feed(junk.data(), junk.size()).ok());
  ResponseParser bad_chunk;
  std::string chunk = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
  CHECK_FALSE(bad_chunk.feed(chunk.data(), chunk.size()).ok());
}

TEST_CASE("parse_endpoint and sum_metric") {
  auto e = parse_endpoint("127.0.0.1:8123", "--target");
  REQUIRE(e.ok());
  CHECK(e->port == 8123);
  CHECK(parse_endpoint(":80", "--target")->host == "127.0.0.1");
  auto bad = parse_endpoint("localhost:x", "--target");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("--target") != std::string::npos);
  std::string text =
      "# HELP tandem:prefix_cache_hits_total x\n"
      "tandem:prefix_cache_hits_total{instance=\"decode\"} 30\n"
      "tandem:prefix_cache_hits_total{instance=\"prefill\"} 12\n"
      "tandem:prefix_cache_hits_total_other 1000\n"
      "tandem:prefix_cache_queries_total 100\n";
  CHECK(sum_metric(text, "tandem:prefix_cache_hits_total") == 42);
  CHECK(sum_metric(text, "tandem:prefix_cache_queries_total") == 100);
  CHECK(sum_metric(text, "tandem:missing") == 0);
}
