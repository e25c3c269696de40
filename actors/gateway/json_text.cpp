#include "actors/gateway/json_text.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "runtime/base/assert.hpp"

namespace tandem::gateway {

namespace {

// Length of the well-formed UTF-8 sequence at text[at] (1..4), or 0 when it is ill-formed
// (Unicode 15, table 3-7).
size_t utf8_sequence_bytes(std::string_view text, size_t at) {
  RT_ASSERT(at < text.size(), at, text.size());
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  uint8_t lead = byte(at);
  if (lead < 0x80) return 1;
  size_t count = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    count = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    count = 3;
    if (lead == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (lead == 0xED) hi = 0x9F;  // UTF-16 surrogates U+D800..U+DFFF
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    count = 4;
    if (lead == 0xF0) lo = 0x90;  // overlong below U+10000
    if (lead == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong ASCII) or F5..FF
  }
  if (at + count > text.size()) return 0;
  if (byte(at + 1) < lo || byte(at + 1) > hi) return 0;
  for (size_t i = 2; i < count; ++i) {
    if (byte(at + i) < 0x80 || byte(at + i) > 0xBF) return 0;
  }
  return count;
}

bool number_char(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

std::string where(size_t line, size_t column) {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::string hex_byte(uint8_t b) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02X", b);
  return text;
}

// The message for an out-of-range number token, or nullopt when it is a finite double (or
// not a number at all: the parser reports that).
std::optional<std::string> check_number(std::string_view token, size_t line, size_t column) {
  RT_ASSERT(!token.empty());
  std::string copy(token);
  char* end = nullptr;
  double value = std::strtod(copy.c_str(), &end);
  if (end == copy.c_str() || std::isfinite(value)) return std::nullopt;
  constexpr size_t shown_chars_max = 40;
  std::string shown = token.size() > shown_chars_max
                          ? std::string(token.substr(0, shown_chars_max)) + "..."
                          : copy;
  return "number out of range at " + where(line, column) + ": " + shown +
         " (beyond the range of a double)";
}

}  // namespace

std::optional<std::string> check_json_text(std::string_view body) {
  size_t line = 1, line_start = 0;
  bool in_string = false, escaped = false;
  size_t at = 0;
  while (at < body.size()) {
    char c = body[at];
    size_t column = at - line_start + 1;
    size_t bytes = utf8_sequence_bytes(body, at);
    if (bytes == 0) {
      return std::string("invalid UTF-8") + (in_string ? " in string" : "") + " at " +
             where(line, column) + " (byte " + hex_byte(static_cast<uint8_t>(c)) + ")";
    }
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t end = at;
      while (end < body.size() && number_char(body[end])) ++end;
      if (auto bad = check_number(body.substr(at, end - at), line, column)) return bad;
      at = end;
      continue;
    }
    if (c == '\n') ++line, line_start = at + 1;
    at += bytes;
  }
  RT_ASSERT(at == body.size(), at, body.size());
  return std::nullopt;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    auto b = static_cast<uint8_t>(c);
    if (b >= 0x20 && b < 0x7F) {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", b);
      out += hex;
    }
  }
  return out;
}

}  // namespace tandem::gateway
