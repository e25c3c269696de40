// Test support: a small blocking HTTP/1.1 client over plain sockets, for integration tests
// that talk to a real gateway or admin endpoint. It understands Content-Length, chunked and
// read-until-close bodies, and reads a Server-Sent-Events stream one event at a time so a
// test can stop (close the socket) mid-stream. Every read has a deadline: a server that hangs
// fails the test (an error string) instead of hanging it. No exceptions for network errors:
// failures come back in `error` fields, so a test can report them with context.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace tandem::testing::http {

using Clock = std::chrono::steady_clock;

struct Response {
  int status = 0;       // 0 when no status line arrived
  std::string headers;  // raw header block, lower-cased names not guaranteed
  std::string body;     // whole body (chunks joined)
  std::string error;    // non-empty: connect/read failure or timeout, described
  bool ok() const { return error.empty() && status != 0; }
};

// One connection. Reads go through `buffer_`, so the header parser and the body readers share
// what has been received. Lifetime: the socket closes on destruction or close().
class Connection {
 public:
  Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() { close(); }

  // Connects to 127.0.0.1:port; false (and error()) on failure.
  bool connect_to(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return fail("socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return fail("connect to 127.0.0.1:" + std::to_string(port) + " failed");
    }
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_all(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return fail("send failed");
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads more bytes into buffer_; false on EOF (eof() true), error or deadline.
  bool read_more(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return fail("timed out waiting for the server");
    pollfd p{fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready == 0) return fail("timed out waiting for the server");
    if (ready < 0) return fail("poll failed");
    char chunk[16384];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n == 0) {
      eof_ = true;
      return false;
    }
    if (n < 0) return fail("recv failed (connection reset?)");
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }
  // Reads the status line and headers into *r; false on failure.
  bool read_head(Response* r, Clock::time_point deadline) {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!read_more(deadline)) return fail_or_eof("connection closed before the headers");
    }
    r->headers = buffer_.substr(0, end + 2);
    buffer_.erase(0, end + 4);
    if (r->headers.rfind("HTTP/1.", 0) != 0 || r->headers.size() < 12) {
      return fail("not an HTTP response: " + r->headers.substr(0, 40));
    }
    r->status = std::atoi(r->headers.c_str() + 9);
    chunked_ = lower(r->headers).find("transfer-encoding: chunked") != std::string::npos;
    content_length_ = header_number(lower(r->headers), "content-length:");
    return true;
  }
  // Body bytes decoded so far are appended to *out. Returns false once the body is complete
  // (body_done()) or on failure (error() non-empty).
  bool read_body_some(std::string* out, Clock::time_point deadline) {
    if (done_) return false;
    for (;;) {
      if (take_body(out)) return true;
      if (done_) return false;
      if (!read_more(deadline)) {
        if (eof_ && !chunked_ && content_length_ < 0) {  // read-until-close body
          done_ = true;
          return false;
        }
        return fail_or_eof("connection closed mid-body");
      }
    }
  }
  bool body_done() const { return done_; }
  const std::string& error() const { return error_; }

 private:
  // Moves whatever complete body bytes the buffer holds into *out; true if it moved any.
  bool take_body(std::string* out) {
    if (!chunked_) {
      if (content_length_ >= 0) {
        size_t want = static_cast<size_t>(content_length_) - consumed_;
        size_t n = std::min(want, buffer_.size());
        out->append(buffer_, 0, n);
        buffer_.erase(0, n);
        consumed_ += n;
        if (consumed_ == static_cast<size_t>(content_length_)) done_ = true;
        return n > 0 || done_;
      }
      bool any = !buffer_.empty();
      out->append(buffer_);
      buffer_.clear();
      return any;
    }
    bool any = false;
    for (;;) {
      size_t line_end = buffer_.find("\r\n");
      if (line_end == std::string::npos) return any;
      size_t size = std::strtoul(buffer_.substr(0, line_end).c_str(), nullptr, 16);
      if (size == 0) {
        if (buffer_.size() < line_end + 4) return any;
        buffer_.erase(0, line_end + 4);
        done_ = true;
        return true;
      }
      if (buffer_.size() < line_end + 2 + size + 2) return any;
      out->append(buffer_, line_end + 2, size);
      buffer_.erase(0, line_end + 2 + size + 2);
      any = true;
    }
  }
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static long header_number(const std::string& headers, const std::string& name) {
    size_t at = headers.find(name);
    if (at == std::string::npos) return -1;
    return std::strtol(headers.c_str() + at + name.size(), nullptr, 10);
  }
  bool fail(const std::string& what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  bool fail_or_eof(const std::string& what) { return fail(error_.empty() ? what : error_); }

  int fd_ = -1;
  std::string buffer_, error_;
  bool chunked_ = false, eof_ = false, done_ = false;
  long content_length_ = -1;
  size_t consumed_ = 0;
};

inline std::string request_text(const std::string& method, const std::string& path,
                                const std::string& body) {
  std::string text = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (!body.empty() || method == "POST") {
    text += "Content-Type: application/json\r\nContent-Length: " +
            std::to_string(body.size()) + "\r\n";
  }
  return text + "Connection: close\r\n\r\n" + body;
}

// One request, whole response. `timeout` bounds the whole exchange.
inline Response request(uint16_t port, const std::string& method, const std::string& path,
                        const std::string& body, std::chrono::milliseconds timeout) {
  Response r;
  auto deadline = Clock::now() + timeout;
  Connection c;
  if (!c.connect_to(port) || !c.send_all(request_text(method, path, body)) ||
      !c.read_head(&r, deadline)) {
    r.error = c.error();
    return r;
  }
  while (c.read_body_some(&r.body, deadline)) {
  }
  if (!c.body_done()) r.error = c.error();
  return r;
}

inline Response get(uint16_t port, const std::string& path,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  return request(port, "GET", path, "", timeout);
}

inline Response post(uint16_t port, const std::string& path, const std::string& body,
                     std::chrono::milliseconds timeout) {
  return request(port, "POST", path, body, timeout);
}

// A streaming POST whose body is Server-Sent Events. next() returns one event's `data:` payload
// (multi-line data joined with '\n') as soon as its blank line has arrived, so a test can read
// a few events and then close() the socket mid-stream.
class SseStream {
 public:
  // Connects, sends the request and reads the response head; check ok() / error().
  SseStream(uint16_t port, const std::string& path, const std::string& body,
            std::chrono::milliseconds head_timeout) {
    if (!conn_.connect_to(port) || !conn_.send_all(request_text("POST", path, body)) ||
        !conn_.read_head(&head_, Clock::now() + head_timeout)) {
      error_ = conn_.error();
    }
  }
  bool ok() const { return error_.empty() && head_.status != 0; }
  int status() const { return head_.status; }
  const std::string& headers() const { return head_.headers; }
  const std::string& error() const { return error_; }
  bool finished() const { return finished_; }  // the body ended cleanly
  // The next event's data, or nullopt when the stream ended (finished()) or failed (error()).
  std::optional<std::string> next(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto event = pop_event()) return event;
      if (finished_ || !error_.empty()) return std::nullopt;
      if (!conn_.read_body_some(&text_, deadline)) {
        if (conn_.body_done()) {
          finished_ = true;
          if (auto event = pop_event()) return event;
        } else {
          error_ = conn_.error();
        }
        return std::nullopt;
      }
    }
  }
  // Everything that is not an event yet (a non-SSE error body, for example).
  const std::string& pending_text() const { return text_; }
  void close() { conn_.close(); }

 private:
  std::optional<std::string> pop_event() {
    size_t end = text_.find("\n\n");
    if (end == std::string::npos) return std::nullopt;
    std::string block = text_.substr(0, end);
    text_.erase(0, end + 2);
    std::string data;
    std::istringstream lines(block);
    std::string line;
    bool any = false;
    while (std::getline(lines, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) != 0) continue;
      std::string value = line.substr(5);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      data += (any ? "\n" : "") + value;
      any = true;
    }
    return data;
  }

  Connection conn_;
  Response head_;
  std::string text_, error_;
  bool finished_ = false;
};

// Sums every series named `name` (exactly, with or without labels) whose label block contains
// `label_part` (e.g. `kind="disaggregated"`), in a Prometheus text exposition. 0 when absent;
// nullopt when a matching series' value does not parse (a garbled or truncated exposition).
inline std::optional<double> metric_sum_parsed(const std::string& exposition,
                                               const std::string& name,
                                               const std::string& label_part = "") {
  double total = 0;
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#' || line.rfind(name, 0) != 0) continue;
    size_t after = name.size();
    if (after >= line.size() || (line[after] != '{' && line[after] != ' ')) continue;
    size_t space = line.rfind(' ');
    std::string labels = line.substr(after, space - after);
    if (!label_part.empty() && labels.find(label_part) == std::string::npos) continue;
    const char* value = line.c_str() + space + 1;
    char* end = nullptr;
    double v = std::strtod(value, &end);
    if (end == value || *end != '\0') return std::nullopt;
    total += v;
  }
  return total;
}

// metric_sum_parsed, NaN when a value does not parse (so no comparison with it holds).
inline double metric_sum(const std::string& exposition, const std::string& name,
                         const std::string& label_part = "") {
  return metric_sum_parsed(exposition, name, label_part).value_or(std::nan(""));
}

// `name` (as metric_sum_parsed) in GET /metrics on 127.0.0.1:port; nullopt when that does not
// answer 200 within `timeout` or a value does not parse. A caller must not read nullopt as 0.
inline std::optional<double> scrape_metric(
    uint16_t port, const std::string& name, const std::string& label_part = "",
    std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
  Response r = get(port, "/metrics", timeout);
  if (!r.ok() || r.status != 200) return std::nullopt;
  return metric_sum_parsed(r.body, name, label_part);
}

}  // namespace tandem::testing::http
