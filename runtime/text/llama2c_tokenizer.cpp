#include "runtime/text/llama2c_tokenizer.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/base/assert.hpp"
#include "runtime/text/merge.hpp"
#include "runtime/text/utf8.hpp"

namespace tandem::text {
namespace {

constexpr int32_t unk_token_id = 0;
constexpr int32_t bos_token_id = 1;
constexpr int32_t eos_token_id = 2;
constexpr int32_t byte_fallback_first_id = 3;
constexpr int32_t tokens_min_count = byte_fallback_first_id + 256;
constexpr int32_t max_token_length_limit_bytes = 1 << 16;
// llama2.c only merges pairs whose score beats this initial "best".
constexpr float merge_score_floor = -1e10f;

std::string byte_piece_name(unsigned byte) {
  char name[8];
  std::snprintf(name, sizeof(name), "<0x%02X>", byte);
  return name;
}

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    RT_ASSERT(pieces_.size() == scores_.size(), "pieces and scores differ in count");
    RT_ASSERT(pieces_.size() >= static_cast<std::size_t>(tokens_min_count), pieces_.size());
    // Byte-fallback ids (3..258) are reached only by fallback and never merge, as in
    // SentencePiece; some exports store them as raw or Latin-1-as-UTF-8 text, which must
    // not be looked up as characters. Among regular pieces the first id wins.
    for (std::size_t id = tokens_min_count; id < pieces_.size(); ++id) {
      piece_ids_.emplace(pieces_[id], static_cast<int32_t>(id));
    }
    // Every merge the encoder can make, keyed by the pair of ids: a pair (a, b) merges into
    // the piece whose text is text(a) + text(b). Both sides of a merge are always ids that
    // lookup() returned (the winners among equal pieces), so splitting each winning piece at
    // every byte finds them all; the merge loop then needs no string building or hashing.
    for (const auto& [text, merged] : piece_ids_) {
      if (scores_[static_cast<std::size_t>(merged)] <= merge_score_floor) continue;
      for (std::size_t cut = 1; cut < text.size(); ++cut) {
        auto left = piece_ids_.find(text.substr(0, cut));
        if (left == piece_ids_.end()) continue;
        auto right = piece_ids_.find(text.substr(cut));
        if (right == piece_ids_.end()) continue;
        merges_.emplace(pair_key(left->second, right->second), merged);
      }
    }
    // Words: SentencePiece vocabularies trained with split_by_whitespace have no piece with
    // a space right after another character ("a b", "x "), so no merge can cross the point
    // before a space that follows a non-space, and the text can be merged word by word
    // (small heaps that stay in cache instead of one heap over the whole prompt) with the
    // same result. A vocabulary with such a piece is merged whole.
    words_split_ok_ = true;
    for (const auto& [text, id] : piece_ids_) {
      for (std::size_t i = 1; i < text.size() && words_split_ok_; ++i) {
        if (text[i] == ' ' && text[i - 1] != ' ') words_split_ok_ = false;
      }
    }
  }

  TokenizerKind kind() const override { return TokenizerKind::llama2c; }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_token_id; }
  std::optional<int32_t> eos_id() const override { return eos_token_id; }

  std::string_view token_text(int32_t id) const override {
    RT_ASSERT(valid_id(id), "token_text: id out of range", id, vocab_size());
    return pieces_[static_cast<std::size_t>(id)];
  }

  std::optional<int32_t> special_token_id(std::string_view text) const override {
    if (text == "<unk>") return unk_token_id;
    if (text == "<s>") return bos_token_id;
    if (text == "</s>") return eos_token_id;
    return std::nullopt;
  }

  std::vector<int32_t> encode(std::string_view raw_text, bool add_bos) const override;
  std::string decode_piece(std::optional<int32_t> prev_id, int32_t id) const override;

 private:
  std::optional<int32_t> lookup(std::string_view piece) const {
    const auto found = piece_ids_.find(std::string(piece));
    if (found == piece_ids_.end()) return std::nullopt;
    return found->second;
  }

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> piece_ids_;
  std::unordered_map<uint64_t, int32_t> merges_;  // (left id, right id) -> merged id
  bool words_split_ok_ = false;
};

std::vector<int32_t> Llama2cTokenizer::encode(std::string_view raw_text, bool add_bos) const {
  const std::string text = utf8::sanitize(raw_text);
  std::vector<int32_t> ids;
  std::vector<std::size_t> word_starts{0};  // indexes into ids where a word begins
  if (!text.empty()) {
    // The dummy prefix: SentencePiece treats the text as if it started with a space.
    const std::optional<int32_t> space_id = lookup(" ");
    if (space_id) ids.push_back(*space_id);
  }
  bool after_non_space = false;
  for (std::size_t offset = 0; offset < text.size();) {
    const utf8::Decoded decoded = utf8::decode_one(text, offset);
    RT_ASSERT(decoded.valid, "sanitized text is valid UTF-8", offset);
    const std::string_view code_point = std::string_view(text).substr(offset, decoded.length_bytes);
    bool is_space = code_point == " ";
    if (is_space && after_non_space && words_split_ok_) word_starts.push_back(ids.size());
    after_non_space = !is_space;
    if (const std::optional<int32_t> id = lookup(code_point)) {
      ids.push_back(*id);
    } else {
      for (const char byte : code_point) {
        ids.push_back(byte_fallback_first_id + static_cast<unsigned char>(byte));
      }
    }
    offset += decoded.length_bytes;
  }
  auto merge = [this](int32_t left, int32_t right) {
    std::optional<detail::MergeCandidate> candidate;
    if (left < tokens_min_count || right < tokens_min_count) return candidate;
    auto merged = merges_.find(pair_key(left, right));
    if (merged != merges_.end()) {
      candidate = detail::MergeCandidate{-double(scores_[static_cast<std::size_t>(merged->second)]),
                                         merged->second};
    }
    return candidate;
  };
  if (word_starts.size() == 1) {
    detail::merge_symbols(ids, merge);
  } else {
    std::vector<int32_t> merged, word;
    merged.reserve(ids.size());
    word_starts.push_back(ids.size());
    for (std::size_t w = 0; w + 1 < word_starts.size(); ++w) {
      word.assign(ids.begin() + static_cast<std::ptrdiff_t>(word_starts[w]),
                  ids.begin() + static_cast<std::ptrdiff_t>(word_starts[w + 1]));
      detail::merge_symbols(word, merge);
      merged.insert(merged.end(), word.begin(), word.end());
    }
    ids.swap(merged);
  }
  if (add_bos) ids.insert(ids.begin(), bos_token_id);
  for (const int32_t id : ids) RT_ASSERT(valid_id(id), "encode produced a bad id", id);
  return ids;
}

std::string Llama2cTokenizer::decode_piece(std::optional<int32_t> prev_id, int32_t id) const {
  if (!valid_id(id)) return "\xEF\xBF\xBD";
  if (id == bos_token_id || id == eos_token_id) return {};
  std::string_view piece = pieces_[static_cast<std::size_t>(id)];
  if ((!prev_id || *prev_id == bos_token_id) && !piece.empty() && piece.front() == ' ') {
    piece.remove_prefix(1);
  }
  if (id >= byte_fallback_first_id && id < tokens_min_count) {
    return std::string(1, static_cast<char>(id - byte_fallback_first_id));
  }
  return std::string(piece);
}

// Little-endian reads with bounds checks; the caller reports `offset` on failure.
bool read_i32(std::string_view bytes, std::size_t& offset, int32_t& out) {
  if (bytes.size() - offset < sizeof(out)) return false;
  std::memcpy(&out, bytes.data() + offset, sizeof(out));
  offset += sizeof(out);
  return true;
}

bool read_f32(std::string_view bytes, std::size_t& offset, float& out) {
  if (bytes.size() - offset < sizeof(out)) return false;
  std::memcpy(&out, bytes.data() + offset, sizeof(out));
  offset += sizeof(out);
  return true;
}

Error corrupt(std::string_view source_name, const std::string& what) {
  return make_error(ErrorKind::invalid,
                    "llama2.c tokenizer " + std::string(source_name) + ": " + what);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> parse_llama2c_tokenizer(std::string_view bytes,
                                                           std::string_view source_name) {
  std::size_t offset = 0;
  int32_t max_token_length_bytes = 0;
  if (!read_i32(bytes, offset, max_token_length_bytes)) {
    return corrupt(source_name, "file is " + std::to_string(bytes.size()) +
                                    " bytes, too short for the 4-byte header");
  }
  if (max_token_length_bytes <= 0 || max_token_length_bytes > max_token_length_limit_bytes) {
    return corrupt(source_name, "header max_token_length " +
                                    std::to_string(max_token_length_bytes) + " is not in [1, " +
                                    std::to_string(max_token_length_limit_bytes) + "]");
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  while (offset < bytes.size()) {
    const std::string where =
        "token " + std::to_string(pieces.size()) + " at byte offset " + std::to_string(offset);
    float score = 0;
    int32_t length_bytes = 0;
    if (!read_f32(bytes, offset, score) || !read_i32(bytes, offset, length_bytes)) {
      return corrupt(source_name, where + ": truncated entry header");
    }
    if (!std::isfinite(score)) return corrupt(source_name, where + ": score is not finite");
    if (length_bytes < 0 || length_bytes > max_token_length_bytes) {
      return corrupt(source_name, where + ": length " + std::to_string(length_bytes) +
                                      " is not in [0, max_token_length " +
                                      std::to_string(max_token_length_bytes) + "]");
    }
    if (bytes.size() - offset < static_cast<std::size_t>(length_bytes)) {
      return corrupt(source_name, where + ": piece of " + std::to_string(length_bytes) +
                                      " bytes runs past the end of the file");
    }
    pieces.emplace_back(bytes.substr(offset, static_cast<std::size_t>(length_bytes)));
    scores.push_back(score);
    offset += static_cast<std::size_t>(length_bytes);
  }
  if (pieces.size() < static_cast<std::size_t>(tokens_min_count)) {
    return corrupt(source_name, "has " + std::to_string(pieces.size()) + " tokens; at least " +
                                    std::to_string(tokens_min_count) + " are required");
  }
  for (unsigned byte = 0; byte < 256; ++byte) {
    const std::size_t id = byte_fallback_first_id + byte;
    // Exports write "<0xXX>", the raw byte, or the byte as a Latin-1 code point in UTF-8.
    std::string latin1;
    utf8::append(latin1, char32_t(byte));
    if (pieces[id] != byte_piece_name(byte) && pieces[id] != std::string(1, char(byte)) &&
        pieces[id] != latin1) {
      return corrupt(source_name, "token " + std::to_string(id) + " should be the byte piece " +
                                      byte_piece_name(byte) + " (or that raw byte)");
    }
  }
  RT_ASSERT(offset == bytes.size(), "parser did not consume the file", offset, bytes.size());
  return std::unique_ptr<Tokenizer>(
      std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores)));
}

}  // namespace tandem::text
