// tandem/text: the model's tokenizer.
//
// A Tokenizer maps text to token ids and back. Backends:
//   - llama2.c `tokenizer.bin` (SentencePiece-style scores, byte fallback `<0xXX>`)
//   - Hugging Face `tokenizer.json` with a byte-level BPE model (GPT-2, Qwen2/3, MiniMax)
//   - GPT-2 `encoder.json` + `vocab.bpe`
// load_tokenizer() picks the backend from the path. Loading validates every length field
// and every id; a missing or corrupt file is an Error naming the file and the problem.
//
// Threads: decode-side calls (decode, decode_piece, token_text, ...) are const and safe to
// share. encode() may update a per-tokenizer word cache, so it is non-const: one owner
// (an actor or a thread) encodes at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::text {

enum class TokenizerKind { llama2c, hf_byte_level_bpe, gpt2_bpe };
std::string_view to_string(TokenizerKind kind);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual TokenizerKind kind() const = 0;

  // Text -> ids. `text` should be UTF-8; malformed bytes are replaced by U+FFFD first.
  // add_bos prepends bos_id() when the tokenizer has one (else it adds nothing).
  // Special/added tokens written in the text are matched first and never split (HF and
  // GPT-2 backends; llama2.c encodes such text literally, as llama2.c does).
  // Cost: linear in the text plus O(n log n) merges per pre-tokenized word.
  // Thread-safe: several threads may encode (and decode) with one tokenizer at once.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;

  // encode() for a caller with a token budget: a prompt checked against the context length.
  // Text that is far longer than tokens_max tokens is not tokenized in full: prefixes of
  // growing length (from about 4 bytes per token of the budget, doubling, each cut at a line
  // start) are encoded until one has more than tokens_max + cut_margin_tokens tokens; then
  // `exceeded` is true and `ids` holds that prefix's tokens (ids.size() > tokens_max, a
  // lower bound of the whole text's count). Otherwise the whole text is encoded: `ids` is
  // exactly encode(text, add_bos) and exceeded = ids.size() > tokens_max.
  // Cost: at most about twice the encoding of min(text, the prefix that exceeds).
  struct Capped {
    std::vector<int32_t> ids;
    bool exceeded = false;
    bool partial = false;           // ids are a prefix's (then exceeded)
    size_t text_bytes_encoded = 0;  // the longest prefix (or whole text) that was encoded
  };
  Capped encode_capped(std::string_view text, bool add_bos, size_t tokens_max) const;
  // A prefix cut may change the tokens around the cut; its count must exceed the budget by
  // more than this before the whole text is said to.
  static constexpr size_t cut_margin_tokens = 64;

  // The bytes token `id` contributes when it follows `prev_id` (nullopt: start of text).
  // SentencePiece backends drop the leading space of a piece at the start of text or
  // right after BOS. Control tokens (BOS/EOS) contribute nothing in llama2.c; added
  // tokens contribute their text. An id outside [0, vocab_size) contributes U+FFFD.
  // The result may be part of a UTF-8 character: see StreamDecoder for streaming.
  virtual std::string decode_piece(std::optional<int32_t> prev_id, int32_t id) const = 0;

  // ids -> bytes, the concatenation of decode_piece() with the start-of-text rule applied
  // to ids[0]. Raw bytes: may end mid-character if the ids do.
  std::string decode(std::span<const int32_t> ids) const;

  // The vocabulary entry as stored in the file (e.g. "Ġthe", "<0x0A>", " the").
  // Precondition (asserted): 0 <= id < vocab_size().
  virtual std::string_view token_text(int32_t id) const = 0;

  // Number of ids; every id in [0, vocab_size) is valid.
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;

  // Id of a special/added token by its exact text ("<|im_end|>", "</s>"), if any.
  virtual std::optional<int32_t> special_token_id(std::string_view text) const = 0;

  bool valid_id(int32_t id) const { return id >= 0 && id < vocab_size(); }
};

// Loads a tokenizer from:
//   - a llama2.c `tokenizer.bin` file (any file name not ending in .json),
//   - an HF `tokenizer.json` file (a sibling `tokenizer_config.json` supplies bos/eos),
//   - a directory holding `tokenizer.json`, `tokenizer.bin`, or `encoder.json` + `vocab.bpe`.
// Errors: not_found (no such path / no tokenizer file in the directory), invalid (corrupt
// file: the message names the file and what is wrong), unimplemented (a model type,
// normalizer or pre-tokenizer this runtime does not implement, named in the message).
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::filesystem::path& path);

// Reads a whole file; not_found / failed naming the path.
Result<std::string> read_file_bytes(const std::filesystem::path& path);

}  // namespace tandem::text
