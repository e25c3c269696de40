// tandem/gateway: the gateway's HTTP/1.1 transport (asynchronous, streaming, many connections).
//
// Built on KJ's HTTP library (kj::HttpServer, Cap'n Proto 0.9), which parses requests and
// writes responses. One KJ event loop on one thread serves every connection (no thread per
// connection). It does transport only: it reads a request (headers + the complete body) and
// hands it to a Handler; the Handler answers through a ResponseStream, either as a whole
// response (Content-Length) or as a stream (chunked transfer encoding, e.g. SSE). Keep-alive
// is on. API parsing and rendering live elsewhere (the server never looks at a body).
//
// THE FRAMING GUARD. kj 0.9 checks framing badly (a negative or repeated Content-Length, a
// chunk size that overflows, heads over its 128 KiB buffer and unknown transfer encodings
// become 500s with kj's text or a reset), has no body deadline, answers no 408, and ignores
// `Connection: close` and HTTP/1.0. So every connection's bytes pass, on their way to kj, a
// small checker (RequestFraming, http_framing.hpp: pure, fuzzed against kj's parser) that
// splits them into requests by the same rules as kj (RFC 9112 6.3; kj is handed one request
// at a time, never bytes past its end) and
// answers mistakes itself, on the socket, with `Connection: close`, before kj or the Handler
// see the request; then the connection closes (after at most 1 s of reading and dropping the
// client's further bytes, so that the close does not reset the answer):
//   400 bad Content-Length (not a decimal number, e.g. negative; given more than once),
//       Transfer-Encoding other than exactly `chunked`, both Transfer-Encoding and
//       Content-Length, a chunk size line that is empty, not hex, over 32 bytes, has
//       extensions, or does not fit in 64 bits, chunk data without its CRLF, trailers,
//       obsolete header line folding, a bare CR in the head;
//   413 Content-Length over body_bytes_max, or a chunk size line that would bring the chunked
//       body over it: at once, before the body's bytes are read;
//   431 a request head (request line + headers + line ends) over header_bytes_max;
//   408 a head not complete header_timeout_ms after its first byte (a connection's first
//       request: after the accept), or a body not complete body_timeout_ms after its head; a
//       connection that sent nothing by then is closed without an answer.
// A request with `Connection: close`, or HTTP/1.0 without `Connection: keep-alive`, gets its
// answer (with `Connection: close`) and the connection closes; bytes after it are not served.
// HTTP/1.0 clients still get HTTP/1.1 status lines (and chunked streams) from kj.
//
// Other answers the server gives itself, before the Handler sees the request:
//   400 (501 for an unknown method) a head kj cannot parse (e.g. a header line without ':');
//   400 a body kj fails to read although the guard passed it (should not happen);
//   500 the Handler threw, or dropped its ResponseStream without answering.
// Every one of these bodies is OpenAI-shaped, {"error":{"message":..,"type":..,"param":null,
// "code":..}}, except under /v1/messages* (the path as far as the request line was read),
// where it is Anthropic-shaped, {"type":"error","error":{"type":..,"message":..}}, with types
// invalid_request_error (400/408/431), request_too_large (413), overloaded_error (503),
// api_error (500). No kj text reaches a client (kj's descriptions go to stderr). One
// exception: kj's own 500 for a failure outside the service (not reachable while the guard
// agrees with kj) does not know the path and stays OpenAI-shaped.
//
// CONNECTION BOUNDS AND THE REFUSAL LANE. A connection arriving while connections_max are
// open, or while connections_per_client_max are open from its peer IP (IPv4/IPv6 address
// without the port; all non-IP peers count as one, "unknown"), is not served normally and
// not answered blindly either: it goes to the refusal lane, a second kj::HttpServer with at
// most 64 connections, each guarded as above but with deadlines of min(1 s, the configured
// ones) and one request only. GET or HEAD /health on the lane goes to the Handler like any
// request (so health checks are answered while stalled clients hold every slot); anything
// else gets 503 with `Retry-After: 1` and a body naming the bound; then the connection
// closes. Stalled clients cannot hold the lane: a slot is held at most 1 s for the head, 1 s
// for the body and 1 s of lingering after a refusal (or kj's 1 s upload grace), plus, for
// /health, the Handler's time. While all 64 slots are busy (more than about 64 refused
// connections within 3 s), a refused connection is answered blindly: a fixed 503 with
// Retry-After (OpenAI-shaped: its request is not read) is written at once, then the
// connection lingers at most 1 s reading and dropping input, so the close does not reset it
// before the client read the answer; at most 4,096 at once (4 KiB each). Only past that
// (over ~4,000 refused connections a second) is a connection closed unanswered
// (stats().connections_unanswered). Counted in stats().connections_rejected; each 503 also
// in requests_rejected.
//
// THREADS AND OWNERSHIP
// - HttpServer: constructed, started and stopped by its owner on any thread but its own HTTP
//   thread. The Handler must outlive the server (it is borrowed).
// - Handler::on_request runs on the HTTP thread. It must not block: it stalls every
//   connection. It typically records the request and passes the ResponseStream to an actor.
// - ResponseStream is thread-safe: any thread may call it at any time, also after the
//   connection closed or the server stopped (calls then do nothing and return false). Data
//   crosses into the event loop through a mutex-protected queue plus one cross-thread wakeup
//   per loop turn (batched over all streams). The Handler owns the ResponseStream (shared_ptr);
//   the server keeps only the stream's internal state.
// - on_cancel callbacks run on the HTTP thread (or, if registered after the cancellation
//   happened, right away on the registering thread). They must be short, must not block and
//   must not call stop().
// - A client is gone (on_cancel fires) when a write fails, when its socket reports HUP/ERR,
//   or, while its response has not begun (e.g. queued for admission), when a peek at the
//   socket (MSG_PEEK every 100 ms) finds EOF: a client that half-closes after sending its
//   request is treated as gone, as nginx does for proxied requests.
//
// BOUNDED BUFFERING: bytes accepted by write()/send() but not yet handed to the socket are
// counted per stream. If they would exceed stream_buffer_bytes_max (the client reads
// slower than the gateway writes), the stream is cancelled: the write returns false, the
// connection is closed and on_cancel fires. Memory per stream is therefore at most
// stream_buffer_bytes_max plus the kernel socket buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::gateway {

// Header list as sent or received: (name, value) pairs in order; names may repeat.
using HttpHeaderList = std::vector<std::pair<std::string, std::string>>;

// kj reads a request head into a buffer of at most 128 KiB; header_bytes_max stays below it.
constexpr uint64_t http_header_bytes_limit = 96u << 10;

struct HttpLimits {
  uint64_t body_bytes_max = 8u << 20;           // request body; larger -> 413
  uint32_t connections_max = 4096;              // open connections; more -> the refusal lane
  uint32_t connections_per_client_max = 256;    // open connections per peer IP; more -> lane
  uint64_t header_bytes_max = 64u << 10;        // request head (line + headers); larger -> 431
  uint64_t stream_buffer_bytes_max = 1u << 20;  // unsent response bytes per stream
  uint32_t header_timeout_ms = 15'000;          // a request's head must arrive within this
  uint32_t body_timeout_ms = 60'000;            // its body within this, from the head's end
  uint32_t idle_timeout_ms = 60'000;            // keep-alive: idle time before closing
};

struct HttpRequest {
  std::string method;          // "GET", "POST", "HEAD", ...
  std::string path;            // raw request path without the query, e.g. "/v1/models"
  std::string query;           // raw query without '?', "" when absent
  HttpHeaderList headers;      // as received, in order
  std::string body;            // complete body (<= body_bytes_max); "" when none
  std::string client_address;  // "127.0.0.1:51234" or "[::1]:51234"; "unknown" if unavailable

  // Case-insensitive lookup of the first header with this name; nullopt when absent.
  std::optional<std::string_view> header(std::string_view name) const;
};

// The answer channel of one request. Created by the server, owned by the Handler.
// Call sequence (asserted: violating it is a bug in the caller):
//   send(...)                      once, for a whole response; or
//   start(...), write(...)*, end() for a chunked stream.
// Headers must not include Content-Length, Transfer-Encoding or Connection (the server owns
// framing) and names/values must not contain CR or LF (asserted).
// Each call returns false when the stream is cancelled (client gone, buffer overflow, server
// stopped): the bytes are dropped and the caller should stop producing.
// Dropping the last reference before answering makes the server answer 500; dropping it
// after start() but before end() closes the connection (the client sees a cut stream).
class ResponseStream {
 public:
  struct Core;                                          // shared with the event loop; opaque
  explicit ResponseStream(std::shared_ptr<Core> core);  // server use only
  ~ResponseStream();
  ResponseStream(const ResponseStream&) = delete;
  ResponseStream& operator=(const ResponseStream&) = delete;

  // A header every response of this stream carries, whoever sends it (e.g. CORS). Before
  // send() or start().
  void add_header(std::string name, std::string value);
  bool send(uint32_t status, HttpHeaderList headers, std::string body);
  bool start(uint32_t status, HttpHeaderList headers);
  bool write(std::string bytes);  // one chunk; empty writes are ignored (return !cancelled)
  bool end();

  bool is_cancelled() const;
  // Where the caller is in its call sequence: nothing sent yet (send() or start() allowed),
  // streaming (start() called: write() and end() allowed), or done (send() or end() called).
  enum class Progress { idle, streaming, done };
  Progress progress() const;
  // Registers the callback that fires exactly once if the stream is cancelled before end()
  // or send() was called. Replaces an earlier callback. Not called after a normal finish.
  void on_cancel(std::function<void()> callback);
  // Bytes accepted but not yet handed to the socket (for tests and metrics).
  uint64_t buffered_bytes() const;

 private:
  std::shared_ptr<Core> core_;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Called on the HTTP thread for every request that passed the server's own checks. Must
  // answer through `out` eventually (now or from another thread). An exception thrown here
  // becomes a 500 if nothing was sent yet.
  virtual void on_request(const HttpRequest& request, std::shared_ptr<ResponseStream> out) = 0;
};

// Counters, readable from any thread.
struct HttpServerStats {
  uint64_t connections_open = 0;
  uint64_t connections_total = 0;     // accepted and served
  uint64_t connections_rejected = 0;  // over connections_max or connections_per_client_max
  uint64_t connections_unanswered = 0;  // of those, closed with no answer (every bound full)
  uint64_t requests_total = 0;        // handed to the handler (lane /health included)
  uint64_t requests_rejected = 0;     // answered 400/408/413/431/503 by the server itself
  uint64_t streams_cancelled = 0;     // on_cancel-worthy cancellations
  uint64_t responses_open = 0;        // requests handed to the handler whose response is not done
};

class HttpServer {
 public:
  // host: an address or name ("127.0.0.1", "0.0.0.0", "::"); port 0 picks a free port.
  // Preconditions (asserted): every limit > 0; header_bytes_max <= http_header_bytes_limit.
  // `handler` must outlive the server.
  HttpServer(std::string host, uint16_t port, HttpLimits limits, HttpHandler& handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Starts the HTTP thread and returns once the socket listens.
  // Errors: failed "gateway http: cannot listen on HOST:PORT: <reason>".
  // Precondition (asserted): not started before.
  Status start();

  // The bound port. Precondition (asserted): start() succeeded.
  uint16_t port() const;

  // Stops accepting, closes every connection (open streams are cancelled: their on_cancel
  // fires on the HTTP thread), ends the loop and joins the thread. Idempotent; any thread
  // except the HTTP thread.
  void stop();

  HttpServerStats stats() const;

  struct Shared;  // state shared with the HTTP thread; opaque

 private:
  void run();  // the HTTP thread's body

  std::string host_;
  uint16_t port_requested_;
  HttpLimits limits_;
  HttpHandler& handler_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  bool started_ = false;
};

}  // namespace tandem::gateway
