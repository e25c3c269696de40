#include "runtime/text/tokenizer.hpp"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <system_error>

#include "runtime/base/assert.hpp"
#include "runtime/text/bpe_tokenizer.hpp"
#include "runtime/text/llama2c_tokenizer.hpp"

namespace tandem::text {

namespace fs = std::filesystem;

std::string_view to_string(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::llama2c:
      return "llama2c";
    case TokenizerKind::hf_byte_level_bpe:
      return "hf-byte-level-bpe";
    case TokenizerKind::gpt2_bpe:
      return "gpt2-bpe";
  }
  return "unknown";
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  std::optional<int32_t> prev_id;
  for (const int32_t id : ids) {
    out += decode_piece(prev_id, id);
    prev_id = id;
  }
  RT_ASSERT(ids.empty() || prev_id == ids.back(), "decode walked every id");
  return out;
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Where to cut `text` at or after `from` for a prefix: right after a newline that a
// non-whitespace byte follows (a pre-tokenizer boundary of the byte-level BPE patterns),
// looked for within window_bytes; else the next UTF-8 character start. text.size() if none.
size_t prefix_cut(std::string_view text, size_t from) {
  constexpr size_t window_bytes = 4096;
  if (from >= text.size()) return text.size();
  const size_t end = std::min(text.size(), from + window_bytes);
  for (size_t i = std::max<size_t>(from, 1); i < end; ++i) {
    if (text[i - 1] == '\n' && !is_space(text[i])) return i;
  }
  size_t cut = from;
  while (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ++cut;
  return cut;
}

}  // namespace

Tokenizer::Capped Tokenizer::encode_capped(std::string_view text, bool add_bos,
                                           size_t tokens_max) const {
  constexpr size_t bytes_per_token_guess = 4;
  // Saturating: count_tokens passes SIZE_MAX (no budget).
  const size_t over = tokens_max > SIZE_MAX - cut_margin_tokens - 1
                          ? SIZE_MAX - 1 : tokens_max + cut_margin_tokens;
  const size_t budget = over + 1;
  size_t prefix_bytes = budget > SIZE_MAX / bytes_per_token_guess
                            ? SIZE_MAX : budget * bytes_per_token_guess;
  while (prefix_bytes < text.size()) {
    const size_t cut = prefix_cut(text, prefix_bytes);
    if (cut >= text.size()) break;
    RT_ASSERT(cut > 0 && cut >= prefix_bytes, cut, prefix_bytes);
    std::vector<int32_t> ids = encode(text.substr(0, cut), add_bos);
    if (ids.size() > over) {
      Capped out{std::move(ids), true, true, cut};
      RT_ASSERT(out.ids.size() > tokens_max, out.ids.size(), tokens_max);
      return out;
    }
    prefix_bytes = cut > SIZE_MAX / 2 ? SIZE_MAX : cut * 2;
  }
  Capped out{encode(text, add_bos), false, false, text.size()};
  out.exceeded = out.ids.size() > tokens_max;
  RT_ASSERT(out.text_bytes_encoded == text.size(), out.text_bytes_encoded);
  return out;
}

Result<std::string> read_file_bytes(const fs::path& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    return make_error(ErrorKind::not_found, path.string() + ": no such file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorKind::failed, path.string() + ": cannot open for reading");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return make_error(ErrorKind::failed, path.string() + ": read error");
  return bytes.str();
}

namespace {

Result<std::unique_ptr<Tokenizer>> load_hf_json(const fs::path& file) {
  Result<std::string> json = read_file_bytes(file);
  if (!json) return json.error();
  const fs::path config_path = file.parent_path() / "tokenizer_config.json";
  std::optional<std::string> config;
  std::error_code error;
  if (fs::is_regular_file(config_path, error)) {
    Result<std::string> bytes = read_file_bytes(config_path);
    if (!bytes) return bytes.error();
    config = std::move(bytes).value();
  }
  std::optional<std::string_view> config_view;
  if (config) config_view = *config;
  return parse_hf_tokenizer(*json, file.string(), config_view);
}

Result<std::unique_ptr<Tokenizer>> load_gpt2_pair(const fs::path& directory) {
  Result<std::string> encoder = read_file_bytes(directory / "encoder.json");
  if (!encoder) return encoder.error();
  Result<std::string> merges = read_file_bytes(directory / "vocab.bpe");
  if (!merges) return merges.error();
  return parse_gpt2_tokenizer(*encoder, *merges, (directory / "encoder.json").string());
}

Result<std::unique_ptr<Tokenizer>> load_file(const fs::path& file) {
  if (file.extension() == ".json") return load_hf_json(file);
  Result<std::string> bytes = read_file_bytes(file);
  if (!bytes) return bytes.error();
  return parse_llama2c_tokenizer(*bytes, file.string());
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const fs::path& path) {
  std::error_code error;
  if (fs::is_regular_file(path, error)) return load_file(path);
  if (!fs::is_directory(path, error)) {
    return make_error(ErrorKind::not_found,
                      path.string() + ": no such tokenizer file or directory");
  }
  if (fs::is_regular_file(path / "tokenizer.json", error))
    return load_hf_json(path / "tokenizer.json");
  if (fs::is_regular_file(path / "tokenizer.bin", error)) return load_file(path / "tokenizer.bin");
  if (fs::is_regular_file(path / "encoder.json", error) ||
      fs::is_regular_file(path / "vocab.bpe", error)) {
    return load_gpt2_pair(path);
  }
  return make_error(ErrorKind::not_found,
                    path.string() +
                        ": directory has no tokenizer.json, tokenizer.bin, or "
                        "encoder.json + vocab.bpe");
}

}  // namespace tandem::text
