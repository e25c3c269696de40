#include "runtime/obs/admin_http.hpp"

#include "runtime/base/constant_time.hpp"

#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/debug.h>

#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

namespace tandem::obs {

AdminRoute metrics_route(const Registry& registry) {
  const Registry* borrowed = &registry;
  return AdminRoute{"/metrics", [borrowed]() {
                      return AdminResponse{200, std::string(prometheus_content_type),
                                           borrowed->render_prometheus()};
                    }};
}

AdminRoute health_route(std::function<HealthStatus()> check) {
  RT_ASSERT(static_cast<bool>(check), "health_route needs a check function");
  return AdminRoute{"/health", [check = std::move(check)]() {
                      HealthStatus status = check();
                      std::string body = status.detail.empty()
                                             ? std::string(status.healthy ? "ok" : "unhealthy")
                                             : status.detail;
                      return AdminResponse{status.healthy ? 200u : 503u,
                                           "text/plain; charset=utf-8", body + "\n"};
                    }};
}

namespace {

constexpr const char* text_plain = "text/plain; charset=utf-8";

kj::StringPtr status_text(uint32_t status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

// The kj::HttpService: routes GET requests to the owner's handlers.
class RouteService final : public kj::HttpService {
 public:
  RouteService(const std::vector<AdminRoute>& routes, const kj::HttpHeaderTable& table,
               kj::HttpHeaderId allow_id, kj::HttpHeaderId authorization_id,
               const std::string& token)
      : routes_(routes), table_(table), allow_id_(allow_id), authorization_id_(authorization_id),
        token_(token) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& /*body*/,
                            Response& response) override {
    if (!token_.empty()) {
      KJ_IF_MAYBE(given, headers.get(authorization_id_)) {
        std::string_view v(given->cStr());
        if (v.rfind("Bearer ", 0) == 0 && base::equal_constant_time(v.substr(7), token_)) {
          return route(method, url, response);
        }
      }
      return reply(response,
                   AdminResponse{401, text_plain,
                                 "this admin endpoint asks for the admin token: "
                                 "Authorization: Bearer <[admin] token_file's contents>\n"},
                   false);
    }
    return route(method, url, response);
  }

 private:
  kj::Promise<void> route(kj::HttpMethod method, kj::StringPtr url, Response& response) {
    std::string path(url.cStr());
    if (auto query = path.find('?'); query != std::string::npos) path.resize(query);
    const AdminRoute* route = nullptr;
    for (const auto& r : routes_) {
      if (r.path == path) route = &r;
    }
    if (route == nullptr) {
      return reply(response, AdminResponse{404, text_plain, "not found: " + path + "\n"}, false);
    }
    if (method != kj::HttpMethod::GET) {
      std::string body = "method not allowed: " + std::string(kj::str(method).cStr()) + " " + path +
                         " (only GET)\n";
      return reply(response, AdminResponse{405, text_plain, std::move(body)}, true);
    }
    AdminResponse result;
    try {
      result = route->handler();
    } catch (const std::exception& e) {
      result =
          AdminResponse{500, text_plain, "handler for " + path + " failed: " + e.what() + "\n"};
    }
    return reply(response, std::move(result), false);
  }

  kj::Promise<void> reply(Response& response, AdminResponse result, bool allow_get) {
    kj::HttpHeaders headers(table_);
    std::string content_type = result.content_type.empty() ? text_plain : result.content_type;
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, content_type.c_str());
    if (allow_get) headers.set(allow_id_, "GET");
    // The body must outlive the asynchronous write: own it on the heap and attach it.
    auto body = kj::heap<std::string>(std::move(result.body));
    auto stream =
        response.send(result.status, status_text(result.status), headers, uint64_t{body->size()});
    auto written = stream->write(body->data(), body->size());
    return written.attach(kj::mv(stream), kj::mv(body));
  }

  const std::vector<AdminRoute>& routes_;
  const kj::HttpHeaderTable& table_;
  kj::HttpHeaderId allow_id_;
  kj::HttpHeaderId authorization_id_;
  const std::string& token_;
};

}  // namespace

struct AdminHttpServer::Shared {
  std::mutex mutex;
  std::condition_variable ready_cv;
  bool ready = false;                // start() may return
  std::optional<Error> start_error;  // set when binding failed
  uint16_t bound_port = 0;
  bool stop_requested = false;
  // Lives on the HTTP thread's stack; non-null only while the loop can be woken through it.
  const kj::CrossThreadPromiseFulfiller<void>* stop_fulfiller = nullptr;
};

void AdminHttpServer::require_bearer_token(std::string token) {
  RT_ASSERT(!started_, "require_bearer_token after start");
  RT_ASSERT(!token.empty());
  token_ = std::move(token);
}

AdminHttpServer::AdminHttpServer(std::string host, uint16_t port, std::vector<AdminRoute> routes)
    : host_(std::move(host)),
      port_requested_(port),
      routes_(std::move(routes)),
      shared_(std::make_unique<Shared>()) {
  std::set<std::string> paths;
  for (const auto& r : routes_) {
    RT_ASSERT(r.path.starts_with("/"), "admin route path must start with '/':", r.path);
    RT_ASSERT(static_cast<bool>(r.handler), "admin route without a handler:", r.path);
    RT_ASSERT(paths.insert(r.path).second, "duplicate admin route:", r.path);
  }
}

AdminHttpServer::~AdminHttpServer() {
  stop();
}

Status AdminHttpServer::start() {
  RT_ASSERT(!started_, "AdminHttpServer::start() called twice");
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

uint16_t AdminHttpServer::port() const {
  std::lock_guard lock(shared_->mutex);
  RT_ASSERT(shared_->ready && !shared_->start_error, "port() before a successful start()");
  return shared_->bound_port;
}

void AdminHttpServer::stop() {
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

void AdminHttpServer::run() {
  Shared& shared = *shared_;
  std::string where = host_ + ":" + std::to_string(port_requested_);
  auto fail_start = [&shared, &where](const std::string& reason) {
    std::lock_guard lock(shared.mutex);
    if (shared.ready) return false;
    shared.start_error =
        make_error(ErrorKind::failed, "admin http: cannot listen on " + where + ": " + reason);
    shared.ready = true;
    shared.ready_cv.notify_all();
    return true;
  };
  try {
    auto io = kj::setupAsyncIo();
    auto address =
        io.provider->getNetwork().parseAddress(host_.c_str(), port_requested_).wait(io.waitScope);
    kj::Own<kj::ConnectionReceiver> listener = address->listen();
    kj::HttpHeaderTable::Builder table_builder;
    kj::HttpHeaderId allow_id = table_builder.add("Allow");
    kj::HttpHeaderId authorization_id = table_builder.add("Authorization");
    auto table = table_builder.build();
    RouteService service(routes_, *table, allow_id, authorization_id, token_);
    kj::HttpServer server(io.provider->getTimer(), *table, service);
    auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
    // Unpublishes the fulfiller before it is destroyed, on every exit path.
    KJ_DEFER({
      std::lock_guard lock(shared.mutex);
      shared.stop_fulfiller = nullptr;
    });
    {
      std::lock_guard lock(shared.mutex);
      shared.bound_port = static_cast<uint16_t>(listener->getPort());
      shared.stop_fulfiller = stop.fulfiller.get();
      if (shared.stop_requested) stop.fulfiller->fulfill();
      shared.ready = true;
      shared.ready_cv.notify_all();
    }
    server.listenHttp(*listener).exclusiveJoin(kj::mv(stop.promise)).wait(io.waitScope);
  } catch (const kj::Exception& e) {
    if (!fail_start(std::string(e.getDescription().cStr()))) {
      std::fprintf(stderr, "admin http on %s stopped: %s\n", where.c_str(),
                   e.getDescription().cStr());
    }
  } catch (const std::exception& e) {
    if (!fail_start(e.what())) {
      std::fprintf(stderr, "admin http on %s stopped: %s\n", where.c_str(), e.what());
    }
  }
}

}  // namespace tandem::obs
