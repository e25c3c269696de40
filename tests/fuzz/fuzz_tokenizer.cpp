// Fuzz target: the tokenizers (runtime/text) on arbitrary bytes (STYLE.md §8, issue 12).
// The first input byte picks what the rest is:
//   0: text. Each tokenizer encodes it (with and without BOS): every id valid; decoding
//      gives the text back (malformed UTF-8 as U+FFFD; NFC for the NFC tokenizer when no
//      added token can split it); the streaming decoder gives the same text in valid UTF-8.
//   1: token ids (little-endian int32, any value): decode and stream-decode never crash,
//      and the stream is valid UTF-8 and equal to the sanitized decode.
//   2: a llama2.c tokenizer.bin, 3: an HF tokenizer.json: parse never crashes; a tokenizer
//      that loads encodes and decodes a fixed text.
// The tokenizers are small ones built here: byte-level BPE (HF format: with and without an
// NFC normalizer, regex Split + ByteLevel, merges, added tokens) and llama2.c (scores,
// byte fallback).
//   libFuzzer: build-fuzz/tests/fuzz_tokenizer (tests/fuzz/README.md)
//   here: build/tests/fuzz_tokenizer_replay tests/fuzz/corpus/tokenizer (a test)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/text/bpe_tokenizer.hpp"
#include "runtime/text/llama2c_tokenizer.hpp"
#include "runtime/text/nfc.hpp"
#include "runtime/text/stream_decoder.hpp"
#include "runtime/text/utf8.hpp"

namespace {

using namespace tandem::text;
using tandem::Result;

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

bool byte_printable(unsigned b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

// GPT-2's byte -> code point map, as text.
std::string byte_level(std::string_view bytes) {
  std::string out;
  for (char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    char32_t code_point = byte;
    if (!byte_printable(byte)) {
      unsigned extra = 0;
      for (unsigned b = 0; b < byte; ++b) extra += byte_printable(b) ? 0 : 1;
      code_point = 256 + extra;
    }
    utf8::append(out, code_point);
  }
  return out;
}

std::string hf_json(bool nfc) {
  nlohmann::json vocab = nlohmann::json::object();
  int32_t next_id = 0;
  for (int byte = 0; byte < 256; ++byte) vocab[byte_level(std::string(1, char(byte)))] = next_id++;
  nlohmann::json merges = nlohmann::json::array();
  for (auto [a, b] : {std::pair{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"},
                      {" w", "o"}, {"\xC3", "\xA9"}, {" ", "\xC3\xA9"}, {"\n", "\n"}}) {
    vocab[byte_level(a) + byte_level(b)] = next_id++;
    merges.push_back(byte_level(a) + " " + byte_level(b));
  }
  nlohmann::json added = nlohmann::json::array();
  for (const char* content : {"<|im_start|>", "<|im_end|>", "<|im_start|>x", "<think>"}) {
    added.push_back({{"id", next_id++}, {"content", content}, {"special", true}});
  }
  nlohmann::json split = {{"type", "Split"},
                          {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+)"}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
  nlohmann::json level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  return nlohmann::json{
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
      {"normalizer", nfc ? nlohmann::json{{"type", "NFC"}} : nlohmann::json()},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, level}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", added}}
      .dump();
}

std::string llama2c_bin() {
  std::vector<std::pair<std::string, float>> pieces = {
      {"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    pieces.emplace_back(name, 0.0f);
  }
  float score = -1.0f;
  for (const char* piece : {" ", "t", "h", "e", "o", "n", "<", "s", ">", "\n", "\xC3\xA9",
                            " t", "th", "he", " th", " the", "on", "\n\n", "<s", "s>", "\n<",
                            "\xC3\xA9t\xC3\xA9", " \xC3\xA9"}) {
    pieces.emplace_back(piece, score);
    score -= 1.0f;
  }
  int32_t max_length = 16;
  std::string bytes(reinterpret_cast<const char*>(&max_length), 4);
  for (const auto& [piece, piece_score] : pieces) {
    const auto length = static_cast<int32_t>(piece.size());
    bytes.append(reinterpret_cast<const char*>(&piece_score), 4);
    bytes.append(reinterpret_cast<const char*>(&length), 4);
    bytes += piece;
  }
  return bytes;
}

struct Tokenizers {
  std::unique_ptr<Tokenizer> hf_plain, hf_nfc, llama2c;
};

std::unique_ptr<Tokenizer> loaded(Result<std::unique_ptr<Tokenizer>> result) {
  require(result.ok());
  return std::move(result).value();
}

const Tokenizers& tokenizers() {
  static const Tokenizers built{
      loaded(parse_hf_tokenizer(hf_json(false), "fuzz/plain.json", std::nullopt)),
      loaded(parse_hf_tokenizer(hf_json(true), "fuzz/nfc.json", std::nullopt)),
      loaded(parse_llama2c_tokenizer(llama2c_bin(), "fuzz/tokenizer.bin"))};
  return built;
}

std::string stream_decode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  StreamDecoder decoder(tokenizer);
  std::string text;
  for (int32_t id : ids) {
    std::string chunk = decoder.push(id);
    require(utf8::is_valid(chunk));
    text += chunk;
  }
  std::string last = decoder.finish();
  require(utf8::is_valid(last));
  return text + last;
}

void check_text(const Tokenizer& tokenizer, std::string_view text, const std::string& expected) {
  for (bool add_bos : {false, true}) {
    std::vector<int32_t> ids = tokenizer.encode(text, add_bos);
    for (int32_t id : ids) require(tokenizer.valid_id(id));
    if (add_bos && tokenizer.bos_id()) require(!ids.empty() && ids.front() == *tokenizer.bos_id());
    require(tokenizer.decode(ids) == expected);
    require(stream_decode(tokenizer, ids) == expected);
  }
}

void fuzz_text(std::string_view text) {
  const Tokenizers& t = tokenizers();
  const std::string sanitized = utf8::sanitize(text);
  check_text(*t.hf_plain, text, sanitized);
  check_text(*t.llama2c, text, sanitized);
  if (sanitized.find('<') == std::string::npos) {
    check_text(*t.hf_nfc, text, to_nfc(sanitized));
  } else {
    for (int32_t id : t.hf_nfc->encode(text, true)) require(t.hf_nfc->valid_id(id));
  }
}

void fuzz_ids(std::string_view bytes) {
  std::vector<int32_t> ids(bytes.size() / 4);
  // Fewer than 4 bytes: no ids, and memcpy must not see the empty vector's null data().
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  const Tokenizers& t = tokenizers();
  for (const Tokenizer* tokenizer : {t.hf_plain.get(), t.hf_nfc.get(), t.llama2c.get()}) {
    std::string decoded = tokenizer->decode(ids);
    require(stream_decode(*tokenizer, ids) == utf8::sanitize(decoded));
  }
}

void use_loaded(Result<std::unique_ptr<Tokenizer>> result) {
  if (!result.ok()) {
    require(!result.error().message.empty());
    return;
  }
  const Tokenizer& tokenizer = *result.value();
  require(tokenizer.vocab_size() > 0);
  std::vector<int32_t> ids = tokenizer.encode("hello <|im_end|> w\xC3\xA9rld\n", true);
  for (int32_t id : ids) require(tokenizer.valid_id(id));
  (void)stream_decode(tokenizer, ids);
  for (int32_t id = 0; id < tokenizer.vocab_size() && id < 512; ++id) {
    (void)tokenizer.token_text(id);
    (void)tokenizer.decode_piece(std::nullopt, id);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: fuzz_text(rest); break;
    case 1: fuzz_ids(rest); break;
    case 2: use_loaded(parse_llama2c_tokenizer(rest, "fuzz.bin")); break;
    default: use_loaded(parse_hf_tokenizer(rest, "fuzz.json", std::nullopt)); break;
  }
  return 0;
}
