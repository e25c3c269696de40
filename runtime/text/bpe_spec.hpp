// tandem/text (internal): what a byte-level BPE tokenizer is built from, independent of
// the file format it came from. Filled by the loaders in bpe_loader.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/base/result.hpp"
#include "runtime/text/tokenizer.hpp"

namespace tandem::text::detail {

struct AddedTokenSpec {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;  // absorbs whitespace on its left
  bool rstrip = false;  // absorbs whitespace on its right
};

struct PreTokenizerStep {
  enum class Type { split_isolated, split_removed, byte_level };
  Type type = Type::byte_level;
  std::string pattern;            // split_*: a PCRE2 pattern (UTF + UCP)
  bool add_prefix_space = false;  // byte_level
  bool use_regex = false;         // byte_level: split with the GPT-2 pattern first
};

struct BpeSpec {
  TokenizerKind kind = TokenizerKind::hf_byte_level_bpe;
  std::string source_name;
  // (token text as stored, id); byte-level text ("Ġthe").
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // rank = index
  std::vector<AddedTokenSpec> added_tokens;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool nfc = false;
  bool ignore_merges = false;
  std::optional<std::string> bos_token;  // resolved to ids by text
  std::optional<std::string> eos_token;
};

extern const char* const gpt2_split_pattern;

// Validates the spec (every byte has a token, merges name known tokens, ids are in range,
// patterns compile) and builds the tokenizer. Errors: invalid naming spec.source_name.
Result<std::unique_ptr<Tokenizer>> build_bpe_tokenizer(BpeSpec spec);

}  // namespace tandem::text::detail
