// A small blocking HTTP/1.1 client over a plain socket, for the gateway HTTP server tests.
// Test-only: it parses just enough of a response (status, headers, Content-Length or chunked
// body) to check what the server sent. Every read has a timeout so a hung server fails a test
// instead of hanging it.
#pragma once

#include <arpa/inet.h>
#include <doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace http_test {

struct Reply {
  int status = 0;
  std::string headers;              // raw header block
  std::string body;                 // whole body (chunks joined)
  std::vector<std::string> chunks;  // chunked bodies: each chunk as it was framed
  bool chunked = false;

  bool has_header(const std::string& line) const { return headers.find(line) != std::string::npos; }
};

// Decodes a complete chunked body from `raw` starting at `pos`; nullopt if incomplete.
// On success, `pos` moves past the terminating chunk.
inline std::optional<std::vector<std::string>> decode_chunked(const std::string& raw, size_t& pos) {
  std::vector<std::string> chunks;
  size_t at = pos;
  for (;;) {
    size_t line_end = raw.find("\r\n", at);
    if (line_end == std::string::npos) return std::nullopt;
    size_t size = std::stoul(raw.substr(at, line_end - at), nullptr, 16);
    at = line_end + 2;
    if (size == 0) {
      if (raw.size() < at + 2) return std::nullopt;
      pos = at + 2;  // the final CRLF (no trailers are sent)
      return chunks;
    }
    if (raw.size() < at + size + 2) return std::nullopt;
    chunks.push_back(raw.substr(at, size));
    at += size + 2;
  }
}

class Client {
 public:
  explicit Client(uint16_t port, int rcvbuf_bytes = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    if (rcvbuf_bytes > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf_bytes, sizeof rcvbuf_bytes);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~Client() { close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send(const std::string& bytes) {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }

  // Appends whatever arrives within `timeout_ms`; false on timeout, EOF or error.
  bool fill(int timeout_ms = 5000) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }

  // True if the peer closed (reads EOF or an error) within `timeout_ms`.
  bool closed_by_peer(int timeout_ms = 5000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!eof_ && std::chrono::steady_clock::now() < deadline) fill(100);
    return eof_;
  }

  // Reads the status line and headers of the next response.
  Reply read_head() {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) REQUIRE(fill());
    Reply reply;
    std::string head = buffer_.substr(0, end);
    buffer_.erase(0, end + 4);
    REQUIRE(head.rfind("HTTP/1.1 ", 0) == 0);
    reply.status = std::stoi(head.substr(9, 3));
    reply.headers = head.substr(head.find("\r\n") + 2);
    reply.chunked = reply.has_header("Transfer-Encoding: chunked");
    return reply;
  }

  // Reads exactly one chunk of a chunked body ("" for the terminating chunk).
  std::string read_chunk(int timeout_ms = 5000) {
    for (;;) {
      size_t line_end = buffer_.find("\r\n");
      if (line_end != std::string::npos) {
        size_t size = std::stoul(buffer_.substr(0, line_end), nullptr, 16);
        size_t need = line_end + 2 + size + 2;
        if (buffer_.size() >= need) {
          std::string chunk = buffer_.substr(line_end + 2, size);
          buffer_.erase(0, need);
          return chunk;
        }
      }
      REQUIRE(fill(timeout_ms));
    }
  }

  // Reads a whole response; `head_request` = the request was HEAD (no body follows).
  Reply read_response(bool head_request = false) {
    Reply reply = read_head();
    if (head_request) return reply;
    if (reply.chunked) {
      for (;;) {
        std::string chunk = read_chunk();
        if (chunk.empty()) break;
        reply.body += chunk;
        reply.chunks.push_back(std::move(chunk));
      }
      return reply;
    }
    size_t at = reply.headers.find("Content-Length: ");
    if (at == std::string::npos && (reply.status == 204 || reply.status == 304)) return reply;
    REQUIRE(at != std::string::npos);
    size_t length = std::stoul(reply.headers.substr(at + 16));
    while (buffer_.size() < length) REQUIRE(fill());
    reply.body = buffer_.substr(0, length);
    buffer_.erase(0, length);
    return reply;
  }

  Reply request(const std::string& method, const std::string& target, const std::string& body = "",
                const std::string& extra_headers = "") {
    std::string text = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers;
    if (!body.empty() || method == "POST") {
      text += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    send(text + "\r\n" + body);
    return read_response(method == "HEAD");
  }

  int fd() const { return fd_; }
  const std::string& pending() const { return buffer_; }

 private:
  int fd_ = -1;
  std::string buffer_;
  bool eof_ = false;
};

}  // namespace http_test
