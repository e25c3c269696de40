// tandem/text: the llama2.c `tokenizer.bin` backend (SentencePiece-style BPE by scores).
//
// File layout (little-endian): int32 max_token_length, then for every token until the end
// of the file: float32 score, int32 length_bytes, length_bytes bytes of piece text.
// Ids 0, 1, 2 are <unk>, BOS, EOS; ids 3..258 are the byte-fallback pieces <0x00>..<0xFF> (or the
// raw bytes).
#pragma once

#include <memory>
#include <string_view>

#include "runtime/base/result.hpp"
#include "runtime/text/tokenizer.hpp"

namespace tandem::text {

// Parses the bytes of a tokenizer.bin; `source_name` (a path) is used in error messages.
// Errors (invalid): truncated header or entry, a length outside [0, max_token_length],
// a non-finite score, fewer than 259 tokens, byte-fallback pieces not where expected.
Result<std::unique_ptr<Tokenizer>> parse_llama2c_tokenizer(std::string_view bytes,
                                                           std::string_view source_name);

}  // namespace tandem::text
