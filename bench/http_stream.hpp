// A small HTTP/1.1 client for `tandem bench serve` and `tandem bench overhead`: many
// concurrent streaming (SSE) requests to the gateway from ONE thread, with non-blocking
// sockets and epoll. Keep-alive connections are reused between requests.
//
// Not thread-safe: one StreamClient per thread. Times are ms on a steady clock whose
// origin is the client's construction (`now_ms()`).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::bench {

struct HttpEndpoint {
  std::string host = "127.0.0.1";  // an IPv4 address (no name lookup)
  uint16_t port = 8000;
};

// Parses "HOST:PORT" (or ":PORT" / "PORT" for 127.0.0.1). Errors: invalid, naming `what`.
Result<HttpEndpoint> parse_endpoint(const std::string& text, const std::string& what);

// Incremental HTTP/1.1 response parser: status line, headers, then a body framed by
// Content-Length, chunked transfer coding, or connection close. Body bytes are handed out
// as they arrive (take_body()).
class ResponseParser {
 public:
  // Feeds received bytes. Errors: invalid (malformed status line, header or chunk size).
  Status feed(const char* data, size_t size_bytes);
  // The peer closed: completes a close-delimited body; otherwise the response is truncated.
  void on_close() { if (headers_done_ && mode_ == Mode::until_close) complete_ = true; }
  bool headers_done() const { return headers_done_; }
  bool complete() const { return complete_; }
  int status() const { return status_; }
  bool keep_alive() const { return keep_alive_; }
  std::string take_body();  // body bytes received since the last call

 private:
  enum class Mode { length, chunked, until_close };
  Status parse_head();
  Status parse_body();
  std::string in_;
  std::string body_;
  bool headers_done_ = false, complete_ = false, keep_alive_ = true;
  int status_ = 0;
  Mode mode_ = Mode::until_close;
  uint64_t remaining_bytes_ = 0;  // length: body left; chunked: left in this chunk
  bool chunk_trailer_ = false;    // chunked: expecting the CRLF after a chunk's data
};

// One streaming call: POST `path` with a JSON body; the response is SSE (OpenAI style).
struct StreamCall {
  std::string path = "/v1/completions";
  std::string body;
  bool chat = false;  // text is in choices[0].delta.content (chat) or choices[0].text
};

// What a call produced. error_kind "" = succeeded; else http_<status>, stream_error,
// connect, disconnected, bad_response, timeout.
struct StreamOutcome {
  double send_ms = 0;
  std::vector<double> chunk_ms;  // SSE events that carried non-empty text
  double end_ms = 0;
  uint32_t completion_tokens = 0;  // from the usage chunk (0 if none came)
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens
  bool usage_seen = false;
  std::string error_kind, error_detail;
};

class StreamClient {
 public:
  // timeout_ms: a call that has not finished this long after it started fails as timeout.
  // Throws std::runtime_error if epoll cannot be created (startup fault).
  StreamClient(HttpEndpoint target, double timeout_ms);
  ~StreamClient();
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  double now_ms() const;
  // Starts a call identified by `tag` (unique among calls in flight). A connection failure
  // shows up as a finished call with error_kind "connect".
  void start(uint64_t tag, StreamCall call);
  // Waits up to wait_ms for I/O, then returns the calls that finished, with their outcomes.
  std::vector<std::pair<uint64_t, StreamOutcome>> poll(double wait_ms);
  size_t in_flight_count() const { return conns_by_fd_.size() - idle_.size(); }

  struct Conn;  // one TCP connection (defined in the .cpp)

 private:
  int open_connection();
  void finish(Conn& conn, std::string error_kind, std::string detail);
  void on_event(Conn& conn, uint32_t events);
  void on_readable(Conn& conn);
  void on_sse_bytes(Conn& conn, const std::string& bytes);
  void close_conn(int fd);
  void update_interest(Conn& conn);

  HttpEndpoint target_;
  double timeout_ms_;
  int epoll_fd_ = -1;
  double origin_s_ = 0;
  std::map<int, std::unique_ptr<Conn>> conns_by_fd_;
  std::vector<int> idle_;  // keep-alive connections ready for a new call
  std::vector<std::pair<uint64_t, StreamOutcome>> finished_;
};

// Blocking GET of `path` (Connection: close) with a timeout. Returns (status, body).
// Errors: disconnected (cannot connect), timed_out, invalid (bad response).
Result<std::pair<int, std::string>> http_get(const HttpEndpoint& target, const std::string& path,
                                             double timeout_ms);

}  // namespace tandem::bench
