// The byte-level BPE tokenizer of `tandem model synth`: merges learned from a small built-in
// text (English and C++, written for this file), in the HF tokenizers JSON format.
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tools/model_synth.hpp"

namespace tandem::tools {
namespace {

constexpr const char* kSample = R"(The agent reads the repository, runs the tests and then
edits the file. When a test fails, the agent reads the error, finds the function and changes
it. The model answers with code that repeats what it was shown: names, types and comments.
int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (const auto& arg : args) {
    if (arg == "--help") return print_help();
  }
  return run(args);
}
struct Request { std::string model; std::vector<Message> messages; int max_tokens = 256; };
def handle(request):
    if request.stream:
        return stream_tokens(request)
    return complete(request)
Return the result of the function, and the error when the input is not valid.
The cache keeps the blocks of the prompt, so the next request with the same prefix is fast.
)";

// GPT-2's byte -> printable code point map: printable Latin-1 bytes map to themselves, the
// rest to 256 + n in byte order.
std::vector<std::string> byte_symbols() {
  std::vector<std::string> out(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(extra++);
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {  // two-byte UTF-8 (cp < 0x800)
      s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
    out[static_cast<size_t>(b)] = s;
  }
  return out;
}

int char_class(unsigned char c) {
  if (std::isalpha(c)) return 0;
  if (std::isdigit(c)) return 1;
  if (std::isspace(c)) return 2;
  return 3;
}

// ASCII approximation of the ByteLevel pre-split: " ?letters", " ?digits", " ?punct", spaces.
std::map<std::vector<std::string>, int> split_words(const std::string& text) {
  const auto symbols = byte_symbols();
  std::map<std::vector<std::string>, int> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() && char_class(text[i + 1]) != 2) ++i;
    int cls = char_class(static_cast<unsigned char>(text[i]));
    while (i < text.size() && char_class(static_cast<unsigned char>(text[i])) == cls) ++i;
    std::vector<std::string> word;
    for (size_t j = start; j < i; ++j) word.push_back(symbols[static_cast<unsigned char>(text[j])]);
    ++words[word];
  }
  return words;
}

std::vector<std::pair<std::string, std::string>> learn_merges(size_t merges_max) {
  auto words = split_words(kSample);
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < merges_max) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [word, count] : words) {
      for (size_t i = 0; i + 1 < word.size(); ++i) pairs[{word[i], word[i + 1]}] += count;
    }
    if (pairs.empty()) break;
    auto best = pairs.begin();  // highest count; the smallest pair on ties (map order)
    for (auto it = pairs.begin(); it != pairs.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    auto pair = best->first;
    merges.push_back(pair);
    std::map<std::vector<std::string>, int> next;
    for (const auto& [word, count] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == pair.first && word[i + 1] == pair.second) {
          merged.push_back(pair.first + pair.second);
          ++i;
        } else {
          merged.push_back(word[i]);
        }
      }
      next[merged] += count;
    }
    words = std::move(next);
  }
  return merges;
}

nlohmann::ordered_json added_entry(uint32_t id, const std::string& content, bool special) {
  return {{"id", id},           {"content", content}, {"single_word", false},
          {"lstrip", false},    {"rstrip", false},    {"normalized", false},
          {"special", special}};
}

}  // namespace

std::vector<AddedToken> synth_added_tokens(devices::Arch arch) {
  if (arch == devices::Arch::llama) return {{"<s>", true}, {"</s>", true}};
  return {{"]~!b[", true},     {"]~b]", true},
          {"[e~[", true},      {"<think>", false},
          {"</think>", false}, {"<minimax:tool_call>", false},
          {"</minimax:tool_call>", false}};
}

std::string synth_tokenizer_json(uint32_t vocab, const std::vector<AddedToken>& added) {
  RT_ASSERT(vocab >= 256 + added.size(), "synth tokenizer: vocab too small", vocab);
  using nlohmann::ordered_json;
  const auto symbols = byte_symbols();
  ordered_json vocab_json = ordered_json::object();
  for (uint32_t b = 0; b < 256; ++b) vocab_json[symbols[b]] = b;
  uint32_t next_id = 256;
  const uint32_t regular_end = vocab - static_cast<uint32_t>(added.size());
  ordered_json merges_json = ordered_json::array();
  for (const auto& [a, b] : learn_merges(regular_end - 256)) {
    merges_json.push_back(a + " " + b);
    if (!vocab_json.contains(a + b)) vocab_json[a + b] = next_id++;
  }
  ordered_json added_json = ordered_json::array();
  for (uint32_t r = 0; next_id < regular_end; ++r) {
    std::string name = "<|reserved_" + std::to_string(r) + "|>";
    added_json.push_back(added_entry(next_id, name, true));
    vocab_json[name] = next_id++;
  }
  for (const AddedToken& t : added) {
    added_json.push_back(added_entry(next_id, t.content, t.special));
    vocab_json[t.content] = next_id++;
  }
  RT_ASSERT(next_id == vocab && vocab_json.size() == vocab, "synth tokenizer: ids", next_id);
  ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                             {"trim_offsets", true}, {"use_regex", true}};
  ordered_json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
                    {"added_tokens", added_json}, {"normalizer", nullptr},
                    {"pre_tokenizer", byte_level}, {"post_processor", nullptr},
                    {"decoder", byte_level}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},
                {"unk_token", nullptr},   {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab_json},    {"merges", merges_json}};
  return j.dump(1);
}

}  // namespace tandem::tools
