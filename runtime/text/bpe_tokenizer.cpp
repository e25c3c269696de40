#include "runtime/text/bpe_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <unordered_map>

#include "runtime/base/assert.hpp"
#include "runtime/text/bpe_spec.hpp"
#include "runtime/text/merge.hpp"
#include "runtime/text/nfc.hpp"
#include "runtime/text/utf8.hpp"

namespace tandem::text::detail {

const char* const gpt2_split_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

constexpr std::size_t cache_entries_max = 1 << 16;
constexpr std::size_t cache_word_bytes_max = 64;

// GPT-2's reversible byte <-> printable code point table.
std::array<char32_t, 256> byte_to_code_point_table() {
  std::array<char32_t, 256> table{};
  char32_t next_extra = 256;
  for (unsigned byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                           (byte >= 0xAE && byte <= 0xFF);
    table[byte] = printable ? char32_t(byte) : next_extra++;
  }
  RT_ASSERT(next_extra == 256 + 68, "byte table has 68 remapped bytes", uint32_t(next_extra));
  return table;
}

// Byte-level text ("Ġthe") -> raw bytes (" the"); nullopt when a code point is not one
// of the 256 byte-level code points.
std::optional<std::string> unmap_byte_level(std::string_view text,
                                            const std::array<int16_t, 324>& code_point_to_byte) {
  std::string bytes;
  for (std::size_t offset = 0; offset < text.size();) {
    const utf8::Decoded decoded = utf8::decode_one(text, offset);
    if (!decoded.valid || decoded.code_point >= code_point_to_byte.size()) return std::nullopt;
    const int16_t byte = code_point_to_byte[decoded.code_point];
    if (byte < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte));
    offset += decoded.length_bytes;
  }
  return bytes;
}

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

class Regex {
 public:
  static Result<Regex> compile(const std::string& pattern, std::string_view source_name) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      return make_error(ErrorKind::invalid, std::string(source_name) + ": pre-tokenizer regex /" +
                                                pattern + "/ does not compile at offset " +
                                                std::to_string(error_offset) + ": " +
                                                reinterpret_cast<const char*>(message.data()));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; interpreter otherwise
    Regex regex;
    regex.code_.reset(code);
    return regex;
  }

  using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;
  // Scratch for split(): one per caller (the regex itself is shared by threads; this is not).
  MatchData match_data() const {
    MatchData data(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    RT_ASSERT(data != nullptr, "pcre2 match data allocation failed");
    return data;
  }

  // Appends the pieces of `text` (valid UTF-8) to `out`: matches, and gaps when keep_gaps.
  // `match_data` from match_data(), used by one thread at a time.
  void split(std::string_view text, bool keep_matches, const MatchData& match_data,
             std::vector<std::string>& out) const {
    std::size_t offset = 0;
    std::size_t gap_start = 0;
    while (offset < text.size()) {
      const int rc =
          pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), offset,
                      PCRE2_NO_UTF_CHECK, match_data.get(), nullptr);
      if (rc < 0) break;  // no match (or a match-limit error): the rest is one gap
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
      const std::size_t start = ovector[0], end = ovector[1];
      RT_ASSERT(start >= offset && end >= start && end <= text.size(), start, end, offset);
      if (end == start) {  // empty match: step over one code point
        offset = start + utf8::decode_one(text, start).length_bytes;
        continue;
      }
      if (start > gap_start) out.emplace_back(text.substr(gap_start, start - gap_start));
      if (keep_matches) out.emplace_back(text.substr(start, end - start));
      offset = end;
      gap_start = end;
    }
    if (gap_start < text.size()) out.emplace_back(text.substr(gap_start));
  }

 private:
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

struct Step {
  PreTokenizerStep spec;
  std::optional<Regex> regex;
};

struct MergeRule {
  int32_t rank;
  int32_t merged_id;
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

bool is_space_byte(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

}  // namespace

class BpeTokenizer final : public Tokenizer {
 public:
  TokenizerKind kind() const override { return kind_; }
  int32_t vocab_size() const override { return static_cast<int32_t>(token_texts_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }

  std::string_view token_text(int32_t id) const override {
    RT_ASSERT(valid_id(id), "token_text: id out of range", id, vocab_size());
    return token_texts_[static_cast<std::size_t>(id)];
  }

  std::optional<int32_t> special_token_id(std::string_view text) const override {
    for (const AddedTokenSpec& token : added_) {
      if (token.content == text) return token.id;
    }
    return std::nullopt;
  }

  std::string decode_piece(std::optional<int32_t>, int32_t id) const override {
    if (!valid_id(id)) return "\xEF\xBF\xBD";
    return token_bytes_[static_cast<std::size_t>(id)];
  }

  std::vector<int32_t> encode(std::string_view raw_text, bool add_bos) const override;

  static Result<std::unique_ptr<Tokenizer>> build(BpeSpec spec);

 private:
  void encode_segment(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_word(const std::string& word, std::vector<int32_t>& ids) const;
  // Longest added token starting at `offset`, if any.
  const AddedTokenSpec* added_at(std::string_view text, std::size_t offset) const;
  Status load_vocab(const BpeSpec& spec);
  Status load_merges(const BpeSpec& spec);
  Status load_added_and_steps(BpeSpec& spec);

  TokenizerKind kind_ = TokenizerKind::hf_byte_level_bpe;
  std::string source_name_;
  std::vector<std::string> token_texts_;  // by id
  std::vector<std::string> token_bytes_;  // by id: what the id decodes to
  std::unordered_map<std::string, int32_t> bytes_to_id_;
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, MergeRule> merges_;
  std::vector<AddedTokenSpec> added_;
  std::array<std::vector<std::size_t>, 256> added_by_first_byte_;  // indexes into added_
  std::vector<Step> steps_;
  bool nfc_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> bos_id_, eos_id_;
  // The word cache is per thread (encode is called from several threads at once), tagged
  // with the tokenizer's instance id: a thread that encodes with another tokenizer, or
  // with one created at the same address later, starts a fresh cache.
  const uint64_t instance_id_ = next_instance_id();
  static uint64_t next_instance_id() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }
  using WordCache = std::unordered_map<std::string, std::vector<int32_t>>;
  WordCache& word_cache() const;
};

BpeTokenizer::WordCache& BpeTokenizer::word_cache() const {
  thread_local uint64_t owner = 0;
  thread_local WordCache cache;
  if (owner != instance_id_) {
    cache.clear();
    owner = instance_id_;
  }
  return cache;
}

const AddedTokenSpec* BpeTokenizer::added_at(std::string_view text, std::size_t offset) const {
  const auto first = static_cast<unsigned char>(text[offset]);
  for (const std::size_t index : added_by_first_byte_[first]) {  // sorted longest first
    const AddedTokenSpec& token = added_[index];
    if (text.substr(offset, token.content.size()) == token.content) return &token;
  }
  return nullptr;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view raw_text, bool add_bos) const {
  const std::string text = utf8::sanitize(raw_text);
  const std::string_view view = text;
  std::vector<int32_t> ids;
  if (add_bos && bos_id_) ids.push_back(*bos_id_);
  std::size_t segment_start = 0;
  std::size_t offset = 0;
  while (offset < view.size()) {
    const AddedTokenSpec* token = added_.empty() ? nullptr : added_at(view, offset);
    if (token == nullptr) {
      ++offset;
      continue;
    }
    std::size_t segment_end = offset;
    if (token->lstrip) {
      while (segment_end > segment_start && is_space_byte(view[segment_end - 1])) --segment_end;
    }
    encode_segment(view.substr(segment_start, segment_end - segment_start), ids);
    ids.push_back(token->id);
    offset += token->content.size();
    if (token->rstrip) {
      while (offset < view.size() && is_space_byte(view[offset])) ++offset;
    }
    segment_start = offset;
  }
  encode_segment(view.substr(segment_start), ids);
  for (const int32_t id : ids) RT_ASSERT(valid_id(id), "encode produced a bad id", id);
  return ids;
}

void BpeTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::vector<std::string> pieces{nfc_ ? to_nfc(text) : std::string(text)};
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    Regex::MatchData match_data = step.regex ? step.regex->match_data() : nullptr;
    for (std::string& piece : pieces) {
      if (step.spec.type == PreTokenizerStep::Type::byte_level) {
        if (step.spec.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
          piece.insert(piece.begin(), ' ');
        }
        if (!step.regex) {
          next.push_back(std::move(piece));
          continue;
        }
      }
      RT_ASSERT(step.regex.has_value(), "split step without a regex");
      step.regex->split(piece, step.spec.type != PreTokenizerStep::Type::split_removed,
                        match_data, next);
    }
    pieces.swap(next);
  }
  for (const std::string& piece : pieces) encode_word(piece, ids);
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  WordCache& cache = word_cache();
  if (const auto cached = cache.find(word); cached != cache.end()) {
    ids.insert(ids.end(), cached->second.begin(), cached->second.end());
    return;
  }
  std::vector<int32_t> word_ids;
  const auto whole = ignore_merges_ ? bytes_to_id_.find(word) : bytes_to_id_.end();
  if (whole != bytes_to_id_.end()) {
    word_ids.push_back(whole->second);
  } else {
    word_ids.reserve(word.size());
    for (const char byte : word) word_ids.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
    merge_symbols(word_ids, [this](int32_t left, int32_t right) {
      std::optional<MergeCandidate> candidate;
      const auto found = merges_.find(pair_key(left, right));
      if (found != merges_.end()) {
        candidate = MergeCandidate{double(found->second.rank), found->second.merged_id};
      }
      return candidate;
    });
  }
  RT_ASSERT(!word_ids.empty() && word_ids.size() <= word.size(), word_ids.size(), word.size());
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  if (word.size() <= cache_word_bytes_max) {
    if (cache.size() >= cache_entries_max) cache.clear();
    cache.emplace(word, std::move(word_ids));
  }
  RT_ASSERT(cache.size() <= cache_entries_max, "word cache over its bound", cache.size());
}

Status BpeTokenizer::load_vocab(const BpeSpec& spec) {
  int32_t id_max = -1;
  for (const auto& [text, id] : spec.vocab) {
    if (id < 0)
      return make_error(ErrorKind::invalid, spec.source_name + ": token '" + text +
                                                "' has negative id " + std::to_string(id));
    id_max = std::max(id_max, id);
  }
  for (const AddedTokenSpec& token : spec.added_tokens) {
    if (token.id < 0 || token.content.empty()) {
      return make_error(ErrorKind::invalid, spec.source_name + ": added token '" + token.content +
                                                "' has a bad id or empty content");
    }
    id_max = std::max(id_max, token.id);
  }
  if (id_max < 0 || id_max >= (1 << 24)) {
    return make_error(ErrorKind::invalid, spec.source_name +
                                              ": vocabulary is empty or its ids "
                                              "exceed 16M (largest id " +
                                              std::to_string(id_max) + ")");
  }
  const std::size_t count = static_cast<std::size_t>(id_max) + 1;
  token_texts_.assign(count, {});
  token_bytes_.assign(count, {});
  std::array<int16_t, 324> code_point_to_byte;
  code_point_to_byte.fill(-1);
  const std::array<char32_t, 256> byte_table = byte_to_code_point_table();
  for (unsigned byte = 0; byte < 256; ++byte) code_point_to_byte[byte_table[byte]] = int16_t(byte);
  for (const auto& [text, id] : spec.vocab) {
    std::string& slot = token_texts_[static_cast<std::size_t>(id)];
    if (!slot.empty()) {
      return make_error(ErrorKind::invalid, spec.source_name + ": id " + std::to_string(id) +
                                                " is used by '" + slot + "' and '" + text + "'");
    }
    slot = text;
    if (std::optional<std::string> bytes = unmap_byte_level(text, code_point_to_byte)) {
      token_bytes_[static_cast<std::size_t>(id)] = *bytes;
      bytes_to_id_.emplace(std::move(*bytes), id);
    }
  }
  for (unsigned byte = 0; byte < 256; ++byte) {
    const auto found = bytes_to_id_.find(std::string(1, static_cast<char>(byte)));
    if (found == bytes_to_id_.end()) {
      return make_error(ErrorKind::invalid, spec.source_name +
                                                ": byte-level vocabulary has no "
                                                "token for byte " +
                                                std::to_string(byte));
    }
    byte_ids_[byte] = found->second;
  }
  return {};
}

Status BpeTokenizer::load_merges(const BpeSpec& spec) {
  std::unordered_map<std::string_view, int32_t> text_ids;
  text_ids.reserve(spec.vocab.size());
  for (const auto& [text, id] : spec.vocab) text_ids.emplace(text, id);
  merges_.reserve(spec.merges.size());
  std::string joined;
  for (std::size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    joined.assign(left).append(right);
    const auto left_id = text_ids.find(left);
    const auto right_id = text_ids.find(right);
    const auto merged_id = text_ids.find(joined);
    const char* missing = left_id == text_ids.end()     ? "its left part"
                          : right_id == text_ids.end()  ? "its right part"
                          : merged_id == text_ids.end() ? "the merged token"
                                                        : nullptr;
    if (missing != nullptr) {
      return make_error(ErrorKind::invalid, spec.source_name + ": merge " + std::to_string(rank) +
                                                " '" + left + " " + right + "': " + missing +
                                                " is not in the vocabulary");
    }
    // A repeated pair keeps its first (best) rank, as the reference implementations do.
    merges_.emplace(pair_key(left_id->second, right_id->second),
                    MergeRule{static_cast<int32_t>(rank), merged_id->second});
  }
  RT_ASSERT(merges_.size() <= spec.merges.size(), merges_.size());
  return {};
}

Status BpeTokenizer::load_added_and_steps(BpeSpec& spec) {
  for (AddedTokenSpec& token : spec.added_tokens) {
    if (static_cast<std::size_t>(token.id) >= token_texts_.size()) continue;  // checked before
    std::string& text = token_texts_[static_cast<std::size_t>(token.id)];
    if (!text.empty() && text != token.content) {
      return make_error(ErrorKind::invalid, spec.source_name + ": added token '" + token.content +
                                                "' reuses id " + std::to_string(token.id) +
                                                " of vocabulary token '" + text + "'");
    }
    text = token.content;
    token_bytes_[static_cast<std::size_t>(token.id)] = token.content;
    added_.push_back(std::move(token));
  }
  for (std::size_t index = 0; index < added_.size(); ++index) {
    added_by_first_byte_[static_cast<unsigned char>(added_[index].content[0])].push_back(index);
  }
  for (auto& list : added_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [this](std::size_t a, std::size_t b) {
      return added_[a].content.size() > added_[b].content.size();
    });
  }
  for (PreTokenizerStep& step_spec : spec.pre_tokenizer) {
    Step step{std::move(step_spec), std::nullopt};
    const bool byte_level = step.spec.type == PreTokenizerStep::Type::byte_level;
    if (!byte_level || step.spec.use_regex) {
      const std::string pattern = byte_level ? std::string(gpt2_split_pattern) : step.spec.pattern;
      Result<Regex> regex = Regex::compile(pattern, spec.source_name);
      if (!regex) return regex.error();
      step.regex.emplace(std::move(regex).value());
    }
    steps_.push_back(std::move(step));
  }
  return {};
}

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::build(BpeSpec spec) {
  auto tokenizer = std::make_unique<BpeTokenizer>();
  tokenizer->kind_ = spec.kind;
  tokenizer->source_name_ = spec.source_name;
  tokenizer->nfc_ = spec.nfc;
  tokenizer->ignore_merges_ = spec.ignore_merges;
  if (Status status = tokenizer->load_vocab(spec); !status) return status.error();
  if (Status status = tokenizer->load_merges(spec); !status) return status.error();
  if (Status status = tokenizer->load_added_and_steps(spec); !status) return status.error();
  const auto resolve = [&tokenizer, &spec](const std::optional<std::string>& text,
                                           const char* what) -> Result<std::optional<int32_t>> {
    if (!text) return std::optional<int32_t>{};
    if (auto id = tokenizer->special_token_id(*text)) return id;
    for (const auto& [vocab_text, id] : spec.vocab) {
      if (vocab_text == *text) return std::optional<int32_t>{id};
    }
    return make_error(ErrorKind::invalid, spec.source_name + ": " + what + " '" + *text +
                                              "' is not a token of the vocabulary");
  };
  Result<std::optional<int32_t>> bos = resolve(spec.bos_token, "bos_token");
  if (!bos) return bos.error();
  Result<std::optional<int32_t>> eos = resolve(spec.eos_token, "eos_token");
  if (!eos) return eos.error();
  tokenizer->bos_id_ = *bos;
  tokenizer->eos_id_ = *eos;
  RT_ASSERT(tokenizer->vocab_size() > 256, "byte-level vocabulary has every byte");
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

Result<std::unique_ptr<Tokenizer>> build_bpe_tokenizer(BpeSpec spec) {
  return BpeTokenizer::build(std::move(spec));
}

}  // namespace tandem::text::detail
