#include "runtime/text/tokenizer.hpp"

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
