#include "actors/gateway/http_framing.hpp"

#include <algorithm>
#include <vector>

#include "runtime/base/assert.hpp"

namespace tandem::gateway {

bool ascii_iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] + 32) : a[i];
    char y = b[i] >= 'A' && b[i] <= 'Z' ? static_cast<char>(b[i] + 32) : b[i];
    if (x != y) return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

namespace {

// For messages: a client's value, bounded and printable.
std::string quoted(std::string_view value) {
  constexpr size_t shown_max = 40;
  std::string out = "\"";
  for (char c : value.substr(0, shown_max)) {
    out += static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e ? '?' : c;
  }
  return out + (value.size() > shown_max ? "...\"" : "\"");
}

constexpr size_t chunk_line_bytes_max = 32;  // kj's MAX_CHUNK_HEADER_SIZE

}  // namespace

RequestFraming::RequestFraming(uint64_t head_bytes_max, uint64_t body_bytes_max)
    : head_bytes_max_(head_bytes_max), body_bytes_max_(body_bytes_max) {
  RT_ASSERT(head_bytes_max_ > 0, "head_bytes_max must be > 0");
  RT_ASSERT(body_bytes_max_ > 0, "body_bytes_max must be > 0");
}

RequestFraming::Phase RequestFraming::phase() const {
  switch (state_) {
    case State::idle:
      return Phase::idle;
    case State::head:
      return Phase::head;
    default:
      return Phase::body;
  }
}

void RequestFraming::fail(uint32_t status, std::string message, std::string code) {
  RT_ASSERT(!failed(), "framing failed twice");
  RT_ASSERT(status == 400 || status == 413 || status == 431, "framing status", status);
  verdict_ = Verdict{status, std::move(message), std::move(code)};
}

size_t RequestFraming::feed(const char* data, size_t size) {
  RT_ASSERT(!failed(), "feed() after a framing error");
  request_ended_ = false;
  size_t at = 0;
  while (at < size && !failed() && !request_ended_) {
    switch (state_) {
      case State::idle:
        state_ = State::head;
        head_.clear();
        path_.clear();
        close_wanted_ = false;
        break;
      case State::head:
        on_head_byte(data[at++]);
        break;
      case State::fixed_body:
      case State::chunk_data: {
        uint64_t take = std::min<uint64_t>(remaining_bytes_, size - at);
        at += take;
        remaining_bytes_ -= take;
        if (remaining_bytes_ > 0) break;
        if (state_ == State::fixed_body) {
          end_request();
        } else {
          state_ = State::chunk_data_end;
          saw_cr_ = false;
        }
        break;
      }
      case State::chunk_line: {
        char c = data[at++];
        if (c == '\n') {
          on_chunk_line();
        } else if (head_.size() >= chunk_line_bytes_max) {
          fail(
              400,
              "a chunk size line is longer than " + std::to_string(chunk_line_bytes_max) + " bytes",
              "bad_chunk_size");
        } else {
          head_ += c;
        }
        break;
      }
      case State::chunk_data_end:
        on_line_end_byte(data[at++], "chunk data is not followed by CRLF");
        if (!failed() && !saw_cr_ && state_ == State::chunk_data_end) {
          state_ = State::chunk_line;
          head_.clear();
        }
        break;
      case State::last_end:
        on_line_end_byte(data[at++], "trailers after the last chunk are not supported");
        if (!failed() && !saw_cr_ && state_ == State::last_end) end_request();
        break;
    }
  }
  RT_ASSERT(at <= size, "consumed past the input");
  return at;
}

// Expects "\r\n" or "\n" (kj accepts both); sets saw_cr_ after a CR, clears it after the LF.
void RequestFraming::on_line_end_byte(char c, const char* what) {
  if (c == '\r' && !saw_cr_) {
    saw_cr_ = true;
  } else if (c == '\n') {
    saw_cr_ = false;
  } else {
    fail(400, what, "bad_chunked_body");
  }
}

void RequestFraming::end_request() {
  state_ = State::idle;
  request_ended_ = true;
}

void RequestFraming::on_head_byte(char c) {
  if (head_.size() >= head_bytes_max_) {
    fail(431, "request headers exceed the limit of " + std::to_string(head_bytes_max_) + " bytes",
         "headers_too_large");
    return;
  }
  head_ += c;
  if (c != '\n') return;
  size_t n = head_.size();
  if (path_.empty() && head_.find('\n') == n - 1) parse_request_line(head_);
  // The head ends with an empty line: "\n\n" or "\n\r\n" at index 4 or later, as kj reads it.
  bool blank = n >= 5 && (head_[n - 2] == '\n' || (head_[n - 2] == '\r' && head_[n - 3] == '\n'));
  if (blank) parse_head();
}

void RequestFraming::parse_request_line(std::string_view line) {
  size_t method_end = line.find_first_of(" \t");
  if (method_end == std::string_view::npos) return;
  std::string_view rest = trim_ows(line.substr(method_end));
  std::string_view target = rest.substr(0, rest.find_first_of(" \t\r\n"));
  path_ = std::string(target.substr(0, target.find('?')));
}

void RequestFraming::parse_head() {
  std::string_view head(head_);
  std::vector<std::string_view> lengths;
  size_t te_count = 0;
  std::string_view te;
  bool close_token = false, keep_alive_token = false, http10 = false;
  size_t line_index = 0;
  while (!head.empty()) {
    size_t end = head.find('\n');
    std::string_view line = head.substr(0, end);
    head.remove_prefix(end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // kj ends a line at a bare CR too: such a head would frame differently here and there.
    if (line.find('\r') != std::string_view::npos) {
      fail(400, "a bare CR (not followed by LF) in the request head", "bad_header");
      return;
    }
    if (line_index++ == 0) {
      http10 = line.size() >= 8 && line.substr(line.size() - 8) == "HTTP/1.0";
      continue;
    }
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') {
      fail(400, "obsolete header line folding is not supported", "bad_header");
      return;
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // kj rejects the head itself (400)
    std::string_view name = trim_ows(line.substr(0, colon));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    if (ascii_iequal(name, "content-length")) {
      for (size_t from = 0;;) {  // "5, 6" is two values, as two headers are
        size_t comma = value.find(',', from);
        lengths.push_back(
            value.substr(from, comma == std::string_view::npos ? comma : comma - from));
        if (comma == std::string_view::npos) break;
        from = comma + 1;
      }
    } else if (ascii_iequal(name, "transfer-encoding")) {
      ++te_count;
      te = value;
    } else if (ascii_iequal(name, "connection")) {
      for (size_t from = 0; from <= value.size();) {
        size_t comma = std::min(value.find(',', from), value.size());
        std::string_view token = trim_ows(value.substr(from, comma - from));
        close_token = close_token || ascii_iequal(token, "close");
        keep_alive_token = keep_alive_token || ascii_iequal(token, "keep-alive");
        from = comma + 1;
      }
    }
  }
  close_wanted_ = close_token || (http10 && !keep_alive_token);
  start_body(lengths, te_count, te);
}

void RequestFraming::start_body(const std::vector<std::string_view>& lengths, size_t te_count,
                                std::string_view te) {
  const char* code = "bad_content_length";
  if (te_count > 0 && !lengths.empty()) {
    return fail(400, "a request must not have both Transfer-Encoding and Content-Length",
                "bad_framing");
  }
  if (te_count > 0) {
    if (te_count > 1 || !ascii_iequal(te, "chunked")) {  // exactly as kj compares it
      return fail(400, "Transfer-Encoding " + quoted(te) + " is not supported (only chunked)",
                  "bad_transfer_encoding");
    }
    state_ = State::chunk_line;
    head_.clear();
    body_bytes_ = 0;
    return;
  }
  if (lengths.size() > 1) {
    bool same = std::all_of(lengths.begin(), lengths.end(), [&lengths](std::string_view v) {
      return trim_ows(v) == trim_ows(lengths[0]);
    });
    return fail(400,
                "Content-Length is given " + std::to_string(lengths.size()) + " times" +
                    (same ? std::string()
                          : " with differing values (" + quoted(lengths[0]) + ", " +
                                quoted(lengths[1]) + ")"),
                code);
  }
  if (lengths.empty()) return end_request();  // no body (RFC 9112 6.3, rule 6)
  std::string_view value = lengths[0];
  bool digits = !value.empty() && std::all_of(value.begin(), value.end(),
                                              [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    return fail(400, "Content-Length " + quoted(value) + " is not a decimal number of bytes", code);
  }
  size_t first = std::min(value.find_first_not_of('0'), value.size());
  std::string_view significant = value.substr(first);
  uint64_t length = significant.size() > 19
                        ? UINT64_MAX
                        : std::stoull(std::string(significant.empty() ? "0" : significant));
  if (length > body_bytes_max_) {
    return fail(413,
                "request body is " +
                    (significant.size() > 19 ? quoted(value) : std::to_string(length)) +
                    " bytes; the limit is " + std::to_string(body_bytes_max_) + " bytes",
                "body_too_large");
  }
  if (length == 0) return end_request();
  state_ = State::fixed_body;
  remaining_bytes_ = length;
}

void RequestFraming::on_chunk_line() {
  std::string_view line(head_);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const char* code = "bad_chunk_size";
  if (line.empty()) return fail(400, "a chunk size line is empty", code);
  if (line.find(';') != std::string_view::npos) {
    return fail(400, "chunk extensions are not supported (" + quoted(line) + ")", code);
  }
  bool hex = std::all_of(line.begin(), line.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
  if (!hex) return fail(400, "chunk size " + quoted(line) + " is not hexadecimal", code);
  size_t first = std::min(line.find_first_not_of('0'), line.size());
  if (line.size() - first > 16) {
    return fail(400, "chunk size " + quoted(line) + " does not fit in 64 bits", code);
  }
  uint64_t size =
      line.size() == first ? 0 : std::stoull(std::string(line.substr(first)), nullptr, 16);
  if (size > body_bytes_max_ - body_bytes_) {
    return fail(413,
                "chunked request body exceeds the limit of " + std::to_string(body_bytes_max_) +
                    " bytes (a chunk of " + std::to_string(size) + " bytes after " +
                    std::to_string(body_bytes_) + ")",
                "body_too_large");
  }
  body_bytes_ += size;
  RT_ASSERT(body_bytes_ <= body_bytes_max_, "chunked total over the limit", body_bytes_);
  saw_cr_ = false;
  if (size == 0) {
    state_ = State::last_end;
  } else {
    state_ = State::chunk_data;
    remaining_bytes_ = size;
  }
}

}  // namespace tandem::gateway
