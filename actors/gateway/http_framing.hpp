// tandem/gateway: request framing checks for the HTTP server (pure: no I/O, no clock, no kj).
//
// RequestFraming follows the bytes of one connection's requests exactly as kj::HttpServer
// receives them (GuardedStream in http_server.cpp feeds it every byte it hands to kj, in
// order) and checks what kj 0.9 checks badly or not at all. Each failure is a Verdict with
// the HTTP status the server answers (400, 413, 431), a message for the client that names
// the problem (client values are quoted, at most 40 bytes, non-printable bytes as '?') and a
// machine code:
//   400 bad_content_length: Content-Length not a decimal number (e.g. "-5"), or given more
//       than once (two headers, or "5, 6"; the message says when the values differ);
//   400 bad_transfer_encoding: Transfer-Encoding other than exactly "chunked", or repeated;
//   400 bad_framing: both Transfer-Encoding and Content-Length;
//   400 bad_chunk_size: a chunk size line empty, over 32 bytes, with extensions, not hex, or
//       over 64 bits;
//   400 bad_chunked_body: chunk data not followed by CRLF, or trailers after the last chunk;
//   400 bad_header: obsolete line folding (a header line starting with SP or HT), or a bare
//       CR in the head (kj would end a line there);
//   413 body_too_large: Content-Length over body_bytes_max, or a chunk size line that would
//       bring the chunked body over it (decided at the size line, before its data);
//   431 headers_too_large: the head (request line + headers + line ends) over head_bytes_max.
// Requests are delimited as kj delimits them (RFC 9112 6.3: chunked, else Content-Length,
// else no body; a head ends at an empty line, "\r\n" or "\n"); where kj is lenient or
// ambiguous it is stricter (the 400s above). Header lines it cannot read (no ':') are left
// to kj, which rejects the head.
// Cost: O(1) per byte; memory at most head_bytes_max (the current head) plus 32 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::gateway {

// ASCII case-insensitive equality (HTTP header names and tokens).
bool ascii_iequal(std::string_view a, std::string_view b);
// `text` without leading and trailing spaces and tabs (HTTP's OWS).
std::string_view trim_ows(std::string_view text);

// One connection's framing state (see the file comment). Not thread-safe; one per connection.
class RequestFraming {
 public:
  struct Verdict {
    uint32_t status = 0;  // 0 = no error
    std::string message;
    std::string code;
  };
  enum class Phase { idle, head, body };

  // Preconditions (asserted): both limits > 0.
  RequestFraming(uint64_t head_bytes_max, uint64_t body_bytes_max);

  // Consumes a prefix of `data`: all of it, or up to and including the last byte of a
  // request (then request_ended() is true until the next feed), or up to and including the
  // byte that made the request invalid (then failed(); feeding more is asserted against).
  // How the bytes are split over calls does not change the outcome (fuzz_http_framing).
  size_t feed(const char* data, size_t size);

  bool failed() const { return verdict_.status != 0; }
  const Verdict& verdict() const { return verdict_; }
  Phase phase() const;
  bool request_ended() const { return request_ended_; }
  // The current (or just ended) request asked for the connection to close after its answer:
  // `Connection: close`, or HTTP/1.0 without `Connection: keep-alive`.
  bool close_wanted() const { return close_wanted_; }
  // The current request's path as far as known ("" before its request line is complete).
  const std::string& path() const { return path_; }
  // Only the CRLF after a chunked body's last chunk is still to come: kj has the whole body
  // (it reads that CRLF before the next request, under its keep-alive timeout).
  bool awaiting_final_crlf() const { return state_ == State::last_end; }

 private:
  enum class State { idle, head, fixed_body, chunk_line, chunk_data, chunk_data_end, last_end };

  void fail(uint32_t status, std::string message, std::string code);
  void on_head_byte(char c);
  void parse_request_line(std::string_view line);
  void parse_head();
  void start_body(const std::vector<std::string_view>& lengths, size_t te_count,
                  std::string_view te);
  void on_chunk_line();
  void on_line_end_byte(char c, const char* what);
  void end_request();

  const uint64_t head_bytes_max_;
  const uint64_t body_bytes_max_;
  State state_ = State::idle;
  Verdict verdict_;
  bool request_ended_ = false;
  bool close_wanted_ = false;
  bool saw_cr_ = false;  // chunk_data_end / last_end: the CR of the expected CRLF
  std::string head_;     // the current head (<= head_bytes_max_) or chunk size line
  std::string path_;
  uint64_t remaining_bytes_ = 0;  // fixed_body / chunk_data
  uint64_t body_bytes_ = 0;       // chunked: the running total
};

}  // namespace tandem::gateway
