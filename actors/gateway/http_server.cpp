#include "actors/gateway/http_server.hpp"

#include "actors/gateway/http_framing.hpp"

#include <arpa/inet.h>
#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/debug.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <deque>
#include <exception>
#include <map>
#include <mutex>

namespace tandem::gateway {

namespace {

// Accept failures (e.g. out of file descriptors) retry after this delay.
constexpr auto accept_retry_delay = 100 * kj::MILLISECONDS;
constexpr auto idle_peek_interval = 100 * kj::MILLISECONDS;  // closed_while_idle()

kj::StringPtr status_text(uint32_t status) {
  switch (status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 421:
      return "Misdirected Request";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return status < 400 ? "OK" : "Error";
  }
}

std::string json_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// The server's own error body (OpenAI shape: message, type, param, code; the API layer
// renders its own errors).
std::string error_body(std::string_view message, std::string_view type, std::string_view code) {
  return "{\"error\":{\"message\":\"" + json_escape(message) + "\",\"type\":\"" +
         std::string(type) + "\",\"param\":null,\"code\":\"" + std::string(code) + "\"}}";
}

// The same error in the Anthropic Messages shape, for refusals on /v1/messages*.
std::string anthropic_error_body(std::string_view message, std::string_view type) {
  return "{\"type\":\"error\",\"error\":{\"type\":\"" + std::string(type) +
         "\",\"message\":\"" + json_escape(message) + "\"}}";
}

HttpHeaderList json_headers() {
  return {{"Content-Type", "application/json"}};
}

void check_response_headers(const HttpHeaderList& headers) {
  for (const auto& [name, value] : headers) {
    RT_ASSERT(!name.empty(), "empty response header name");
    RT_ASSERT(name.find_first_of("\r\n: ") == std::string::npos, "bad header name:", name);
    RT_ASSERT(value.find_first_of("\r\n") == std::string::npos, "CR/LF in header:", name);
    RT_ASSERT(!ascii_iequal(name, "content-length") && !ascii_iequal(name, "transfer-encoding") &&
                  !ascii_iequal(name, "connection"),
              "the server owns framing headers; remove:", name);
  }
}

std::string peer_address(kj::AsyncIoStream& connection) {
  sockaddr_storage addr{};
  kj::uint length = sizeof addr;
  try {
    connection.getpeername(reinterpret_cast<sockaddr*>(&addr), &length);
  } catch (const kj::Exception&) {
    return "unknown";
  }
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "unknown";
}

// The shape of the server's own error answers: OpenAI-style, or Anthropic-style under
// /v1/messages* (the path as far as it is known; "" = unknown, OpenAI shape).
bool anthropic_path(std::string_view path) {
  return path.rfind("/v1/messages", 0) == 0;
}

std::string server_error_body(uint32_t status, std::string_view message, std::string_view code,
                              std::string_view path) {
  RT_ASSERT(status >= 400 && status <= 599, "server errors are errors", status);
  RT_ASSERT(!message.empty(), "an error without a message");
  if (anthropic_path(path)) {
    std::string_view type = status == 413   ? "request_too_large"
                            : status == 503 ? "overloaded_error"
                            : status >= 500 ? "api_error"
                                            : "invalid_request_error";
    return anthropic_error_body(message, type);
  }
  std::string_view type = status == 503   ? "server_overloaded"
                          : status >= 500 ? "server_error"
                                          : "invalid_request_error";
  return error_body(message, type, code);
}

// A complete HTTP/1.1 error answer with Connection: close, for answers the server writes to
// the socket itself (outside kj's response machinery).
std::string raw_error_answer(uint32_t status, std::string_view body, bool retry_after) {
  RT_ASSERT(status >= 400 && status <= 599, "raw answers are errors", status);
  std::string text = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status).cStr() +
                     "\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\nConnection: close\r\n";
  if (retry_after) text += "Retry-After: 1\r\n";
  return text + "\r\n" + std::string(body);
}

}  // namespace

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (ascii_iequal(key, name)) return std::string_view(value);
  }
  return std::nullopt;
}

// ---- the cross-thread wakeup: one per server, batched over all streams ----

class Exchange;

// Streams with new output register here (at most once until the loop takes their output);
// the loop drains the list on one wakeup. Any thread may notify; only the loop waits.
struct WakeHub {
  std::mutex mutex;
  std::vector<std::shared_ptr<ResponseStream::Core>> dirty;
  const kj::CrossThreadPromiseFulfiller<void>* waiter = nullptr;  // loop's, when it sleeps
  bool open = true;
  // Each stream is listed at most once (Core::notified); live streams <= connections_max,
  // plus streams that finished since the last drain (bounded by the same again).
  size_t dirty_max = 0;

  // Returns false when the server is gone.
  bool notify(std::shared_ptr<ResponseStream::Core> core) {
    std::lock_guard lock(mutex);
    if (!open) return false;
    dirty.push_back(std::move(core));
    RT_ASSERT(dirty.size() <= dirty_max, "wake list over its bound", dirty.size());
    if (waiter != nullptr) {
      waiter->fulfill();
      waiter = nullptr;
    }
    return true;
  }
  void close() {
    std::lock_guard lock(mutex);
    open = false;
    waiter = nullptr;
    dirty.clear();
  }
};

// ---- one stream's state, shared by the caller threads and the loop ----

struct StreamOp {
  enum class Kind { start_chunked, start_whole, data, finish };
  Kind kind = Kind::data;
  uint32_t status = 0;
  HttpHeaderList headers;
  std::string bytes;            // data
  uint64_t content_length = 0;  // start_whole
};

// start_whole, data (unless empty), finish.
std::vector<StreamOp> whole_response(uint32_t status, HttpHeaderList headers, std::string body) {
  std::vector<StreamOp> ops;
  uint64_t length = body.size();
  ops.push_back(StreamOp{StreamOp::Kind::start_whole, status, std::move(headers), {}, length});
  if (length > 0) ops.push_back(StreamOp{StreamOp::Kind::data, 0, {}, std::move(body), 0});
  ops.push_back(StreamOp{StreamOp::Kind::finish, 0, {}, {}, 0});
  return ops;
}

struct ResponseStream::Core : std::enable_shared_from_this<ResponseStream::Core> {
  enum class Phase { idle, streaming, done };  // the caller's call sequence

  Core(std::shared_ptr<WakeHub> hub_in, uint64_t buffer_max, std::atomic<uint64_t>& cancels)
      : hub(std::move(hub_in)), buffer_bytes_max(buffer_max), cancelled_count(cancels) {}

  // Caller side. Returns false when cancelled. Call with `mutex` held.
  bool push_locked(std::unique_lock<std::mutex>& lock, std::vector<StreamOp> new_ops,
                   uint64_t bytes, bool bounded);
  // Loop side: takes the queued output. `cancel` = abort the connection.
  struct Batch {
    std::vector<StreamOp> ops;
    bool cancel = false;
  };
  Batch take();
  void release(uint64_t bytes);
  // Loop side: the exchange is gone (finished, client gone, server stopping).
  void detach();
  void fire_cancel();

  const std::shared_ptr<WakeHub> hub;
  const uint64_t buffer_bytes_max;
  bool anthropic_errors = false;  // the request's path is /v1/messages*: Anthropic error shape
  HttpHeaderList extra_headers;   // add_header(): on the response, whoever sends it (mutex)
  std::atomic<uint64_t>& cancelled_count;  // the server's counter; outlives attached cores

  mutable std::mutex mutex;
  Phase phase = Phase::idle;
  std::deque<StreamOp> ops;
  uint64_t buffered_bytes = 0;
  bool cancelled = false;      // no more output accepted; the loop aborts the connection
  bool cancel_wanted = false;  // the cancellation happened before end(): on_cancel is due
  bool cancel_fired = false;
  bool attached = true;   // the loop-side exchange exists
  bool notified = false;  // in the hub's dirty list (cleared by the loop's dispatcher)
  std::function<void()> cancel_callback;

  Exchange* exchange = nullptr;  // loop thread only
};

bool ResponseStream::Core::push_locked(std::unique_lock<std::mutex>& lock,
                                       std::vector<StreamOp> new_ops, uint64_t bytes,
                                       bool bounded) {
  RT_ASSERT(lock.owns_lock(), "push_locked without the lock");
  if (cancelled || !attached) return false;
  if (bounded && buffered_bytes + bytes > buffer_bytes_max) {
    cancelled = true;  // the client reads too slowly: drop the stream
    cancel_wanted = true;
    ops.clear();
  } else {
    for (auto& op : new_ops) ops.push_back(std::move(op));
    buffered_bytes += bytes;
  }
  if (!notified) {
    notified = true;
    if (!hub->notify(shared_from_this())) attached = false;
  }
  return !cancelled;
}

ResponseStream::Core::Batch ResponseStream::Core::take() {
  std::lock_guard lock(mutex);
  RT_ASSERT(exchange != nullptr, "take() without an exchange");
  Batch batch;
  batch.cancel = cancelled;
  if (!cancelled) {
    batch.ops.assign(std::make_move_iterator(ops.begin()), std::make_move_iterator(ops.end()));
  }
  ops.clear();
  return batch;
}

void ResponseStream::Core::release(uint64_t bytes) {
  std::lock_guard lock(mutex);
  RT_ASSERT(buffered_bytes >= bytes, "released more than buffered", bytes, buffered_bytes);
  buffered_bytes -= bytes;
}

void ResponseStream::Core::detach() {
  {
    std::lock_guard lock(mutex);
    RT_ASSERT(exchange == nullptr, "detach() while an exchange is linked");
    attached = false;
    ops.clear();
    buffered_bytes = 0;
    if (phase != Phase::done) {
      cancelled = true;
      cancel_wanted = true;
    }
  }
  fire_cancel();
}

void ResponseStream::Core::fire_cancel() {
  std::function<void()> callback;
  {
    std::lock_guard lock(mutex);
    if (!cancel_wanted || cancel_fired || !cancel_callback) return;
    cancel_fired = true;
    callback = std::move(cancel_callback);
    cancel_callback = nullptr;
  }
  cancelled_count.fetch_add(1, std::memory_order_relaxed);
  try {
    callback();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gateway http: on_cancel callback threw: %s\n", e.what());
  }
}

// ---- ResponseStream: the caller-facing half ----

ResponseStream::ResponseStream(std::shared_ptr<Core> core) : core_(std::move(core)) {
  RT_ASSERT(core_ != nullptr, "ResponseStream without a core");
}

ResponseStream::~ResponseStream() {
  std::unique_lock lock(core_->mutex);
  core_->cancel_callback = nullptr;  // the owner is gone: nobody to tell
  if (core_->phase == Core::Phase::idle) {
    core_->phase = Core::Phase::done;
    const char* dropped = "the request handler dropped the response without answering";
    std::string body = core_->anthropic_errors ? anthropic_error_body(dropped, "api_error")
                                               : error_body(dropped, "server_error", "no_response");
    uint64_t bytes = body.size();
    (void)core_->push_locked(lock, whole_response(500, json_headers(), std::move(body)), bytes,
                             false);
  } else if (core_->phase == Core::Phase::streaming) {
    core_->phase = Core::Phase::done;
    core_->cancelled = true;  // cut the stream; the loop closes the connection
    core_->ops.clear();
    if (core_->attached && !core_->notified) {
      core_->notified = true;
      if (!core_->hub->notify(core_)) core_->attached = false;
    }
  }
}

bool ResponseStream::send(uint32_t status, HttpHeaderList headers, std::string body) {
  RT_ASSERT(status >= 100 && status <= 599, "bad HTTP status", status);
  check_response_headers(headers);
  std::unique_lock lock(core_->mutex);
  RT_ASSERT(core_->phase == Core::Phase::idle, "send() after the response began");
  core_->phase = Core::Phase::done;
  headers.insert(headers.end(), core_->extra_headers.begin(), core_->extra_headers.end());
  uint64_t bytes = body.size();
  // A whole body is already in memory: it is not held to the streaming bound.
  return core_->push_locked(lock, whole_response(status, std::move(headers), std::move(body)),
                            bytes, false);
}

void ResponseStream::add_header(std::string name, std::string value) {
  HttpHeaderList one = {{std::move(name), std::move(value)}};
  check_response_headers(one);
  std::lock_guard lock(core_->mutex);
  RT_ASSERT(core_->phase == Core::Phase::idle, "add_header() after the response began");
  core_->extra_headers.push_back(std::move(one.front()));
}

bool ResponseStream::start(uint32_t status, HttpHeaderList headers) {
  RT_ASSERT(status >= 100 && status <= 599, "bad HTTP status", status);
  check_response_headers(headers);
  std::unique_lock lock(core_->mutex);
  RT_ASSERT(core_->phase == Core::Phase::idle, "start() after the response began");
  core_->phase = Core::Phase::streaming;
  headers.insert(headers.end(), core_->extra_headers.begin(), core_->extra_headers.end());
  std::vector<StreamOp> ops(1);
  ops[0] = StreamOp{StreamOp::Kind::start_chunked, status, std::move(headers), {}, 0};
  return core_->push_locked(lock, std::move(ops), 0, true);
}

bool ResponseStream::write(std::string bytes) {
  std::unique_lock lock(core_->mutex);
  RT_ASSERT(core_->phase == Core::Phase::streaming, "write() outside start()..end()");
  if (bytes.empty()) return !core_->cancelled && core_->attached;
  uint64_t size = bytes.size();
  std::vector<StreamOp> ops(1);
  ops[0].bytes = std::move(bytes);
  return core_->push_locked(lock, std::move(ops), size, true);
}

bool ResponseStream::end() {
  std::unique_lock lock(core_->mutex);
  RT_ASSERT(core_->phase == Core::Phase::streaming, "end() without start()");
  core_->phase = Core::Phase::done;
  std::vector<StreamOp> ops(1);
  ops[0].kind = StreamOp::Kind::finish;
  bool ok = core_->push_locked(lock, std::move(ops), 0, false);
  if (ok) core_->cancel_callback = nullptr;  // finished normally: release its captures
  return ok;
}

ResponseStream::Progress ResponseStream::progress() const {
  std::lock_guard lock(core_->mutex);
  switch (core_->phase) {
    case Core::Phase::idle: return Progress::idle;
    case Core::Phase::streaming: return Progress::streaming;
    case Core::Phase::done: return Progress::done;
  }
  RT_ASSERT(false, "unknown phase");
  return Progress::done;
}

bool ResponseStream::is_cancelled() const {
  std::lock_guard lock(core_->mutex);
  return core_->cancelled;  // a finished stream is detached but not cancelled
}

void ResponseStream::on_cancel(std::function<void()> callback) {
  RT_ASSERT(static_cast<bool>(callback), "on_cancel needs a callback");
  {
    std::lock_guard lock(core_->mutex);
    if (core_->cancel_fired) return;
    core_->cancel_callback = std::move(callback);
  }
  core_->fire_cancel();  // fires now if the cancellation already happened
}

uint64_t ResponseStream::buffered_bytes() const {
  std::lock_guard lock(core_->mutex);
  return core_->buffered_bytes;
}

// ---- loop side ----

struct HttpServer::Shared {
  std::mutex mutex;
  std::condition_variable ready_cv;
  bool ready = false;
  std::optional<Error> start_error;
  uint16_t bound_port = 0;
  bool stop_requested = false;
  const kj::CrossThreadPromiseFulfiller<void>* stop_fulfiller = nullptr;  // HTTP thread's

  std::shared_ptr<WakeHub> hub = std::make_shared<WakeHub>();
  std::atomic<uint64_t> connections_open{0};
  std::atomic<uint64_t> connections_total{0};
  std::atomic<uint64_t> connections_rejected{0};
  std::atomic<uint64_t> connections_unanswered{0};
  std::atomic<uint64_t> requests_total{0};
  std::atomic<uint64_t> requests_rejected{0};
  std::atomic<uint64_t> streams_cancelled{0};
  std::atomic<uint64_t> responses_open{0};  // Exchanges alive
};

// One request's response on the loop: drains its Core into kj's Response. Owned by the
// request promise; destroyed when the response finished or the connection went away.
class Exchange {
 public:
  // `close_after`: the connection closes after this response; `close_hint`: the loop's flag
  // that tells kj so while the headers are sent.
  Exchange(kj::HttpService::Response& response, const kj::HttpHeaderTable& table,
           kj::AsyncIoStream& connection, std::shared_ptr<ResponseStream::Core> core,
           bool close_after, bool& close_hint, std::atomic<uint64_t>& open_count)
      : open_count_(open_count),
        response_(response),
        table_(table),
        connection_(connection),
        core_(std::move(core)),
        close_after_(close_after),
        close_hint_(close_hint) {
    RT_ASSERT(core_->exchange == nullptr, "stream already has an exchange");
    core_->exchange = this;
    open_count_.fetch_add(1, std::memory_order_relaxed);
  }
  ~Exchange() {
    RT_ASSERT(core_->exchange == this, "exchange link broken");
    core_->exchange = nullptr;
    core_->detach();  // fires on_cancel when the stream did not finish
    RT_ASSERT(open_count_.load(std::memory_order_relaxed) > 0, "responses_open underflow");
    open_count_.fetch_sub(1, std::memory_order_relaxed);
  }
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  kj::Promise<void> pump();
  void wake() {
    KJ_IF_MAYBE (fulfiller, waiting_) {
      (*fulfiller)->fulfill();
      waiting_ = nullptr;
    }
  }

 private:
  kj::Promise<void> apply(std::shared_ptr<std::vector<StreamOp>> ops, size_t index);
  kj::Own<kj::AsyncOutputStream> begin(const StreamOp& op);

  std::atomic<uint64_t>& open_count_;  // HttpServer::Shared::responses_open
  kj::HttpService::Response& response_;
  const kj::HttpHeaderTable& table_;
  kj::AsyncIoStream& connection_;
  std::shared_ptr<ResponseStream::Core> core_;
  const bool close_after_;
  bool& close_hint_;
  kj::Own<kj::AsyncOutputStream> body_;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiting_;
  bool finished_ = false;
};

kj::Promise<void> Exchange::pump() {
  auto batch = core_->take();
  if (batch.cancel) {
    // Cut the connection first: dropping a started chunked body would otherwise write the
    // terminating chunk and make a cut stream look complete to the client.
    if (body_.get() != nullptr) connection_.shutdownWrite();
    return KJ_EXCEPTION(DISCONNECTED, "gateway http: response stream cancelled");
  }
  if (batch.ops.empty()) {
    auto paf = kj::newPromiseAndFulfiller<void>();
    waiting_ = kj::mv(paf.fulfiller);
    return paf.promise.then([this]() { return pump(); });
  }
  auto ops = std::make_shared<std::vector<StreamOp>>(std::move(batch.ops));
  return apply(std::move(ops), 0).then([this]() -> kj::Promise<void> {
    if (finished_) return kj::READY_NOW;
    return pump();
  });
}

kj::Own<kj::AsyncOutputStream> Exchange::begin(const StreamOp& op) {
  RT_ASSERT(body_.get() == nullptr, "response begun twice");
  kj::HttpHeaders headers(table_);
  for (const auto& [name, value] : op.headers) {
    headers.add(kj::StringPtr(name.c_str()), kj::StringPtr(value.c_str()));
  }
  kj::Maybe<uint64_t> length = nullptr;
  if (op.kind == StreamOp::Kind::start_whole) length = op.content_length;
  close_hint_ = close_after_;
  auto body = response_.send(op.status, status_text(op.status), headers, length);
  close_hint_ = false;
  return body;
}

kj::Promise<void> Exchange::apply(std::shared_ptr<std::vector<StreamOp>> ops, size_t index) {
  RT_ASSERT(!finished_, "output after the finish");
  while (index < ops->size()) {
    StreamOp& op = (*ops)[index];
    if (op.kind == StreamOp::Kind::finish) {
      RT_ASSERT(body_.get() != nullptr, "finish without a start");
      body_ = nullptr;  // completes the body (terminating chunk for chunked)
      finished_ = true;
      return kj::READY_NOW;
    }
    if (op.kind != StreamOp::Kind::data) {
      body_ = begin(op);
      ++index;
      continue;
    }
    // Gather the consecutive data chunks into one vectored write.
    size_t end = index;
    uint64_t bytes = 0;
    while (end < ops->size() && (*ops)[end].kind == StreamOp::Kind::data) {
      bytes += (*ops)[end].bytes.size();
      ++end;
    }
    RT_ASSERT(body_.get() != nullptr, "data before the start");
    auto pieces = kj::heapArray<kj::ArrayPtr<const kj::byte>>(end - index);
    for (size_t i = index; i < end; ++i) {
      const std::string& chunk = (*ops)[i].bytes;
      pieces[i - index] =
          kj::arrayPtr(reinterpret_cast<const kj::byte*>(chunk.data()), chunk.size());
    }
    auto written = body_->write(pieces);
    return written.attach(kj::mv(pieces)).then([this, ops, end, bytes]() mutable {
      core_->release(bytes);
      return apply(std::move(ops), end);
    });
  }
  return kj::READY_NOW;
}

// ---- the event loop's world: listener, kj::HttpServer, connections, wakeups ----

// How kj's HttpServer answers protocol and application errors: JSON bodies like the rest of
// the server's own answers, and a plain close when the client is gone or a response already
// began (kj then passes no Response).
class ErrorAnswers final : public kj::HttpServerErrorHandler {
 public:
  explicit ErrorAnswers(const kj::HttpHeaderTable& table) : table_(table) {}

  kj::Promise<void> handleClientProtocolError(kj::HttpHeaders::ProtocolError error,
                                              kj::HttpService::Response& response) override {
    std::string message = "malformed HTTP request: " + std::string(error.description.cStr());
    uint32_t status = error.statusCode >= 400 && error.statusCode <= 599 ? error.statusCode : 400;
    return answer(response, status,
                  server_error_body(status, message, "bad_http", raw_path(error.rawContent)));
  }
  // Reached only for failures outside the service (the framing checks run before kj reads a
  // body, and the service answers its own failures), so the path is unknown: OpenAI shape.
  // kj's description goes to the log, not to the client.
  kj::Promise<void> handleApplicationError(
      kj::Exception exception, kj::Maybe<kj::HttpService::Response&> response) override {
    if (exception.getType() == kj::Exception::Type::DISCONNECTED) return kj::READY_NOW;
    std::fprintf(stderr, "gateway http: request failed: %s\n", exception.getDescription().cStr());
    KJ_IF_MAYBE (r, response) {
      return answer(*r, 500,
                    error_body("the HTTP server failed to process the request", "server_error",
                               "internal"));
    }
    return kj::READY_NOW;
  }
  kj::Promise<void> handleNoResponse(kj::HttpService::Response& response) override {
    return answer(response, 500,
                  error_body("no response was produced", "server_error", "no_response"));
  }

 private:
  kj::Promise<void> answer(kj::HttpService::Response& response, uint32_t status, std::string text) {
    RT_ASSERT(status >= 400, "error answers are errors", status);
    auto body = kj::heap<std::string>(std::move(text));
    kj::HttpHeaders headers(table_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
    auto stream = response.send(status, status_text(status), headers, uint64_t{body->size()});
    auto written = stream->write(body->data(), body->size());
    return written.attach(kj::mv(stream), kj::mv(body));
  }

  // The request target's path from kj's raw head ("" if there is none): "METHOD SP target".
  static std::string raw_path(kj::ArrayPtr<char> raw) {
    std::string_view head(raw.begin(), raw.size());
    head = head.substr(0, head.find_first_of("\r\n"));
    size_t method_end = head.find_first_of(" \t");
    if (method_end == std::string_view::npos) return "";
    std::string_view target = trim_ows(head.substr(method_end));
    return std::string(target.substr(0, target.find_first_of(std::string_view(" \t?\0", 4))));
  }

  const kj::HttpHeaderTable& table_;
};

namespace {

// ---- the connection as kj sees it: every byte kj reads passes the framing checks ----

// Answers written by GuardedStream are followed by a close; before it, the client's further
// bytes are read and dropped for at most this long (and this many), so that our close does not
// reset the connection before the client read the answer.
constexpr auto refusal_linger = 1 * kj::SECONDS;
constexpr uint64_t refusal_drain_bytes_max = 8u << 20;

kj::Promise<void> drain_input(kj::AsyncIoStream& stream, kj::byte* scratch, size_t scratch_bytes,
                              uint64_t bytes_left) {
  return stream.tryRead(scratch, 1, scratch_bytes)
      .then([&stream, scratch, scratch_bytes, bytes_left](size_t n) -> kj::Promise<void> {
        if (n == 0 || n >= bytes_left) return kj::READY_NOW;
        return drain_input(stream, scratch, scratch_bytes, bytes_left - n);
      });
}

// Writes `answer`, half-closes, lingers (reading and dropping input), then resolves.
kj::Promise<void> answer_and_linger(kj::Timer& timer, kj::AsyncIoStream& stream,
                                    std::string answer, size_t scratch_bytes = 16384) {
  auto text = kj::heap<std::string>(std::move(answer));
  auto scratch = kj::heapArray<kj::byte>(scratch_bytes);
  kj::byte* buffer = scratch.begin();
  size_t buffer_bytes = scratch.size();
  auto written = stream.write(text->data(), text->size());
  auto lingered = written.then([&stream, buffer, buffer_bytes]() {
    stream.shutdownWrite();
    return drain_input(stream, buffer, buffer_bytes, refusal_drain_bytes_max);
  });
  return lingered.exclusiveJoin(timer.afterDelay(refusal_linger))
      .attach(kj::mv(text), kj::mv(scratch));
}

// The socket as kj::HttpServer reads it. Hands kj the client's bytes one request at a time
// (never past the end of a request, so the checks and kj agree on where each request
// begins) and enforces what kj does not: the framing checks of RequestFraming, the header and
// body deadlines, and the close after a request that asked for it. A refused request is
// answered here, on the socket (kj is only reading then: it reads a request only after the
// previous response finished), and kj's read then fails as DISCONNECTED, which closes the
// connection quietly.
class GuardedStream final : public kj::AsyncIoStream {
 public:
  struct Settings {
    uint64_t head_bytes_max = 0;
    uint64_t body_bytes_max = 0;
    kj::Duration header_timeout = 0 * kj::MILLISECONDS;
    kj::Duration body_timeout = 0 * kj::MILLISECONDS;
    uint32_t header_timeout_ms = 0;  // for messages
    uint32_t body_timeout_ms = 0;
    bool one_request = false;  // close after the first request (the refusal lane)
  };

  GuardedStream(kj::Own<kj::AsyncIoStream> inner, kj::Timer& timer, const Settings& settings,
                std::atomic<uint64_t>& refused_count)
      : inner_(kj::mv(inner)),
        timer_(timer),
        settings_(settings),
        refused_count_(refused_count),
        framing_(settings.head_bytes_max, settings.body_bytes_max),
        phase_started_(timer.now()) {
    RT_ASSERT(settings_.header_timeout > 0 * kj::MILLISECONDS, "header timeout must be > 0");
    RT_ASSERT(settings_.body_timeout > 0 * kj::MILLISECONDS, "body timeout must be > 0");
  }

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    auto* out = static_cast<kj::byte*>(buffer);
    return read_some(out, max_bytes)
        .then([this, out, min_bytes, max_bytes](size_t n) -> kj::Promise<size_t> {
          if (n == 0 || n >= min_bytes) return n;
          return tryRead(out + n, min_bytes - n, max_bytes - n).then([n](size_t more) {
            return n + more;
          });
        });
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override {
    inner_->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, kj::uint* length) override {
    inner_->getpeername(addr, length);
  }
  kj::Maybe<int> getFd() const override { return inner_->getFd(); }

  // The request kj is reading (or just read) wants the connection closed after its answer.
  bool closing() const { return settings_.one_request || framing_.close_wanted(); }
  // kj reads EOF from now on (after a refusal: the connection closes after the answer).
  void stop_reading() {
    ended_ = true;
    pending_.clear();
  }

 private:
  kj::Promise<size_t> read_some(kj::byte* out, size_t max_bytes);
  size_t take(kj::byte* out, size_t size);
  kj::Promise<size_t> refuse(uint32_t status, const std::string& message, const char* code);
  kj::Promise<size_t> expired();

  kj::Own<kj::AsyncIoStream> inner_;
  kj::Timer& timer_;
  const Settings settings_;
  std::atomic<uint64_t>& refused_count_;
  RequestFraming framing_;
  std::string pending_;  // read from the socket, not yet handed to kj (the next request)
  bool ended_ = false;   // no more input for kj: it reads EOF
  bool first_request_ = true;
  kj::TimePoint phase_started_;  // when the head (body) of the current request began
};

kj::Promise<size_t> GuardedStream::read_some(kj::byte* out, size_t max_bytes) {
  if (ended_ || max_bytes == 0) return size_t(0);
  if (!pending_.empty()) {
    size_t n = std::min(max_bytes, pending_.size());
    std::memcpy(out, pending_.data(), n);
    pending_.erase(0, n);
    size_t given = take(out, n);
    if (framing_.failed()) return refuse(framing_.verdict().status, framing_.verdict().message,
                                         framing_.verdict().code.c_str());
    return given;
  }
  kj::Maybe<kj::TimePoint> deadline = nullptr;
  switch (framing_.phase()) {
    case RequestFraming::Phase::idle:  // between requests kj's pipelineTimeout applies
      if (first_request_) deadline = phase_started_ + settings_.header_timeout;
      break;
    case RequestFraming::Phase::head: deadline = phase_started_ + settings_.header_timeout; break;
    case RequestFraming::Phase::body:
      if (!framing_.awaiting_final_crlf()) deadline = phase_started_ + settings_.body_timeout;
      break;
  }
  // Race the read against the deadline to a plain outcome first: the loser is cancelled only
  // when the winner's whole chain is ready, so the answers are written after the race.
  kj::Promise<kj::Maybe<size_t>> raced =
      inner_->tryRead(out, 1, max_bytes).then([](size_t n) -> kj::Maybe<size_t> { return n; });
  KJ_IF_MAYBE (at, deadline) {
    raced = raced.exclusiveJoin(
        timer_.atTime(*at).then([]() -> kj::Maybe<size_t> { return nullptr; }));
  }
  return raced.then([this, out](kj::Maybe<size_t> got) -> kj::Promise<size_t> {
    size_t n = 0;
    KJ_IF_MAYBE (read_bytes, got) {
      n = *read_bytes;
    } else {
      return expired();
    }
    if (n == 0) return size_t(0);
    size_t given = take(out, n);
    if (framing_.failed()) {
      return refuse(framing_.verdict().status, framing_.verdict().message,
                    framing_.verdict().code.c_str());
    }
    return given;
  });
}

// Runs the checks over out[0, size): returns how much kj gets now; the rest waits in pending_.
size_t GuardedStream::take(kj::byte* out, size_t size) {
  auto before = framing_.phase();
  size_t consumed = framing_.feed(reinterpret_cast<const char*>(out), size);
  if (framing_.failed()) return 0;
  RT_ASSERT(consumed > 0 && consumed <= size, "framing consumed", consumed, size);
  auto after = framing_.phase();
  // The first request's header deadline runs from the accept (as kj's own does), later ones
  // from their first byte; a body's from the end of its head.
  bool first_head = first_request_ && before == RequestFraming::Phase::idle &&
                    after == RequestFraming::Phase::head;
  if ((after != before || framing_.request_ended()) && !first_head) phase_started_ = timer_.now();
  if (framing_.request_ended()) {
    first_request_ = false;
    if (closing()) {
      ended_ = true;  // kj reads EOF after this request: it answers it, then closes
      pending_.clear();
    }
  }
  if (consumed < size && !ended_) {
    pending_.insert(0, reinterpret_cast<const char*>(out) + consumed, size - consumed);
  }
  return consumed;
}

kj::Promise<size_t> GuardedStream::refuse(uint32_t status, const std::string& message,
                                          const char* code) {
  ended_ = true;
  pending_.clear();
  refused_count_.fetch_add(1, std::memory_order_relaxed);
  std::string body = server_error_body(status, message, code, framing_.path());
  return answer_and_linger(timer_, *inner_, raw_error_answer(status, body, false))
      .then([]() -> kj::Promise<size_t> {
        return KJ_EXCEPTION(DISCONNECTED, "gateway http: request refused by the server");
      });
}

kj::Promise<size_t> GuardedStream::expired() {
  switch (framing_.phase()) {
    case RequestFraming::Phase::idle:
      ended_ = true;  // nothing of a request arrived: close without an answer
      return size_t(0);
    case RequestFraming::Phase::head:
      return refuse(408,
                    "the request headers did not arrive within " +
                        std::to_string(settings_.header_timeout_ms) + " ms (header_timeout_ms)",
                    "header_timeout");
    case RequestFraming::Phase::body:
      break;
  }
  return refuse(408,
                "the request body did not arrive within " +
                    std::to_string(settings_.body_timeout_ms) + " ms (body_timeout_ms)",
                "body_timeout");
}

}  // namespace

// Per connection, shared by its service and the task that serves it (loop thread only).
struct ConnectionState {
  bool client_gone = false;  // a response failed because the client disconnected
  GuardedStream* guard = nullptr;  // the connection kj reads; outlives the service
  bool lane = false;  // the refusal lane: only GET/HEAD /health is served, the rest gets 503
  std::string refusal;  // lane: why (the 503's message)
  std::string refusal_code;
};

// Connections refused (over connections_max or connections_per_client_max) are served by the
// refusal lane, at most this many at once (more are closed unanswered): each gets one request,
// read within lane_timeout_ms (or the header/body timeouts if shorter); GET/HEAD /health goes
// to the handler, anything else gets 503 + Retry-After. Then the connection closes.
constexpr uint32_t lane_connections_max = 64;
constexpr uint32_t lane_timeout_ms = 1000;
// While the lane is full, a refused connection is answered blindly: a fixed 503 with
// Retry-After is written at once, without reading the request, then the connection lingers
// (input read and dropped, at most refusal_linger) so the close does not reset it before the
// client read the answer. At most this many at once (4 KiB of scratch each); past that the
// connection is closed unanswered and counted (stats().connections_unanswered).
constexpr uint32_t blind_refusals_max = 4096;
constexpr size_t blind_scratch_bytes = 4096;
const char* const lane_paths[] = {"/health"};  // served on the lane

class LoopContext final : private kj::TaskSet::ErrorHandler, private kj::HttpServerCallbacks {
 public:
  LoopContext(kj::AsyncIoContext& io, kj::ConnectionReceiver& listener, const HttpLimits& limits,
              HttpHandler& handler, HttpServer::Shared& shared);

  kj::Promise<void> accept_loop();
  kj::Promise<void> dispatch_loop();
  std::shared_ptr<ConnectionState> take_connection_state();

  const HttpLimits& limits;
  HttpHandler& handler;
  HttpServer::Shared& shared;
  kj::Timer& timer;
  kj::Own<kj::HttpHeaderTable> table;
  // True while a response's headers are sent for a request after which the connection
  // closes: kj then adds `Connection: close` (shouldClose()).
  bool close_hint = false;

 private:
  void admit(kj::Own<kj::AsyncIoStream> connection);
  // Serves the connection on the refusal lane; `message`/`code`: its 503.
  // The lane is full: answers a fixed 503 without reading the request (see blind_refusals_max).
  void refuse_blindly(kj::Own<kj::AsyncIoStream> connection, const std::string& message);
  void refuse_connection(kj::Own<kj::AsyncIoStream> connection, std::string message,
                         std::string code);
  GuardedStream::Settings guard_settings(bool lane) const;
  kj::HttpServerSettings server_settings(bool lane);
  void taskFailed(kj::Exception&& exception) override;
  bool shouldClose() override { return close_hint; }

  kj::ConnectionReceiver& listener_;
  ErrorAnswers error_answers_;
  std::map<std::string, uint32_t> per_client_;  // open connections by peer IP (<= connections_max)
  uint32_t lane_open_ = 0;
  uint32_t blind_open_ = 0;  // blind refusals lingering (<= blind_refusals_max)
  std::shared_ptr<ConnectionState> next_state_;  // handed to the service factory
  kj::HttpServer server_;
  kj::HttpServer lane_server_;
  kj::TaskSet tasks_;  // last: its connections go first, while the rest still exists
};

// One connection's kj::HttpService: server-side checks, body reading, handing to the handler.
class ConnectionService final : public kj::HttpService {
 public:
  ConnectionService(LoopContext& loop, kj::AsyncIoStream& connection,
                    std::shared_ptr<ConnectionState> state)
      : loop_(loop),
        connection_(connection),
        state_(std::move(state)),
        client_address_(peer_address(connection)) {
    RT_ASSERT(state_ != nullptr, "connection without its state");
  }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override;

 private:
  kj::Promise<void> dispatch(std::shared_ptr<HttpRequest> request, Response& response);
  // `path`: the request's path; /v1/messages* gets the Anthropic error shape.
  kj::Promise<void> refuse(Response& response, uint32_t status, std::string message,
                           std::string_view code, const std::string& path);

  LoopContext& loop_;
  kj::AsyncIoStream& connection_;
  std::shared_ptr<ConnectionState> state_;
  std::string client_address_;
};

namespace {

// Reads the body into `out`; resolves false as soon as it exceeds `bytes_max`.
// Reads the body into `out`. With a known length (`expected`, reserved by the caller) it stops
// at that length: a read past it to see the end would grow the string to twice its size
// (each held body would cost 2x body_bytes_max; overload_memory measured it).
kj::Promise<bool> read_body(kj::AsyncInputStream& in, std::string& out, uint64_t bytes_max,
                            std::optional<uint64_t> expected) {
  constexpr size_t chunk_bytes = 16384;
  size_t before = out.size();
  if (expected && before >= *expected) return true;
  size_t chunk = expected ? std::min<uint64_t>(chunk_bytes, *expected - before) : chunk_bytes;
  out.resize(before + chunk);
  return in.tryRead(out.data() + before, 1, chunk)
      .then([&in, &out, bytes_max, before, expected](size_t read_bytes) -> kj::Promise<bool> {
        out.resize(before + read_bytes);
        if (read_bytes == 0) return true;
        if (out.size() > bytes_max) return false;
        return read_body(in, out, bytes_max, expected);
      });
}

}  // namespace

kj::Promise<void> ConnectionService::request(kj::HttpMethod method, kj::StringPtr url,
                                             const kj::HttpHeaders& headers,
                                             kj::AsyncInputStream& body, Response& response) {
  auto request = std::make_shared<HttpRequest>();
  request->method = kj::str(method).cStr();
  std::string_view target(url.cStr(), url.size());
  size_t query_at = target.find('?');
  request->path = std::string(target.substr(0, query_at));
  if (query_at != std::string_view::npos) request->query = std::string(target.substr(query_at + 1));
  request->client_address = client_address_;
  headers.forEach([&request](kj::StringPtr name, kj::StringPtr value) {
    request->headers.emplace_back(name.cStr(), value.cStr());
  });
  // The head's size and the body's framing and size were checked by the GuardedStream.
  if (state_->lane) {
    bool served = (method == kj::HttpMethod::GET || method == kj::HttpMethod::HEAD) &&
                  std::find(std::begin(lane_paths), std::end(lane_paths), request->path) !=
                      std::end(lane_paths);
    if (!served) {
      return refuse(response, 503, state_->refusal, state_->refusal_code, request->path);
    }
  }
  const HttpLimits& limits = loop_.limits;
  std::optional<uint64_t> expected;
  KJ_IF_MAYBE (length, body.tryGetLength()) {
    RT_ASSERT(*length <= limits.body_bytes_max, "the framing checks passed a long body", *length);
    request->body.reserve(*length);
    expected = *length;
  }
  return read_body(body, request->body, limits.body_bytes_max, expected)
      .then(
          [this, request, &response](bool fits) mutable -> kj::Promise<void> {
            RT_ASSERT(fits, "the framing checks passed a body over the limit");
            return dispatch(std::move(request), response);
          },
          [this, request, &response](kj::Exception&& e) -> kj::Promise<void> {
            if (e.getType() == kj::Exception::Type::DISCONNECTED) return kj::mv(e);
            std::fprintf(stderr, "gateway http: reading a request body failed: %s\n",
                         e.getDescription().cStr());
            return refuse(response, 400, "the request body is malformed", "bad_body",
                          request->path);
          });
}

kj::Promise<void> ConnectionService::refuse(Response& response, uint32_t status,
                                            std::string message, std::string_view code,
                                            const std::string& path) {
  RT_ASSERT(status == 400 || status == 503, "server-side refusal status", status);
  RT_ASSERT(!message.empty(), "refusal without a message");
  loop_.shared.requests_rejected.fetch_add(1, std::memory_order_relaxed);
  auto body = kj::heap<std::string>(server_error_body(status, message, code, path));
  kj::HttpHeaders headers(*loop_.table);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
  if (status == 503) headers.add("Retry-After", "1");
  // A refusal ends the connection: a lane connection closes after its one request anyway
  // (kj may still read the rest of a short body, so the close does not reset the answer); a
  // malformed body is not read further.
  if (status != 503) state_->guard->stop_reading();
  loop_.close_hint = true;
  auto stream = response.send(status, status_text(status), headers, uint64_t{body->size()});
  loop_.close_hint = false;
  auto written = stream->write(body->data(), body->size());
  return written.attach(kj::mv(stream), kj::mv(body));
}

// Resolves when the client closed its socket (FIN) while its response has not begun, e.g.
// while the request waits in the gateway's admission queue. Such a close causes no POLLHUP
// and no write error, so the socket is peeked (MSG_PEEK, never consuming) every
// idle_peek_interval until the response begins; then it never resolves. Bytes of a pipelined
// next request keep it pending too (EOF behind them is not visible).
kj::Promise<void> closed_while_idle(kj::Timer& timer, kj::AsyncIoStream& connection,
                                    std::shared_ptr<ResponseStream::Core> core) {
  int fd = -1;
  KJ_IF_MAYBE (got, connection.getFd()) {
    fd = *got;
  } else {
    return kj::NEVER_DONE;
  }
  RT_ASSERT(fd >= 0, fd);
  return timer.afterDelay(idle_peek_interval)
      .then([&timer, &connection, fd, core = std::move(core)]() mutable -> kj::Promise<void> {
        {
          std::lock_guard lock(core->mutex);
          if (core->phase != ResponseStream::Core::Phase::idle) return kj::NEVER_DONE;
        }
        char byte = 0;
        ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          return kj::READY_NOW;  // EOF or a reset: nobody will read the response
        }
        return closed_while_idle(timer, connection, std::move(core));
      });
}

kj::Promise<void> ConnectionService::dispatch(std::shared_ptr<HttpRequest> request,
                                              Response& response) {
  RT_ASSERT(request->body.size() <= loop_.limits.body_bytes_max, "body over the limit");
  loop_.shared.requests_total.fetch_add(1, std::memory_order_relaxed);
  auto core = std::make_shared<ResponseStream::Core>(
      loop_.shared.hub, loop_.limits.stream_buffer_bytes_max, loop_.shared.streams_cancelled);
  core->anthropic_errors = request->path.rfind("/v1/messages", 0) == 0;
  auto exchange =
      kj::heap<Exchange>(response, *loop_.table, connection_, core, state_->guard->closing(),
                         loop_.close_hint, loop_.shared.responses_open);
  auto stream = std::make_shared<ResponseStream>(core);
  try {
    loop_.handler.on_request(*request, stream);
  } catch (const std::exception& e) {
    bool idle = false;
    {
      std::lock_guard lock(core->mutex);
      idle = core->phase == ResponseStream::Core::Phase::idle;
    }
    std::string message = "request handler failed: " + std::string(e.what());
    if (idle) {
      stream->send(500, json_headers(), core->anthropic_errors
                                            ? anthropic_error_body(message, "api_error")
                                            : error_body(message, "server_error", "internal"));
    }
  }
  stream.reset();  // the handler holds the only reference now (or none: then a 500 is queued)
  auto disconnected = connection_.whenWriteDisconnected()
                          .exclusiveJoin(closed_while_idle(loop_.timer, connection_, core))
                          .then([]() -> kj::Promise<void> {
                            return KJ_EXCEPTION(DISCONNECTED, "gateway http: client disconnected");
                          });
  auto pumped = exchange->pump().exclusiveJoin(kj::mv(disconnected));
  // Remember a disconnect: kj may report follow-up failures on this connection.
  auto noted = pumped.catch_([state = state_](kj::Exception&& e) -> kj::Promise<void> {
    if (e.getType() == kj::Exception::Type::DISCONNECTED) state->client_gone = true;
    return kj::mv(e);
  });
  return noted.attach(kj::mv(exchange));
}

LoopContext::LoopContext(kj::AsyncIoContext& io, kj::ConnectionReceiver& listener,
                         const HttpLimits& limits_in, HttpHandler& handler_in,
                         HttpServer::Shared& shared_in)
    : limits(limits_in),
      handler(handler_in),
      shared(shared_in),
      timer(io.provider->getTimer()),
      table(kj::HttpHeaderTable::Builder().build()),
      listener_(listener),
      error_answers_(*table),
      server_(
          timer, *table,
          [this](kj::AsyncIoStream& connection) -> kj::Own<kj::HttpService> {
            return kj::heap<ConnectionService>(*this, connection, take_connection_state());
          },
          server_settings(false)),
      lane_server_(
          timer, *table,
          [this](kj::AsyncIoStream& connection) -> kj::Own<kj::HttpService> {
            return kj::heap<ConnectionService>(*this, connection, take_connection_state());
          },
          server_settings(true)),
      tasks_(*this) {}

// kj's own header timeout is a backstop only: the GuardedStream's deadlines fire first (and
// answer 408). kj's pipelineTimeout is the keep-alive idle time.
kj::HttpServerSettings LoopContext::server_settings(bool lane) {
  GuardedStream::Settings guard = guard_settings(lane);
  kj::HttpServerSettings settings;
  settings.errorHandler = error_answers_;
  settings.callbacks = *this;
  settings.headerTimeout = 2 * guard.header_timeout + 2 * refusal_linger;
  settings.pipelineTimeout = limits.idle_timeout_ms * kj::MILLISECONDS;
  return settings;
}

GuardedStream::Settings LoopContext::guard_settings(bool lane) const {
  GuardedStream::Settings settings;
  settings.head_bytes_max = limits.header_bytes_max;
  settings.body_bytes_max = limits.body_bytes_max;
  settings.header_timeout_ms =
      lane ? std::min(limits.header_timeout_ms, lane_timeout_ms) : limits.header_timeout_ms;
  settings.body_timeout_ms =
      lane ? std::min(limits.body_timeout_ms, lane_timeout_ms) : limits.body_timeout_ms;
  settings.header_timeout = settings.header_timeout_ms * kj::MILLISECONDS;
  settings.body_timeout = settings.body_timeout_ms * kj::MILLISECONDS;
  settings.one_request = lane;
  return settings;
}

kj::Promise<void> LoopContext::accept_loop() {
  return listener_.accept().then(
      [this](kj::Own<kj::AsyncIoStream> connection) {
        admit(kj::mv(connection));
        return accept_loop();
      },
      [this](kj::Exception&& e) {
        std::fprintf(stderr, "gateway http: accept failed (retrying): %s\n",
                     e.getDescription().cStr());
        return timer.afterDelay(accept_retry_delay).then([this]() { return accept_loop(); });
      });
}

void LoopContext::admit(kj::Own<kj::AsyncIoStream> connection) {
  uint64_t open = shared.connections_open.load(std::memory_order_relaxed);
  RT_ASSERT(open <= limits.connections_max, "open connections over the limit", open);
  if (open == limits.connections_max) {
    refuse_connection(kj::mv(connection), "too many open connections; retry later",
                      "connections_max");
    return;
  }
  std::string address = peer_address(*connection);
  std::string ip = address.substr(0, address.rfind(':'));  // "unknown" stays "unknown"
  uint32_t& from_client = per_client_[ip];
  if (from_client >= limits.connections_per_client_max) {
    refuse_connection(kj::mv(connection),
                      "too many open connections from " + ip + " (connections_per_client_max " +
                          std::to_string(limits.connections_per_client_max) + "); retry later",
                      "connections_per_client_max");
    return;
  }
  ++from_client;
  RT_ASSERT(per_client_.size() <= limits.connections_max, "per-client map over its bound");
  try {
    int one = 1;  // streamed tokens go out at once
    connection->setsockopt(IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  } catch (const kj::Exception&) {
    // not a TCP socket (e.g. unix): nothing to tune
  }
  shared.connections_open.fetch_add(1, std::memory_order_relaxed);
  shared.connections_total.fetch_add(1, std::memory_order_relaxed);
  auto state = std::make_shared<ConnectionState>();
  auto guarded = kj::heap<GuardedStream>(kj::mv(connection), timer, guard_settings(false),
                                         shared.requests_rejected);
  state->guard = guarded.get();
  next_state_ = state;
  auto served = server_.listenHttp(kj::mv(guarded));
  RT_ASSERT(next_state_ == nullptr, "kj did not create the connection's service at once");
  auto reported = served.catch_([state](kj::Exception&& e) {
    // After a client disconnect kj may fail the connection with follow-up errors: expected.
    if (state->client_gone || e.getType() == kj::Exception::Type::DISCONNECTED) return;
    std::fprintf(stderr, "gateway http: connection failed: %s\n", e.getDescription().cStr());
  });
  tasks_.add(reported.attach(kj::defer([this, ip = std::move(ip)]() {
    shared.connections_open.fetch_sub(1, std::memory_order_relaxed);
    auto it = per_client_.find(ip);
    RT_ASSERT(it != per_client_.end() && it->second > 0, "per-client count lost", ip);
    if (--it->second == 0) per_client_.erase(it);
  })));
}

void LoopContext::refuse_connection(kj::Own<kj::AsyncIoStream> connection, std::string message,
                                    std::string code) {
  shared.connections_rejected.fetch_add(1, std::memory_order_relaxed);
  if (lane_open_ >= lane_connections_max) {
    refuse_blindly(kj::mv(connection), message);
    return;
  }
  ++lane_open_;
  auto state = std::make_shared<ConnectionState>();
  state->lane = true;
  state->refusal = std::move(message);
  state->refusal_code = std::move(code);
  auto guarded = kj::heap<GuardedStream>(kj::mv(connection), timer, guard_settings(true),
                                         shared.requests_rejected);
  state->guard = guarded.get();
  next_state_ = state;
  auto served = lane_server_.listenHttp(kj::mv(guarded));
  RT_ASSERT(next_state_ == nullptr, "kj did not create the lane service at once");
  auto quiet = served.catch_([](kj::Exception&&) {});  // refused clients come and go
  tasks_.add(quiet.attach(kj::defer([this]() {
    RT_ASSERT(lane_open_ > 0, "lane count lost");
    --lane_open_;
  })));
}

void LoopContext::refuse_blindly(kj::Own<kj::AsyncIoStream> connection,
                                 const std::string& message) {
  if (blind_open_ >= blind_refusals_max) {
    shared.connections_unanswered.fetch_add(1, std::memory_order_relaxed);
    return;  // closed unanswered: the one bound past which a client gets no answer
  }
  ++blind_open_;
  shared.requests_rejected.fetch_add(1, std::memory_order_relaxed);
  // The request is not read, so its path (and API shape) is unknown: OpenAI-shaped.
  std::string answer =
      raw_error_answer(503, server_error_body(503, message, "connections_max", ""), true);
  kj::AsyncIoStream& stream = *connection;
  auto answered = answer_and_linger(timer, stream, std::move(answer), blind_scratch_bytes);
  auto quiet = answered.catch_([](kj::Exception&&) {});  // refused clients come and go
  tasks_.add(quiet.attach(kj::mv(connection), kj::defer([this]() {
    RT_ASSERT(blind_open_ > 0, "blind refusal count lost");
    --blind_open_;
  })));
}

std::shared_ptr<ConnectionState> LoopContext::take_connection_state() {
  RT_ASSERT(next_state_ != nullptr, "service factory called outside admit()");
  return std::move(next_state_);
}

void LoopContext::taskFailed(kj::Exception&& exception) {
  if (exception.getType() == kj::Exception::Type::DISCONNECTED) return;  // clients come and go
  std::fprintf(stderr, "gateway http: task failed: %s\n", exception.getDescription().cStr());
}

// Sleeps until a stream has output, then wakes each dirty stream's exchange.
kj::Promise<void> LoopContext::dispatch_loop() {
  WakeHub& hub = *shared.hub;
  std::vector<std::shared_ptr<ResponseStream::Core>> dirty;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  {
    std::lock_guard lock(hub.mutex);
    if (hub.dirty.empty()) {
      hub.waiter = paf.fulfiller.get();
    } else {
      dirty.swap(hub.dirty);
    }
  }
  if (!dirty.empty()) {
    for (auto& core : dirty) {
      // Cleared only here, so a stream is listed at most once; anything pushed before the
      // clear is taken by the wake below (or by the exchange's next pump).
      {
        std::lock_guard lock(core->mutex);
        core->notified = false;
      }
      if (core->exchange != nullptr) core->exchange->wake();
    }
    return kj::evalLater([this]() { return dispatch_loop(); });
  }
  // Unpublishes the fulfiller before it is destroyed, however the wait ends.
  auto unpublish = kj::defer([&hub, fulfiller = paf.fulfiller.get()]() {
    std::lock_guard lock(hub.mutex);
    if (hub.waiter == fulfiller) hub.waiter = nullptr;
  });
  return paf.promise.attach(kj::mv(paf.fulfiller), kj::mv(unpublish)).then([this]() {
    return dispatch_loop();
  });
}

// ---- HttpServer ----

HttpServer::HttpServer(std::string host, uint16_t port, HttpLimits limits, HttpHandler& handler)
    : host_(std::move(host)),
      port_requested_(port),
      limits_(limits),
      handler_(handler),
      shared_(std::make_shared<Shared>()) {
  RT_ASSERT(limits_.body_bytes_max > 0, "body_bytes_max must be > 0");
  RT_ASSERT(limits_.connections_max > 0, "connections_max must be > 0");
  RT_ASSERT(limits_.header_bytes_max > 0, "header_bytes_max must be > 0");
  RT_ASSERT(limits_.stream_buffer_bytes_max > 0, "stream_buffer_bytes_max must be > 0");
  RT_ASSERT(limits_.header_bytes_max <= http_header_bytes_limit,
            "header_bytes_max over kj's buffer", limits_.header_bytes_max);
  RT_ASSERT(limits_.header_timeout_ms > 0, "header_timeout_ms must be > 0");
  RT_ASSERT(limits_.body_timeout_ms > 0, "body_timeout_ms must be > 0");
  RT_ASSERT(limits_.idle_timeout_ms > 0, "idle_timeout_ms must be > 0");
  RT_ASSERT(limits_.connections_per_client_max > 0, "connections_per_client_max must be > 0");
  // Each stream is in the wake list at most once, plus finished ones (see WakeHub).
  shared_->hub->dirty_max =
      2 * (static_cast<size_t>(limits_.connections_max) + lane_connections_max);
}

HttpServer::~HttpServer() {
  stop();
}

Status HttpServer::start() {
  RT_ASSERT(!started_, "HttpServer::start() called twice");
  started_ = true;
  thread_ = std::thread([this]() { run(); });
  std::unique_lock lock(shared_->mutex);
  shared_->ready_cv.wait(lock, [this]() { return shared_->ready; });
  if (shared_->start_error) {
    Error error = *shared_->start_error;
    lock.unlock();
    thread_.join();
    return error;
  }
  RT_ASSERT(shared_->bound_port != 0, "listening socket without a port");
  return {};
}

uint16_t HttpServer::port() const {
  std::lock_guard lock(shared_->mutex);
  RT_ASSERT(shared_->ready && !shared_->start_error, "port() before a successful start()");
  return shared_->bound_port;
}

void HttpServer::stop() {
  {
    std::lock_guard lock(shared_->mutex);
    shared_->stop_requested = true;
    if (shared_->stop_fulfiller != nullptr) shared_->stop_fulfiller->fulfill();
  }
  if (thread_.joinable()) {
    RT_ASSERT(thread_.get_id() != std::this_thread::get_id(), "stop() from the HTTP thread");
    thread_.join();
  }
}

HttpServerStats HttpServer::stats() const {
  const Shared& s = *shared_;
  HttpServerStats out;
  out.connections_open = s.connections_open.load(std::memory_order_relaxed);
  out.responses_open = s.responses_open.load(std::memory_order_relaxed);
  out.connections_total = s.connections_total.load(std::memory_order_relaxed);
  out.connections_rejected = s.connections_rejected.load(std::memory_order_relaxed);
  out.connections_unanswered = s.connections_unanswered.load(std::memory_order_relaxed);
  out.requests_total = s.requests_total.load(std::memory_order_relaxed);
  out.requests_rejected = s.requests_rejected.load(std::memory_order_relaxed);
  out.streams_cancelled = s.streams_cancelled.load(std::memory_order_relaxed);
  return out;
}

namespace {

// Publishes the start outcome once; returns false if it was already published.
bool publish_start(HttpServer::Shared& shared, std::optional<Error> error, uint16_t port);

}  // namespace

void HttpServer::run() {
  Shared& shared = *shared_;
  std::string where = host_ + ":" + std::to_string(port_requested_);
  auto fail = [&shared, &where](const char* reason) {
    std::string message = "gateway http: cannot listen on " + where + ": " + reason;
    if (!publish_start(shared, make_error(ErrorKind::failed, message), 0)) {
      std::fprintf(stderr, "gateway http on %s stopped: %s\n", where.c_str(), reason);
    }
  };
  try {
    auto io = kj::setupAsyncIo();
    auto address =
        io.provider->getNetwork().parseAddress(host_.c_str(), port_requested_).wait(io.waitScope);
    kj::Own<kj::ConnectionReceiver> listener = address->listen();
    auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
    KJ_DEFER({
      std::lock_guard lock(shared.mutex);
      shared.stop_fulfiller = nullptr;
    });
    {
      LoopContext loop(io, *listener, limits_, handler_, shared);
      {
        std::lock_guard lock(shared.mutex);
        shared.stop_fulfiller = stop.fulfiller.get();
        if (shared.stop_requested) stop.fulfiller->fulfill();
      }
      RT_ASSERT(publish_start(shared, std::nullopt, static_cast<uint16_t>(listener->getPort())),
                "start published twice");
      auto served = loop.accept_loop().exclusiveJoin(loop.dispatch_loop());
      served.exclusiveJoin(kj::mv(stop.promise)).wait(io.waitScope);
      // From here on, writers see a closed hub; then `loop` closes every connection (and
      // fires on_cancel for unfinished streams) as it goes out of scope.
      shared.hub->close();
    }
  } catch (const kj::Exception& e) {
    shared.hub->close();
    fail(e.getDescription().cStr());
  } catch (const std::exception& e) {
    shared.hub->close();
    fail(e.what());
  }
}

namespace {

bool publish_start(HttpServer::Shared& shared, std::optional<Error> error, uint16_t port) {
  std::lock_guard lock(shared.mutex);
  if (shared.ready) return false;
  RT_ASSERT(error.has_value() || port != 0, "a started server has a port");
  shared.start_error = std::move(error);
  shared.bound_port = port;
  shared.ready = true;
  shared.ready_cv.notify_all();
  return true;
}

}  // namespace

}  // namespace tandem::gateway
