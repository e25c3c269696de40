#include "runtime/text/utf8.hpp"

#include "runtime/base/assert.hpp"

namespace tandem::text::utf8 {
namespace {

constexpr char32_t replacement_code_point = 0xFFFD;

bool is_continuation(unsigned char byte) {
  return (byte & 0xC0) == 0x80;
}

// Expected length from the lead byte, 0 when the byte cannot start a sequence.
std::size_t lead_length_bytes(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Allowed range of the second byte for a lead byte (tightened for E0, ED, F0, F4).
bool second_byte_ok(unsigned char lead, unsigned char second) {
  if (lead == 0xE0) return second >= 0xA0 && second <= 0xBF;
  if (lead == 0xED) return second >= 0x80 && second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90 && second <= 0xBF;
  if (lead == 0xF4) return second >= 0x80 && second <= 0x8F;
  return is_continuation(second);
}

}  // namespace

Decoded decode_one(std::string_view text, std::size_t offset_bytes) {
  RT_ASSERT(offset_bytes < text.size(), "decode_one past the end", offset_bytes, text.size());
  const auto lead = static_cast<unsigned char>(text[offset_bytes]);
  const std::size_t length_bytes = lead_length_bytes(lead);
  if (length_bytes == 0) return Decoded{replacement_code_point, 1, false};
  if (length_bytes == 1) return Decoded{lead, 1, true};
  // On failure the whole "maximal subpart" (lead + the valid continuation bytes seen so
  // far) becomes one U+FFFD, as the Unicode standard and WHATWG TextDecoder do.
  std::size_t seen_bytes = 1;
  char32_t code_point = lead & (0xFF >> (length_bytes + 1));
  for (; seen_bytes < length_bytes; ++seen_bytes) {
    if (offset_bytes + seen_bytes >= text.size()) break;
    const auto byte = static_cast<unsigned char>(text[offset_bytes + seen_bytes]);
    const bool ok = seen_bytes == 1 ? second_byte_ok(lead, byte) : is_continuation(byte);
    if (!ok) break;
    code_point = (code_point << 6) | (byte & 0x3F);
  }
  if (seen_bytes < length_bytes) return Decoded{replacement_code_point, seen_bytes, false};
  RT_ASSERT(code_point <= 0x10FFFF, "decoded code point out of range", uint32_t(code_point));
  return Decoded{code_point, length_bytes, true};
}

void append(std::string& out, char32_t code_point) {
  RT_ASSERT(code_point <= 0x10FFFF, "code point out of range", uint32_t(code_point));
  RT_ASSERT(code_point < 0xD800 || code_point > 0xDFFF, "surrogate code point",
            uint32_t(code_point));
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

bool is_valid(std::string_view text) {
  for (std::size_t offset = 0; offset < text.size();) {
    const Decoded decoded = decode_one(text, offset);
    if (!decoded.valid) return false;
    offset += decoded.length_bytes;
  }
  return true;
}

std::string sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t offset = 0; offset < text.size();) {
    const Decoded decoded = decode_one(text, offset);
    if (decoded.valid) {
      out.append(text.substr(offset, decoded.length_bytes));
    } else {
      append(out, replacement_code_point);
    }
    offset += decoded.length_bytes;
  }
  RT_ASSERT(out.size() >= text.size(), "sanitize never shrinks", out.size(), text.size());
  return out;
}

std::size_t emittable_prefix_bytes(std::string_view bytes) {
  // Look at most 3 bytes back for a lead byte whose sequence is not complete yet.
  const std::size_t size = bytes.size();
  for (std::size_t back = 1; back <= 3 && back <= size; ++back) {
    const auto byte = static_cast<unsigned char>(bytes[size - back]);
    if (is_continuation(byte)) continue;
    const std::size_t need_bytes = lead_length_bytes(byte);
    if (need_bytes <= back) return size;  // complete, ASCII, or an invalid lead
    // Incomplete: hold it only if what we have so far could still become valid.
    if (back >= 2 && !second_byte_ok(byte, static_cast<unsigned char>(bytes[size - back + 1]))) {
      return size;
    }
    return size - back;
  }
  return size;
}

}  // namespace tandem::text::utf8
