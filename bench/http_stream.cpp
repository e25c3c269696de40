#include "bench/http_stream.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "runtime/base/assert.hpp"

namespace tandem::bench {
namespace {

double steady_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A non-blocking socket connecting to target; -1 on immediate failure.
int connect_nonblocking(const HttpEndpoint& target) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(target.port);
  if (inet_pton(AF_INET, target.host.c_str(), &addr.sin_addr) != 1 ||
      (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
       errno != EINPROGRESS)) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

Result<HttpEndpoint> parse_endpoint(const std::string& text, const std::string& what) {
  HttpEndpoint out;
  std::string port = text;
  if (auto colon = text.rfind(':'); colon != std::string::npos) {
    if (colon > 0) out.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  in_addr probe{};
  char* end = nullptr;
  long value = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || value <= 0 || value > 65535 ||
      inet_pton(AF_INET, out.host.c_str(), &probe) != 1) {
    return make_error(ErrorKind::invalid,
                      what + ": '" + text + "' is not HOST:PORT with an IPv4 host");
  }
  out.port = static_cast<uint16_t>(value);
  return out;
}

// ---------------- ResponseParser ----------------

Status ResponseParser::feed(const char* data, size_t size_bytes) {
  in_.append(data, size_bytes);
  if (!headers_done_) {
    if (Status s = parse_head(); !s.ok()) return s;
    if (!headers_done_) return {};
  }
  return parse_body();
}

Status ResponseParser::parse_head() {
  size_t end = in_.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (in_.size() > 65536) return make_error(ErrorKind::invalid, "response head over 64 KiB");
    return {};
  }
  std::string head = in_.substr(0, end);
  in_.erase(0, end + 4);
  if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) {
    return make_error(ErrorKind::invalid, "bad status line: " + head.substr(0, 40));
  }
  status_ = std::atoi(head.c_str() + 9);
  if (head.compare(0, 8, "HTTP/1.0") == 0) keep_alive_ = false;
  size_t pos = head.find("\r\n");
  bool have_length = false;
  while (pos != std::string::npos) {
    size_t next = head.find("\r\n", pos + 2);
    std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos
                                                                       : next - pos - 2);
    pos = next;
    size_t colon = line.find(':');
    if (colon == std::string::npos) return make_error(ErrorKind::invalid, "bad header: " + line);
    std::string name = lower(line.substr(0, colon));
    std::string value = lower(line.substr(line.find_first_not_of(' ', colon + 1)));
    if (name == "content-length") {
      have_length = true;
      remaining_bytes_ = std::strtoull(value.c_str(), nullptr, 10);
    } else if (name == "transfer-encoding" && value.find("chunked") != std::string::npos) {
      mode_ = Mode::chunked;
    } else if (name == "connection" && value.find("close") != std::string::npos) {
      keep_alive_ = false;
    }
  }
  if (mode_ != Mode::chunked) mode_ = have_length ? Mode::length : Mode::until_close;
  if (mode_ == Mode::until_close) keep_alive_ = false;
  headers_done_ = true;
  if (mode_ == Mode::length && remaining_bytes_ == 0) complete_ = true;
  return {};
}

Status ResponseParser::parse_body() {
  if (mode_ == Mode::until_close || mode_ == Mode::length) {
    size_t take = mode_ == Mode::length ? std::min<uint64_t>(remaining_bytes_, in_.size())
                                        : in_.size();
    body_.append(in_, 0, take);
    in_.erase(0, take);
    if (mode_ == Mode::length) {
      remaining_bytes_ -= take;
      complete_ = remaining_bytes_ == 0;
    }
    return {};
  }
  while (!complete_) {
    if (chunk_trailer_) {
      if (in_.size() < 2) return {};
      if (in_.compare(0, 2, "\r\n") != 0) return make_error(ErrorKind::invalid, "chunk not CRLF");
      in_.erase(0, 2);
      chunk_trailer_ = false;
    }
    if (remaining_bytes_ == 0) {
      size_t eol = in_.find("\r\n");
      if (eol == std::string::npos) return {};
      char* end = nullptr;
      uint64_t size = std::strtoull(in_.c_str(), &end, 16);
      if (end == in_.c_str()) return make_error(ErrorKind::invalid, "bad chunk size");
      in_.erase(0, eol + 2);
      if (size == 0) {
        complete_ = true;  // trailers (none expected) and the final CRLF are ignored
        return {};
      }
      remaining_bytes_ = size;
    }
    size_t take = std::min<uint64_t>(remaining_bytes_, in_.size());
    if (take == 0) return {};
    body_.append(in_, 0, take);
    in_.erase(0, take);
    remaining_bytes_ -= take;
    if (remaining_bytes_ == 0) chunk_trailer_ = true;
  }
  return {};
}

std::string ResponseParser::take_body() {
  std::string out;
  out.swap(body_);
  return out;
}

// ---------------- StreamClient ----------------

struct StreamClient::Conn {
  int fd = -1;
  bool connecting = true;
  bool busy = false;
  uint64_t tag = 0;
  bool chat = false;
  double deadline_ms = 0;
  std::string out;
  size_t out_offset_bytes = 0;
  ResponseParser parser;
  std::string sse;       // SSE bytes not yet split into events
  std::string error_body;
  StreamOutcome outcome;
  bool done_seen = false;
  bool reused = false;  // served an earlier call (the server may have closed it meanwhile)
  StreamCall call;
  uint32_t interest = 0;
};

StreamClient::StreamClient(HttpEndpoint target, double timeout_ms)
    : target_(std::move(target)), timeout_ms_(timeout_ms), origin_s_(steady_s()) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw std::runtime_error("epoll_create1 failed");
}

StreamClient::~StreamClient() {
  for (auto& [fd, conn] : conns_by_fd_) close(fd);
  close(epoll_fd_);
}

double StreamClient::now_ms() const { return (steady_s() - origin_s_) * 1000.0; }

int StreamClient::open_connection() {
  int fd = connect_nonblocking(target_);
  if (fd < 0) return -1;
  auto conn = std::make_unique<Conn>();
  conn->fd = fd;
  conn->interest = EPOLLIN | EPOLLOUT;
  epoll_event ev{};
  ev.events = conn->interest;
  ev.data.fd = fd;
  RT_ASSERT(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll add", errno);
  conns_by_fd_[fd] = std::move(conn);
  return fd;
}

void StreamClient::start(uint64_t tag, StreamCall call) {
  int fd = -1;
  bool reused = !idle_.empty();
  if (reused) {
    fd = idle_.back();
    idle_.pop_back();
  } else {
    fd = open_connection();
  }
  if (fd < 0) {
    StreamOutcome failed;
    failed.send_ms = failed.end_ms = now_ms();
    failed.error_kind = "connect";
    failed.error_detail = std::strerror(errno);
    finished_.emplace_back(tag, std::move(failed));
    return;
  }
  Conn& conn = *conns_by_fd_.at(fd);
  RT_ASSERT(!conn.busy, "an idle connection is not busy");
  conn.busy = true;
  conn.reused = reused;
  conn.tag = tag;
  conn.chat = call.chat;
  conn.parser = ResponseParser();
  conn.sse.clear();
  conn.error_body.clear();
  conn.done_seen = false;
  conn.outcome = StreamOutcome();
  conn.outcome.send_ms = now_ms();
  conn.deadline_ms = conn.outcome.send_ms + timeout_ms_;
  conn.out = "POST " + call.path + " HTTP/1.1\r\nHost: " + target_.host +
             "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
             "Content-Length: " + std::to_string(call.body.size()) + "\r\n\r\n" + call.body;
  conn.out_offset_bytes = 0;
  conn.call = std::move(call);
  update_interest(conn);
}

void StreamClient::update_interest(Conn& conn) {
  uint32_t want = EPOLLIN;
  if (conn.connecting || conn.out_offset_bytes < conn.out.size()) want |= EPOLLOUT;
  if (want == conn.interest) return;
  conn.interest = want;
  epoll_event ev{};
  ev.events = want;
  ev.data.fd = conn.fd;
  RT_ASSERT(epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, conn.fd, &ev) == 0, "epoll mod", errno);
}

void StreamClient::close_conn(int fd) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  idle_.erase(std::remove(idle_.begin(), idle_.end(), fd), idle_.end());
  conns_by_fd_.erase(fd);
}

void StreamClient::finish(Conn& conn, std::string error_kind, std::string detail) {
  RT_ASSERT(conn.busy, "finish() on an idle connection");
  if (error_kind == "disconnected" && conn.reused && !conn.parser.headers_done()) {
    // A kept-alive connection the server had closed: retry once on a fresh one.
    uint64_t tag = conn.tag;
    StreamCall call = std::move(conn.call);
    close_conn(conn.fd);
    return start(tag, std::move(call));
  }
  conn.busy = false;
  conn.outcome.end_ms = now_ms();
  conn.outcome.error_kind = std::move(error_kind);
  conn.outcome.error_detail = std::move(detail);
  finished_.emplace_back(conn.tag, std::move(conn.outcome));
  bool reuse = finished_.back().second.error_kind.empty() && conn.parser.keep_alive() &&
               conn.parser.complete();
  if (reuse) {
    idle_.push_back(conn.fd);
    update_interest(conn);
  } else {
    close_conn(conn.fd);  // conn is destroyed here
  }
}

void StreamClient::on_sse_bytes(Conn& conn, const std::string& bytes) {
  conn.sse += bytes;
  size_t end;
  while ((end = conn.sse.find("\n\n")) != std::string::npos) {
    std::string event = conn.sse.substr(0, end);
    conn.sse.erase(0, end + 2);
    if (event.rfind("data:", 0) != 0) continue;  // comments, event: lines
    std::string data = event.substr(event[5] == ' ' ? 6 : 5);
    if (data == "[DONE]") {
      conn.done_seen = true;
      continue;
    }
    auto j = nlohmann::json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.contains("error")) {
      conn.error_body = data.substr(0, 300);
      continue;
    }
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      conn.outcome.usage_seen = true;
      conn.outcome.completion_tokens = u->value("completion_tokens", 0u);
      conn.outcome.prompt_tokens = u->value("prompt_tokens", 0u);
      if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
        conn.outcome.cached_tokens = d->value("cached_tokens", 0u);
      }
    }
    auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array() || choices->empty()) continue;
    const auto& c = (*choices)[0];
    const nlohmann::json* text = nullptr;
    if (conn.chat) {
      if (auto d = c.find("delta"); d != c.end() && d->contains("content")) text = &(*d)["content"];
    } else if (auto t = c.find("text"); t != c.end()) {
      text = &*t;
    }
    if (text != nullptr && text->is_string() && !text->get_ref<const std::string&>().empty()) {
      conn.outcome.chunk_ms.push_back(now_ms());
    }
  }
}

void StreamClient::on_readable(Conn& conn) {
  char buf[65536];
  while (true) {
    ssize_t n = recv(conn.fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      if (!conn.busy) return close_conn(conn.fd);
      conn.parser.on_close();
      if (conn.parser.complete()) break;
      return finish(conn, "disconnected", n < 0 ? std::strerror(errno) : "peer closed");
    }
    if (!conn.busy) return close_conn(conn.fd);  // unsolicited bytes on an idle connection
    if (Status s = conn.parser.feed(buf, static_cast<size_t>(n)); !s.ok()) {
      return finish(conn, "bad_response", s.error().message);
    }
    std::string body = conn.parser.take_body();
    if (conn.parser.status() == 200) {
      on_sse_bytes(conn, body);
    } else if (conn.error_body.size() < 300) {
      conn.error_body += body;
    }
    if (conn.parser.complete()) break;
  }
  if (!conn.busy || !conn.parser.complete()) return;
  int status = conn.parser.status();
  if (status != 200) return finish(conn, "http_" + std::to_string(status), conn.error_body);
  if (!conn.error_body.empty()) return finish(conn, "stream_error", conn.error_body);
  if (!conn.done_seen) return finish(conn, "bad_response", "stream ended without [DONE]");
  finish(conn, "", "");
}

void StreamClient::on_event(Conn& conn, uint32_t events) {
  if (conn.connecting && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(conn.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return finish(conn, "connect", std::strerror(err));
    conn.connecting = false;
  }
  if (!conn.connecting && conn.busy && conn.out_offset_bytes < conn.out.size()) {
    ssize_t n = send(conn.fd, conn.out.data() + conn.out_offset_bytes,
                     conn.out.size() - conn.out_offset_bytes, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN) return finish(conn, "disconnected", std::strerror(errno));
    if (n > 0) conn.out_offset_bytes += static_cast<size_t>(n);
  }
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    int fd = conn.fd;
    on_readable(conn);
    if (conns_by_fd_.count(fd) == 0) return;  // closed
  }
  update_interest(conn);
}

std::vector<std::pair<uint64_t, StreamOutcome>> StreamClient::poll(double wait_ms) {
  epoll_event events[256];
  // The wait is to the microsecond (epoll_pwait2): with epoll_wait's whole milliseconds an
  // open-loop client either spins through the last millisecond before an arrival, taking a
  // core from the server it measures, or sends up to a millisecond late.
  double wait = finished_.empty() ? std::max(0.0, wait_ms) : 0.0;
  auto wait_ns = static_cast<int64_t>(wait * 1e6);
  timespec timeout{static_cast<time_t>(wait_ns / 1000000000),
                   static_cast<long>(wait_ns % 1000000000)};
  int n = epoll_pwait2(epoll_fd_, events, 256, &timeout, nullptr);
  if (n < 0 && errno == ENOSYS) {  // kernels before 5.11: round the wait up to a millisecond
    n = epoll_wait(epoll_fd_, events, 256, static_cast<int>(std::ceil(wait)));
  }
  for (int i = 0; i < n; ++i) {
    auto it = conns_by_fd_.find(events[i].data.fd);
    if (it == conns_by_fd_.end()) continue;
    on_event(*it->second, events[i].events);
  }
  double now = now_ms();
  std::vector<int> late;
  for (auto& [fd, conn] : conns_by_fd_) {
    if (conn->busy && now > conn->deadline_ms) late.push_back(fd);
  }
  for (int fd : late) {
    finish(*conns_by_fd_.at(fd), "timeout", "no end after " + std::to_string(timeout_ms_) + " ms");
  }
  std::vector<std::pair<uint64_t, StreamOutcome>> out;
  out.swap(finished_);
  return out;
}

// ---------------- http_get ----------------

Result<std::pair<int, std::string>> http_get(const HttpEndpoint& target, const std::string& path,
                                             double timeout_ms) {
  int fd = connect_nonblocking(target);
  if (fd < 0) return make_error(ErrorKind::disconnected, "cannot connect to " + target.host);
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + target.host +
                    "\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  ResponseParser parser;
  std::string body;
  double deadline = steady_s() + timeout_ms / 1000.0;
  while (!parser.complete()) {
    double left_ms = (deadline - steady_s()) * 1000.0;
    pollfd p{fd, static_cast<short>(POLLIN | (sent < req.size() ? POLLOUT : 0)), 0};
    if (left_ms <= 0 || ::poll(&p, 1, static_cast<int>(left_ms) + 1) <= 0) {
      close(fd);
      return make_error(ErrorKind::timed_out, "GET " + path + ": no answer in time");
    }
    int err = 0;
    socklen_t err_len = sizeof(err);
    if ((p.revents & POLLERR) && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) == 0 &&
        err != 0 && sent == 0) {
      close(fd);
      return make_error(ErrorKind::disconnected, "GET " + path + ": cannot connect to " +
                                                     target.host + ":" +
                                                     std::to_string(target.port) + ": " +
                                                     std::strerror(err));
    }
    if ((p.revents & POLLOUT) && sent < req.size()) {
      ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
    }
    if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buf[65536];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EAGAIN) continue;
    if (n < 0) {
      std::string why = std::strerror(errno);
      close(fd);
      return make_error(ErrorKind::disconnected, "GET " + path + ": cannot connect to " +
                                                     target.host + ":" +
                                                     std::to_string(target.port) + ": " + why);
    }
    if (n == 0) {
      parser.on_close();
      if (!parser.complete()) {
        close(fd);
        return make_error(ErrorKind::disconnected, "GET " + path + ": connection closed early");
      }
      break;
    }
    if (Status s = parser.feed(buf, static_cast<size_t>(n)); !s.ok()) {
      close(fd);
      return make_error(ErrorKind::invalid, "GET " + path + ": " + s.error().message);
    }
    body += parser.take_body();
  }
  close(fd);
  return std::make_pair(parser.status(), body);
}

}  // namespace tandem::bench
