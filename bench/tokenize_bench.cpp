#include "bench/tokenize_bench.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/seconds_per_run.hpp"
#include "kvstore/hashing.hpp"
#include "runtime/text/tokenizer.hpp"

namespace tandem::bench {
namespace {


// Prose, indented code and a JSON tool result, repeated with a counter so that the text is
// not one repeated word (the shape of an agent's context, not of a benchmark corpus).
std::string agent_text(size_t chars) {
  static const char* parts[] = {
      "The test fails because the parser drops the last field when the line ends early. ",
      "    def parse(line):\n        fields = line.split(',')\n        return [f.strip() for f "
      "in fields if f]\n\n",
      "{\"tool\": \"read_file\", \"path\": \"src/parser.py\", \"lines\": [12, 48], \"ok\": true}\n",
      "Let me look at how the tokenizer handles    runs of spaces\tand tabs.\n",
  };
  std::string text;
  for (size_t i = 0; text.size() < chars; ++i) {
    text += parts[i % 4];
    if (i % 4 == 3) text += "step " + std::to_string(i) + ". ";
  }
  return text;
}

}  // namespace

int run_tokenize_bench(cli::Args args) {
  cli::Flags f("tandem bench tokenize [--tokenizer PATH] [--tokens N] [--seconds S] [--cap N]",
               "Tokenizing a long agent-like prompt beside hashing its blocks (the baseline in\n"
               "the same run): time per run, tokens/s, and the ratio tokenize / hash. With\n"
               "--cap, also the capped encode the gateway uses to reject a prompt over the\n"
               "context (Tokenizer::encode_capped with that many tokens): full / capped.");
  f.flag("tokenizer", "PATH", "tokenizer file or model dir", "models/stories15M")
      .flag("tokens", "N", "approximate prompt tokens", "100000")
      .flag("seconds", "S", "wall time per measurement", "1")
      .flag("cap", "N", "token budget of a capped encode (0: not measured)", "0");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  auto tokens = f.get_int("tokens");
  auto seconds = f.get_double("seconds");
  auto cap = f.get_int("cap");
  if (!tokens || *tokens < 1 || *tokens > 10000000 || !seconds || *seconds <= 0 || !cap ||
      *cap < 0) {
    std::fprintf(stderr, "tandem bench tokenize: --tokens must be 1..10000000, --seconds > 0, "
                         "--cap >= 0\n");
    return 2;
  }
  auto tokenizer = text::load_tokenizer(f.get("tokenizer"));
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "tandem bench tokenize: %s\n", tokenizer.error().describe().c_str());
    return 1;
  }
  // About 3.5 characters per token for English and code.
  std::string text = agent_text(static_cast<size_t>(*tokens) * 7 / 2);
  std::vector<int32_t> ids = (*tokenizer)->encode(text, true);
  double tokenize_s = seconds_per_run(*seconds, [&] {
    auto out = (*tokenizer)->encode(text, true);
    if (out.size() != ids.size()) std::abort();  // deterministic: same ids every run
  });
  kv::HashKey key{"bench-secret", "bench-model", ""};
  double hash_s = seconds_per_run(*seconds, [&] {
    auto hashes = kv::hash_blocks(ids, 16, key);
    if (!hashes.ok()) std::abort();
  });
  std::printf("tokenize bench: %zu chars -> %zu tokens (%s)\n", text.size(), ids.size(),
              f.get("tokenizer").c_str());
  std::printf("  %-9s %12s %14s\n", "pass", "ms per run", "tokens/s");
  std::printf("  %-9s %12.3f %14.0f\n", "tokenize", tokenize_s * 1e3, ids.size() / tokenize_s);
  std::printf("  %-9s %12.3f %14.0f\n", "hash", hash_s * 1e3, ids.size() / hash_s);
  std::printf("  ratio tokenize / hash: %.2f\n", tokenize_s / hash_s);
  if (*cap > 0) {
    text::Tokenizer::Capped capped;
    double capped_s = seconds_per_run(*seconds, [&] {
      capped = (*tokenizer)->encode_capped(text, true, static_cast<size_t>(*cap));
    });
    std::printf("  capped encode, budget %lld tokens: %.3f ms, %s after %zu tokens of %zu "
                "bytes (whole text %zu bytes)\n",
                static_cast<long long>(*cap), capped_s * 1e3,
                capped.exceeded ? "exceeded" : "within the budget", capped.ids.size(),
                capped.text_bytes_encoded, text.size());
    std::printf("  ratio full / capped: %.1f\n", tokenize_s / capped_s);
  }
  return 0;
}

}  // namespace tandem::bench
