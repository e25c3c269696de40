// tandem/gateway (internal): checks of a request body's raw JSON text that the JSON parser
// does not make, or makes with the raw bytes in its message.
//
// check_json_text finds, in one pass over the bytes, the first
//  - byte sequence that is not well-formed UTF-8 (RFC 3629: overlong encodings such as
//    C0 AF, UTF-16 surrogates encoded as UTF-8 (ED A0 80), code points above U+10FFFF,
//    truncated or stray continuation bytes): "invalid UTF-8 in string at line 1, column 17
//    (byte 0xC0)"; JSON text is UTF-8 (RFC 8259 section 8.1), so this is a 400 wherever it
//    is, prompts included (as the OpenAI API does);
//  - number outside the range of a double (1e400, -1e309, a 400-digit integer): "number out
//    of range at line 1, column 17: 1e400" (a double would be infinite). Numbers that
//    underflow (1e-400) read as 0 and are accepted.
// Lines and columns count from 1; a column counts bytes. Pure; linear in the body size.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tandem::gateway {

// The first problem found as a message (see above), or nullopt when the text is clean.
// Does not check JSON syntax (the parser does: a clean text may still be malformed JSON).
std::optional<std::string> check_json_text(std::string_view body);

// `text` with every byte outside printable ASCII written as \xNN, for messages that quote
// input (a parser's "last read: ..."): the result is always valid UTF-8.
std::string printable(std::string_view text);

}  // namespace tandem::gateway
