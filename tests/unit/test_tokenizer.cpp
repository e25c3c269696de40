// Unit tests for runtime/text: llama2.c and byte-level BPE tokenizers, NFC, UTF-8 helpers,
// StreamDecoder, and error handling for missing or corrupt tokenizer files.
#include <doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <random>
#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/text/bpe_tokenizer.hpp"
#include "runtime/text/llama2c_tokenizer.hpp"
#include "runtime/text/nfc.hpp"
#include "runtime/text/stream_decoder.hpp"
#include "runtime/text/tokenizer.hpp"
#include "runtime/text/utf8.hpp"

namespace fs = std::filesystem;
using namespace tandem;
using namespace tandem::text;

namespace {

fs::path source_root() {
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  return root != nullptr ? fs::path(root) : fs::current_path();
}

std::unique_ptr<Tokenizer> stories_tokenizer() {
  const fs::path path = source_root() / "models" / "stories15M" / "tokenizer.bin";
  INFO("the bundled model tokenizer is missing; run tools/setup.sh: ", path.string());
  REQUIRE(fs::exists(path));
  Result<std::unique_ptr<Tokenizer>> loaded = load_tokenizer(path);
  INFO((loaded.ok() ? std::string() : loaded.error().describe()));
  REQUIRE(loaded.ok());
  return std::move(loaded).value();
}

fs::path temp_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_text_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string stream_all(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                       std::vector<std::string>* chunks) {
  StreamDecoder decoder(tokenizer);
  std::string text;
  for (const int32_t id : ids) {
    std::string chunk = decoder.push(id);
    CHECK(utf8::is_valid(chunk));
    if (chunks != nullptr) chunks->push_back(chunk);
    text += chunk;
  }
  text += decoder.finish();
  return text;
}

// Byte-level text of raw bytes, GPT-2 style (for building small test vocabularies).
std::string byte_level(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    char32_t code_point = byte;
    const bool printable =
        (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
    if (!printable) {
      unsigned extra = 0;
      for (unsigned b = 0; b < byte; ++b) {
        const bool p = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!p) ++extra;
      }
      code_point = 256 + extra;
    }
    utf8::append(out, code_point);
  }
  return out;
}

// A tiny HF tokenizer.json: every byte, a few merges, three added tokens.
nlohmann::json tiny_hf_json(bool pair_merges) {
  nlohmann::json vocab = nlohmann::json::object();
  int32_t next_id = 0;
  for (int byte = 0; byte < 256; ++byte) vocab[byte_level(std::string(1, char(byte)))] = next_id++;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {" w", "o"}};
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    const std::string left = byte_level(a), right = byte_level(b);
    vocab[left + right] = next_id++;
    if (pair_merges) {
      merge_list.push_back({left, right});
    } else {
      merge_list.push_back(left + " " + right);
    }
  }
  nlohmann::json added = nlohmann::json::array();
  for (const char* content : {"<|im_start|>", "<|im_end|>", "<|im_start|>x"}) {
    added.push_back({{"id", next_id++}, {"content", content}, {"special", true}});
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+)"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", added}};
}

std::unique_ptr<Tokenizer> tiny_hf(bool pair_merges) {
  Result<std::unique_ptr<Tokenizer>> loaded =
      parse_hf_tokenizer(tiny_hf_json(pair_merges).dump(), "tiny/tokenizer.json", std::nullopt);
  INFO((loaded.ok() ? std::string() : loaded.error().describe()));
  REQUIRE(loaded.ok());
  return std::move(loaded).value();
}

std::string llama2c_file(const std::vector<std::string>& pieces, int32_t max_length) {
  std::string bytes(reinterpret_cast<const char*>(&max_length), 4);
  for (const std::string& piece : pieces) {
    const float score = -1.0f;
    const auto length = static_cast<int32_t>(piece.size());
    bytes.append(reinterpret_cast<const char*>(&score), 4);
    bytes.append(reinterpret_cast<const char*>(&length), 4);
    bytes += piece;
  }
  return bytes;
}

std::vector<std::string> minimal_llama2c_pieces() {
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    pieces.emplace_back(name);
  }
  return pieces;
}

}  // namespace

TEST_CASE("llama2.c tokenizer: known answer for stories15M") {
  auto tokenizer = stories_tokenizer();
  CHECK(tokenizer->kind() == TokenizerKind::llama2c);
  CHECK(tokenizer->vocab_size() == 32000);
  CHECK(tokenizer->bos_id() == 1);
  CHECK(tokenizer->eos_id() == 2);
  CHECK(tokenizer->encode("Once upon a time", true) ==
        std::vector<int32_t>{1, 9038, 2501, 263, 931});
  CHECK(tokenizer->encode("Once upon a time", false) == std::vector<int32_t>{9038, 2501, 263, 931});
  CHECK(tokenizer->encode("", true) == std::vector<int32_t>{1});
  CHECK(tokenizer->special_token_id("</s>") == 2);
  CHECK(tokenizer->token_text(931) == " time");
}

TEST_CASE("llama2.c tokenizer: decode drops the leading space at start and after BOS only") {
  auto tokenizer = stories_tokenizer();
  const std::vector<int32_t> ids{1, 9038, 2501, 263, 931};
  CHECK(tokenizer->decode(ids) == "Once upon a time");
  CHECK(tokenizer->decode_piece(263, 931) == " time");
  CHECK(tokenizer->decode_piece(1, 931) == "time");
  CHECK(tokenizer->decode_piece(std::nullopt, 931) == "time");
  CHECK(tokenizer->decode_piece(std::nullopt, 999999) == "\xEF\xBF\xBD");
}

TEST_CASE("llama2.c tokenizer: round trips, byte fallback for emoji and CJK") {
  auto tokenizer = stories_tokenizer();
  const std::vector<std::string> texts = {"Once upon a time, there was a little girl named Lily.",
                                          "  leading spaces and\ttabs\nand newlines\n\n",
                                          "naïve café, Straße, ÅÄÖ",
                                          "日本語のテキスト 中文 한국어",
                                          "emoji: 😀 👍🏽 👨‍👩‍👧 🇯🇵",
                                          "numbers 3.14159 and 1,000,000",
                                          "<s> is written, not parsed"};
  for (const std::string& text : texts) {
    CAPTURE(text);
    const std::vector<int32_t> ids = tokenizer->encode(text, true);
    CHECK(ids.front() == 1);
    CHECK(tokenizer->decode(ids) == text);
    CHECK(tokenizer->decode(std::span(ids).subspan(1)) == text);
  }
  // 😀 is not in the vocabulary: four byte-fallback ids (byte + 3).
  const std::vector<int32_t> emoji = tokenizer->encode("😀", false);
  REQUIRE(emoji.size() >= 4);
  CHECK(emoji[emoji.size() - 4] == 0xF0 + 3);
  CHECK(emoji.back() == 0x80 + 3);
}

// llama2.c's own encode loop, written plainly: look each code point up (byte fallback
// otherwise), then merge the best-scoring adjacent pair of the whole sequence (leftmost on a
// tie) until none merges. O(n^2); the tokenizer must give exactly these ids.
std::vector<int32_t> reference_llama2c_encode(const fs::path& file, const std::string& text) {
  std::ifstream in(file, std::ios::binary);
  int32_t max_len = 0;
  in.read(reinterpret_cast<char*>(&max_len), sizeof max_len);
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::unordered_map<std::string, int32_t> ids_of;
  for (int32_t id = 0; id < 32000; ++id) {
    float score = 0;
    int32_t len = 0;
    in.read(reinterpret_cast<char*>(&score), sizeof score);
    in.read(reinterpret_cast<char*>(&len), sizeof len);
    std::string piece(static_cast<size_t>(len), '\0');
    in.read(piece.data(), len);
    if (id >= 259) ids_of.emplace(piece, id);
    pieces.push_back(piece);
    scores.push_back(score);
  }
  REQUIRE(in.good());
  std::vector<int32_t> ids;
  if (!text.empty()) ids.push_back(ids_of.at(" "));
  for (size_t at = 0; at < text.size();) {
    size_t len = 1;
    auto lead = static_cast<unsigned char>(text[at]);
    if (lead >= 0xF0) len = 4; else if (lead >= 0xE0) len = 3; else if (lead >= 0xC0) len = 2;
    std::string cp = text.substr(at, len);
    if (auto it = ids_of.find(cp); it != ids_of.end()) {
      ids.push_back(it->second);
    } else {
      for (unsigned char b : cp) ids.push_back(3 + b);
    }
    at += len;
  }
  while (true) {
    float best = -1e10f;
    int32_t best_id = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      if (ids[i] < 259 || ids[i + 1] < 259) continue;
      auto it = ids_of.find(pieces[size_t(ids[i])] + pieces[size_t(ids[i + 1])]);
      if (it != ids_of.end() && scores[size_t(it->second)] > best) {
        best = scores[size_t(it->second)];
        best_id = it->second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  return ids;
}

TEST_CASE("llama2.c tokenizer: the same ids as llama2.c's whole-text merge loop") {
  auto tokenizer = stories_tokenizer();
  const fs::path file = source_root() / "models" / "stories15M" / "tokenizer.bin";
  // Texts that stress word boundaries: runs of spaces (indentation), tabs, newlines, spaces
  // before punctuation, unicode, byte fallback, and a pseudo-random mix of them.
  std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.",
      "    def f(x):\n        return  x  +  1\n\n\tif   a :  b",
      "  two  spaces   three    four     five      six       seven",
      "end with spaces   ",
      "naïve café — Straße 日本語 😀 👍🏽",
      " , . ! ? ; : ' \" ( ) [ ] { } - _ = +",
  };
  const char* atoms[] = {"the", " ", "  ", "\n", "\t", "dog", ",", ".", "Lily", "é", "😀",
                         "   ", "ran", "a", "(", ")", "x", "1", "   \n", "big"};
  uint64_t state = 12345;
  for (int t = 0; t < 8; ++t) {
    std::string text;
    for (int i = 0; i < 250; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += atoms[(state >> 33) % (sizeof atoms / sizeof atoms[0])];
    }
    texts.push_back(text);
  }
  for (const std::string& text : texts) {
    CAPTURE(text);
    CHECK(tokenizer->encode(text, false) == reference_llama2c_encode(file, text));
  }
}

TEST_CASE("StreamDecoder never emits half a UTF-8 character") {
  auto tokenizer = stories_tokenizer();
  const std::string text = "Hi 😀 and 👨‍👩‍👧, 日本 한국 end";
  const std::vector<int32_t> ids = tokenizer->encode(text, true);
  std::vector<std::string> chunks;
  CHECK(stream_all(*tokenizer, ids, &chunks) == text);
  // At least one byte-fallback token produced no output (its character was incomplete).
  int empty_chunks = 0;
  for (std::size_t i = 1; i < chunks.size(); ++i) empty_chunks += chunks[i].empty() ? 1 : 0;
  CHECK(empty_chunks >= 3);
}

TEST_CASE("StreamDecoder: continuation keeps the leading space; finish flushes bad bytes") {
  auto tokenizer = stories_tokenizer();
  StreamDecoder continuing(*tokenizer, 263);  // the stream follows " a"
  CHECK(continuing.push(931) == " time");
  StreamDecoder fresh(*tokenizer);
  CHECK(fresh.push(931) == "time");
  // Half of 😀 (F0 9F) then the end: held, then replaced on finish.
  StreamDecoder partial(*tokenizer);
  CHECK(partial.push(0xF0 + 3).empty());
  CHECK(partial.push(0x9F + 3).empty());
  CHECK(partial.held_bytes() == 2);
  CHECK(partial.finish() == "\xEF\xBF\xBD");
  // A lone continuation byte can never complete: replaced at once.
  StreamDecoder lone(*tokenizer);
  CHECK(lone.push(0x80 + 3) == "\xEF\xBF\xBD");
}

TEST_CASE("byte-level BPE: merges in both formats, specials matched first, never split") {
  for (const bool pair_merges : {false, true}) {
    CAPTURE(pair_merges);
    auto tokenizer = tiny_hf(pair_merges);
    CHECK(tokenizer->vocab_size() == 256 + 6 + 3);
    const int32_t hello = 256 + 3, world_prefix = 256 + 5;
    const int32_t im_start = 262, im_end = 263, im_start_x = 264;
    CHECK(tokenizer->encode("hello", false) == std::vector<int32_t>{hello});
    const std::vector<int32_t> ids = tokenizer->encode("<|im_start|>hello wo<|im_end|>", false);
    CHECK(ids == std::vector<int32_t>{im_start, hello, world_prefix, im_end});
    // The longest added token wins at a position.
    CHECK(tokenizer->encode("<|im_start|>x", false) == std::vector<int32_t>{im_start_x});
    // A partial special is plain text.
    const std::vector<int32_t> partial = tokenizer->encode("<|im_end", false);
    CHECK(std::find(partial.begin(), partial.end(), im_end) == partial.end());
    CHECK(tokenizer->decode(partial) == "<|im_end");
    CHECK(tokenizer->special_token_id("<|im_end|>") == im_end);
    CHECK(tokenizer->decode(ids) == "<|im_start|>hello wo<|im_end|>");
  }
}

TEST_CASE("encode is thread-safe: threads encoding at once get the sequential ids") {
  // The gateway's preparers share one tokenizer. Before encode was made thread-safe the BPE
  // tokenizer shared its regex match data and word cache between callers (wrong splits,
  // corrupted maps, crashes under this test).
  auto bpe = tiny_hf(false);
  auto llama = stories_tokenizer();
  for (const Tokenizer* tokenizer : {bpe.get(), llama.get()}) {
    CAPTURE(to_string(tokenizer->kind()));
    // Words mostly unique (more than the word cache holds, so caches fill, clear and refill
    // while the threads run), with specials, spaces, digits and non-ASCII between them.
    std::vector<std::string> texts;
    std::mt19937 rng(7);
    const std::vector<std::string> seps = {" ", "  ", "\n", ", ", "<|im_start|>", " h\xC3\xA9llo ",
                                           " 12345 ", "!! "};
    for (int t = 0; t < 8; ++t) {
      std::string text;
      for (int w = 0; w < 12000; ++w) {
        for (uint32_t c = 0, n = 3 + rng() % 6; c < n; ++c) text += char('a' + rng() % 26);
        text += seps[rng() % 8 == 0 ? rng() % seps.size() : 0];
      }
      texts.push_back(text);
    }
    std::vector<std::vector<int32_t>> want;
    for (const auto& text : texts) want.push_back(tokenizer->encode(text, true));
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 6; ++round) {
          size_t i = size_t(t * 2 + round) % texts.size();
          if (tokenizer->encode(texts[i], true) != want[i]) ++mismatches;
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(mismatches.load() == 0);
  }
}

TEST_CASE("byte-level BPE: NFC normalizer and round trips") {
  auto tokenizer = tiny_hf(false);
  // "e" + COMBINING ACUTE normalizes to "é" before tokenizing.
  CHECK(tokenizer->encode("e\xCC\x81", false) == tokenizer->encode("\xC3\xA9", false));
  for (const std::string text : {"héllo wörld 😀 日本語", "  \t\n\n", "a,b;c...!!", "x"}) {
    CAPTURE(text);
    CHECK(tokenizer->decode(tokenizer->encode(text, false)) == text);
  }
  // Malformed UTF-8 input is replaced, not a crash.
  CHECK(tokenizer->decode(tokenizer->encode("a\xFF"
                                            "b",
                                            false)) ==
        "a\xEF\xBF\xBD"
        "b");
}

TEST_CASE("NFC: composition, Hangul, canonical order, pass-through") {
  CHECK(to_nfc("e\xCC\x81") == "\xC3\xA9");                       // e + U+0301 -> é
  CHECK(to_nfc("\xC3\xA9") == "\xC3\xA9");                        // already NFC
  CHECK(to_nfc("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB") == "한");  // jamo -> syllable
  CHECK(to_nfc("\xE2\x84\xAB") == "\xC3\x85");                    // ANGSTROM SIGN -> Å
  // a + dot below (220) + acute (230) in either order: same NFC.
  CHECK(to_nfc("a\xCC\x81\xCC\xA3") == to_nfc("a\xCC\xA3\xCC\x81"));
  CHECK(to_nfc("plain ascii 123") == "plain ascii 123");
  CHECK(to_nfc("日本語 😀") == "日本語 😀");
}

TEST_CASE("utf8 helpers") {
  CHECK(utf8::is_valid("héllo 😀"));
  CHECK_FALSE(utf8::is_valid("\xC0\xAF"));      // overlong
  CHECK_FALSE(utf8::is_valid("\xED\xA0\x80"));  // surrogate
  CHECK_FALSE(utf8::is_valid("\xF0\x9F\x98"));  // truncated
  CHECK(utf8::emittable_prefix_bytes("ab\xF0\x9F") == 2);
  CHECK(utf8::emittable_prefix_bytes("ab\xF0\x9F\x98\x80") == 6);
  CHECK(utf8::emittable_prefix_bytes("ab\xE0\x80") == 4);  // can never be valid: emit
  CHECK(utf8::sanitize("a\x80z") == "a\xEF\xBF\xBDz");
}

TEST_CASE("corrupt llama2.c files are errors naming the file and the problem") {
  const std::vector<std::string> good_pieces = minimal_llama2c_pieces();
  CHECK(parse_llama2c_tokenizer(llama2c_file(good_pieces, 16), "ok.bin").ok());

  auto expect = [](const std::string& bytes, const std::string& needle) {
    Result<std::unique_ptr<Tokenizer>> result = parse_llama2c_tokenizer(bytes, "bad.bin");
    REQUIRE_FALSE(result.ok());
    CAPTURE(result.error().describe());
    CHECK(result.error().kind == ErrorKind::invalid);
    CHECK(result.error().message.find("bad.bin") != std::string::npos);
    CHECK(result.error().message.find(needle) != std::string::npos);
  };
  expect("", "too short");
  expect(llama2c_file(good_pieces, 0), "max_token_length");
  expect(llama2c_file(good_pieces, 4), "length 5");  // "<unk>" is longer than 4
  std::string truncated = llama2c_file(good_pieces, 16);
  expect(truncated.substr(0, truncated.size() - 3), "runs past the end");
  expect(truncated.substr(0, truncated.size() - 12) + "xyz", "truncated entry");
  std::vector<std::string> few(good_pieces.begin(), good_pieces.begin() + 100);
  expect(llama2c_file(few, 16), "at least 259");
  std::vector<std::string> swapped = good_pieces;
  std::swap(swapped[10], swapped[11]);
  expect(llama2c_file(swapped, 16), "byte piece");
  std::string huge = llama2c_file(good_pieces, 16);
  const int32_t bogus_length = 1 << 30;
  std::memcpy(huge.data() + 8, &bogus_length, 4);
  expect(huge, "not in [0, max_token_length");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string with_nan = llama2c_file(good_pieces, 16);
  std::memcpy(with_nan.data() + 4, &nan, 4);
  expect(with_nan, "not finite");
}

TEST_CASE("corrupt or unsupported tokenizer.json files are clear errors") {
  auto error_of = [](const std::string& json) {
    Result<std::unique_ptr<Tokenizer>> result = parse_hf_tokenizer(json, "x/tokenizer.json", {});
    REQUIRE_FALSE(result.ok());
    CHECK(result.error().message.find("x/tokenizer.json") != std::string::npos);
    return result.error();
  };
  CHECK(error_of("{not json").kind == ErrorKind::invalid);
  CHECK(error_of("[]").kind == ErrorKind::invalid);
  CHECK(error_of("{}").message.find("'model'") != std::string::npos);
  nlohmann::json wordpiece = tiny_hf_json(false);
  wordpiece["model"]["type"] = "WordPiece";
  const Error wp = error_of(wordpiece.dump());
  CHECK(wp.kind == ErrorKind::unimplemented);
  CHECK(wp.message.find("WordPiece") != std::string::npos);
  nlohmann::json unigram = tiny_hf_json(false);
  unigram["model"]["type"] = "Unigram";
  CHECK(error_of(unigram.dump()).message.find("Unigram") != std::string::npos);
  nlohmann::json bad_merge = tiny_hf_json(false);
  bad_merge["model"]["merges"].push_back("zz qq");
  CHECK(error_of(bad_merge.dump()).message.find("merge 6 'zz qq'") != std::string::npos);
  nlohmann::json bad_regex = tiny_hf_json(false);
  bad_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  CHECK(error_of(bad_regex.dump()).message.find("does not compile") != std::string::npos);
  nlohmann::json nfkc = tiny_hf_json(false);
  nfkc["normalizer"]["type"] = "NFKC";
  CHECK(error_of(nfkc.dump()).kind == ErrorKind::unimplemented);
  nlohmann::json missing_byte = tiny_hf_json(false);
  missing_byte["model"]["vocab"].erase(byte_level("A"));
  missing_byte["model"]["merges"] = nlohmann::json::array();
  CHECK(error_of(missing_byte.dump()).message.find("byte 65") != std::string::npos);
  nlohmann::json wrong_type = tiny_hf_json(false);
  wrong_type["model"]["vocab"]["h"] = "not a number";
  CHECK(error_of(wrong_type.dump()).kind == ErrorKind::invalid);
}

TEST_CASE("load_tokenizer: paths, directories and missing files") {
  const fs::path dir = temp_dir("load");
  Result<std::unique_ptr<Tokenizer>> missing = load_tokenizer(dir / "nope.bin");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().kind == ErrorKind::not_found);
  CHECK(missing.error().message.find("nope.bin") != std::string::npos);
  Result<std::unique_ptr<Tokenizer>> empty_dir = load_tokenizer(dir);
  REQUIRE_FALSE(empty_dir.ok());
  CHECK(empty_dir.error().kind == ErrorKind::not_found);

  write_file(dir / "tokenizer.json", tiny_hf_json(false).dump());
  write_file(dir / "tokenizer_config.json", R"({"bos_token": null, "eos_token": "<|im_end|>"})");
  Result<std::unique_ptr<Tokenizer>> from_dir = load_tokenizer(dir);
  REQUIRE(from_dir.ok());
  CHECK((*from_dir)->kind() == TokenizerKind::hf_byte_level_bpe);
  CHECK((*from_dir)->eos_id() == 263);
  CHECK_FALSE((*from_dir)->bos_id().has_value());
  CHECK((*from_dir)->encode("hello", true) == std::vector<int32_t>{259});

  const fs::path gpt2 = temp_dir("gpt2");
  write_file(gpt2 / "encoder.json", "{\"a\": 0");
  write_file(gpt2 / "vocab.bpe", "#version: 0.2\n");
  Result<std::unique_ptr<Tokenizer>> bad_gpt2 = load_tokenizer(gpt2);
  REQUIRE_FALSE(bad_gpt2.ok());
  CHECK(bad_gpt2.error().message.find("encoder.json") != std::string::npos);
  fs::remove(gpt2 / "vocab.bpe");
  Result<std::unique_ptr<Tokenizer>> half_pair = load_tokenizer(gpt2);
  REQUIRE_FALSE(half_pair.ok());
  CHECK(half_pair.error().message.find("vocab.bpe") != std::string::npos);

  const fs::path bin = temp_dir("bin");
  write_file(bin / "tokenizer.bin", std::string("\x10\x00\x00\x00\x00", 5));
  Result<std::unique_ptr<Tokenizer>> bad_bin = load_tokenizer(bin);
  REQUIRE_FALSE(bad_bin.ok());
  CHECK(bad_bin.error().message.find("tokenizer.bin") != std::string::npos);
  fs::remove_all(dir);
  fs::remove_all(gpt2);
  fs::remove_all(bin);
}

TEST_CASE("encode_capped (llama2.c): exact under the cap, early stop over it") {
  auto tokenizer = stories_tokenizer();
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "Once upon a time there was a cat number " +
                                          std::to_string(i) + ".\nIt liked fish.\n";
  const std::vector<int32_t> full = tokenizer->encode(text, true);
  auto under = tokenizer->encode_capped(text, true, full.size());
  CHECK_FALSE(under.exceeded);
  CHECK(under.ids == full);
  auto over = tokenizer->encode_capped(text, true, 300);
  CHECK(over.exceeded);
  CHECK(over.ids.size() > 300 + Tokenizer::cut_margin_tokens);
  CHECK(over.text_bytes_encoded < text.size() / 10);
  CHECK(tokenizer->encode_capped(text, true, full.size() - 1).exceeded);
}
