// tandem/text: byte-level BPE (GPT-2 family): HF tokenizer.json and encoder.json + vocab.bpe.
//
// Encode: added/special tokens are matched first (leftmost, then longest) and never split;
// the text between them is NFC-normalized when the file asks for it, pre-tokenized (regex
// Split steps and ByteLevel, in file order), and each word is merged by BPE rank over its
// bytes. A bounded cache remembers the ids of short words.
// Decode: ids -> their bytes (byte-level unmapping); added tokens give their content.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "runtime/base/result.hpp"
#include "runtime/text/tokenizer.hpp"

namespace tandem::text {

// Parses an HF tokenizer.json. `config_json` is the text of tokenizer_config.json when
// there is one (it names bos_token / eos_token). Names are used in error messages.
// Errors: invalid (malformed JSON, missing fields, merges naming unknown tokens, ids out
// of range, a bad regex), unimplemented (model type other than BPE, byte_fallback,
// normalizers other than NFC, unsupported pre-tokenizer or decoder types).
Result<std::unique_ptr<Tokenizer>> parse_hf_tokenizer(std::string_view tokenizer_json,
                                                      std::string_view source_name,
                                                      std::optional<std::string_view> config_json);

// Builds the GPT-2 tokenizer from encoder.json and vocab.bpe text. <|endoftext|> is BOS,
// EOS and a special token.
Result<std::unique_ptr<Tokenizer>> parse_gpt2_tokenizer(std::string_view encoder_json,
                                                        std::string_view vocab_bpe,
                                                        std::string_view source_name);

}  // namespace tandem::text
