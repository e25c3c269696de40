// tandem/text: Unicode Normalization Form C without ICU.
//
// Tables are generated from Python's unicodedata (see gen_nfc_tables.py; Unicode 14.0).
// Code points assigned after Unicode 14 pass through unchanged.
#pragma once

#include <string>
#include <string_view>

namespace tandem::text {

// Returns the NFC form of `text`. Precondition (asserted): `text` is valid UTF-8.
// Fast path: text with no decomposable, combining or composable code point is returned
// as is (one scan, no table work).
std::string to_nfc(std::string_view text);

}  // namespace tandem::text
