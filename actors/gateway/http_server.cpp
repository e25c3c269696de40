#include "actors/gateway/http_server.hpp"

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
#include <deque>
#include <exception>
#include <mutex>

namespace tandem::gateway {

namespace {

// Pending rejections (503 + close) in flight at once; beyond this, excess connections are
// closed without an answer.
constexpr uint32_t rejections_in_flight_max = 64;
// Accept failures (e.g. out of file descriptors) retry after this delay.
constexpr auto accept_retry_delay = 100 * kj::MILLISECONDS;
constexpr auto idle_peek_interval = 100 * kj::MILLISECONDS;  // closed_while_idle()

bool ascii_iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] + 32) : a[i];
    char y = b[i] >= 'A' && b[i] <= 'Z' ? static_cast<char>(b[i] + 32) : b[i];
    if (x != y) return false;
  }
  return true;
}

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
  uint64_t bytes = body.size();
  // A whole body is already in memory: it is not held to the streaming bound.
  return core_->push_locked(lock, whole_response(status, std::move(headers), std::move(body)),
                            bytes, false);
}

bool ResponseStream::start(uint32_t status, HttpHeaderList headers) {
  RT_ASSERT(status >= 100 && status <= 599, "bad HTTP status", status);
  check_response_headers(headers);
  std::unique_lock lock(core_->mutex);
  RT_ASSERT(core_->phase == Core::Phase::idle, "start() after the response began");
  core_->phase = Core::Phase::streaming;
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
  std::atomic<uint64_t> requests_total{0};
  std::atomic<uint64_t> requests_rejected{0};
  std::atomic<uint64_t> streams_cancelled{0};
};

// One request's response on the loop: drains its Core into kj's Response. Owned by the
// request promise; destroyed when the response finished or the connection went away.
class Exchange {
 public:
  Exchange(kj::HttpService::Response& response, const kj::HttpHeaderTable& table,
           kj::AsyncIoStream& connection, std::shared_ptr<ResponseStream::Core> core)
      : response_(response), table_(table), connection_(connection), core_(std::move(core)) {
    RT_ASSERT(core_->exchange == nullptr, "stream already has an exchange");
    core_->exchange = this;
  }
  ~Exchange() {
    RT_ASSERT(core_->exchange == this, "exchange link broken");
    core_->exchange = nullptr;
    core_->detach();  // fires on_cancel when the stream did not finish
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

  kj::HttpService::Response& response_;
  const kj::HttpHeaderTable& table_;
  kj::AsyncIoStream& connection_;
  std::shared_ptr<ResponseStream::Core> core_;
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
  return response_.send(op.status, status_text(op.status), headers, length);
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
    return answer(response, error.statusCode,
                  error_body(message, "invalid_request_error", "bad_http"));
  }
  kj::Promise<void> handleApplicationError(
      kj::Exception exception, kj::Maybe<kj::HttpService::Response&> response) override {
    if (exception.getType() == kj::Exception::Type::DISCONNECTED) return kj::READY_NOW;
    KJ_IF_MAYBE (r, response) {
      std::string message = "gateway http: " + std::string(exception.getDescription().cStr());
      return answer(*r, 500, error_body(message, "server_error", "internal"));
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

  const kj::HttpHeaderTable& table_;
};

// Per connection, shared by its service and the task that serves it (loop thread only).
struct ConnectionState {
  bool client_gone = false;  // a response failed because the client disconnected
};

class LoopContext final : private kj::TaskSet::ErrorHandler {
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

 private:
  void admit(kj::Own<kj::AsyncIoStream> connection);
  void reject(kj::Own<kj::AsyncIoStream> connection);
  void taskFailed(kj::Exception&& exception) override;

  kj::ConnectionReceiver& listener_;
  ErrorAnswers error_answers_;
  kj::HttpServer server_;
  uint32_t rejections_in_flight_ = 0;
  std::shared_ptr<ConnectionState> next_state_;  // handed to the service factory
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
kj::Promise<bool> read_body(kj::AsyncInputStream& in, std::string& out, uint64_t bytes_max) {
  constexpr size_t chunk_bytes = 16384;
  size_t before = out.size();
  out.resize(before + chunk_bytes);
  return in.tryRead(out.data() + before, 1, chunk_bytes)
      .then([&in, &out, bytes_max, before](size_t read_bytes) -> kj::Promise<bool> {
        out.resize(before + read_bytes);
        if (read_bytes == 0) return true;
        if (out.size() > bytes_max) return false;
        return read_body(in, out, bytes_max);
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
  uint64_t header_bytes = 0;
  headers.forEach([&request, &header_bytes](kj::StringPtr name, kj::StringPtr value) {
    header_bytes += name.size() + value.size();
    request->headers.emplace_back(name.cStr(), value.cStr());
  });
  const HttpLimits& limits = loop_.limits;
  if (header_bytes > limits.header_bytes_max) {
    return refuse(response, 431,
                  "request headers are " + std::to_string(header_bytes) + " bytes; the limit is " +
                      std::to_string(limits.header_bytes_max),
                  "headers_too_large", request->path);
  }
  std::string too_large =
      "request body exceeds the limit of " + std::to_string(limits.body_bytes_max) + " bytes";
  KJ_IF_MAYBE (length, body.tryGetLength()) {
    if (*length > limits.body_bytes_max) {
      return refuse(response, 413,
                    "request body is " + std::to_string(*length) + " bytes; the limit is " +
                        std::to_string(limits.body_bytes_max) + " bytes",
                    "body_too_large", request->path);
    }
    request->body.reserve(*length);
  }
  return read_body(body, request->body, limits.body_bytes_max)
      .then([this, request, &response, too_large](bool fits) mutable -> kj::Promise<void> {
        if (!fits) {
          return refuse(response, 413, std::move(too_large), "body_too_large", request->path);
        }
        return dispatch(std::move(request), response);
      });
}

kj::Promise<void> ConnectionService::refuse(Response& response, uint32_t status,
                                            std::string message, std::string_view code,
                                            const std::string& path) {
  RT_ASSERT(status == 413 || status == 431, "server-side refusal status", status);
  RT_ASSERT(!message.empty(), "refusal without a message");
  loop_.shared.requests_rejected.fetch_add(1, std::memory_order_relaxed);
  bool anthropic = path.rfind("/v1/messages", 0) == 0;
  auto body = kj::heap<std::string>(
      anthropic ? anthropic_error_body(message, status == 413 ? "request_too_large"
                                                              : "invalid_request_error")
                : error_body(message, "invalid_request_error", code));
  kj::HttpHeaders headers(*loop_.table);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
  auto stream = response.send(status, status_text(status), headers, uint64_t{body->size()});
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
  auto exchange = kj::heap<Exchange>(response, *loop_.table, connection_, core);
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
          [&limits_in, this]() {
            kj::HttpServerSettings settings;
            settings.errorHandler = error_answers_;
            settings.headerTimeout = limits_in.header_timeout_ms * kj::MILLISECONDS;
            settings.pipelineTimeout = limits_in.idle_timeout_ms * kj::MILLISECONDS;
            return settings;
          }()),
      tasks_(*this) {}

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
    reject(kj::mv(connection));
    return;
  }
  try {
    int one = 1;  // streamed tokens go out at once
    connection->setsockopt(IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  } catch (const kj::Exception&) {
    // not a TCP socket (e.g. unix): nothing to tune
  }
  shared.connections_open.fetch_add(1, std::memory_order_relaxed);
  shared.connections_total.fetch_add(1, std::memory_order_relaxed);
  auto state = std::make_shared<ConnectionState>();
  next_state_ = state;
  auto served = server_.listenHttp(kj::mv(connection));
  RT_ASSERT(next_state_ == nullptr, "kj did not create the connection's service at once");
  auto reported = served.catch_([state](kj::Exception&& e) {
    // After a client disconnect kj may fail the connection with follow-up errors: expected.
    if (state->client_gone || e.getType() == kj::Exception::Type::DISCONNECTED) return;
    std::fprintf(stderr, "gateway http: connection failed: %s\n", e.getDescription().cStr());
  });
  tasks_.add(reported.attach(
      kj::defer([this]() { shared.connections_open.fetch_sub(1, std::memory_order_relaxed); })));
}

void LoopContext::reject(kj::Own<kj::AsyncIoStream> connection) {
  shared.connections_rejected.fetch_add(1, std::memory_order_relaxed);
  if (rejections_in_flight_ >= rejections_in_flight_max) return;  // closed unanswered
  ++rejections_in_flight_;
  // A fixed answer written before reading the request; then wait briefly for the client to
  // close so that our close does not reset the connection before it read the answer.
  static const std::string answer = [] {
    std::string body = error_body("too many open connections; retry later", "server_overloaded",
                                  "connections_max");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  }();
  kj::AsyncIoStream& stream = *connection;
  auto scratch = kj::heapArray<kj::byte>(4096);
  kj::byte* buffer = scratch.begin();
  auto answered = stream.write(answer.data(), answer.size()).then([&stream, buffer]() {
    stream.shutdownWrite();
    return stream.tryRead(buffer, 1, 4096).ignoreResult();
  });
  auto bounded = answered.exclusiveJoin(timer.afterDelay(1 * kj::SECONDS));
  tasks_.add(bounded.attach(kj::mv(scratch), kj::mv(connection),
                            kj::defer([this]() { --rejections_in_flight_; })));
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
  RT_ASSERT(limits_.header_timeout_ms > 0 && limits_.idle_timeout_ms > 0, "timeouts must be > 0");
  shared_->hub->dirty_max = 2 * static_cast<size_t>(limits_.connections_max);
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
  out.connections_total = s.connections_total.load(std::memory_order_relaxed);
  out.connections_rejected = s.connections_rejected.load(std::memory_order_relaxed);
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
