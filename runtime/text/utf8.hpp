// tandem/text: UTF-8 helpers shared by the tokenizers and the stream decoder.
// Pure functions, no allocation beyond the returned strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::text::utf8 {

// One decoded code point. `valid` is false for a malformed or truncated sequence; then
// `code_point` is U+FFFD and `length_bytes` covers the maximal ill-formed subpart (>= 1).
struct Decoded {
  char32_t code_point = 0;
  std::size_t length_bytes = 0;
  bool valid = false;
};

// Decodes the sequence at text[offset_bytes]. Precondition (asserted): offset < size.
// Rejects overlong forms, surrogates and code points above U+10FFFF.
Decoded decode_one(std::string_view text, std::size_t offset_bytes);

// Appends the UTF-8 encoding of `code_point` (asserted <= U+10FFFF, not a surrogate).
void append(std::string& out, char32_t code_point);

bool is_valid(std::string_view text);

// Returns `text` with each maximal ill-formed subpart replaced by one U+FFFD (valid text
// comes back equal).
std::string sanitize(std::string_view text);

// Length of the prefix of `bytes` that can be emitted now: everything except a trailing
// sequence that is incomplete but could still become valid when more bytes arrive
// (at most 3 bytes are held back).
std::size_t emittable_prefix_bytes(std::string_view bytes);

}  // namespace tandem::text::utf8
