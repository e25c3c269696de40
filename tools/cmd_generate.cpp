// `tandem generate`: one cpu Device in-process, streaming text to stdout.
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "devices/cpu/cpu_device.hpp"
#include "devices/device.hpp"
#include "devices/sampling.hpp"
#include "tools/commands.hpp"
#include "tools/text_codec.hpp"

namespace tandem::tools {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string default_tokenizer(const std::string& model) {
  std::filesystem::path p(model);
  if (std::filesystem::is_directory(p)) return model;
  return (p.parent_path() / "tokenizer.bin").string();
}

struct GenerateArgs {
  std::string model, prompt, tokenizer;
  int64_t max_tokens = 0, threads = 0;
  devices::SamplingParams sampling;
};

// The sampling flags, each with the SamplingParams field it sets. A bad value is reported by
// validating that field alone, so the error names the flag.
struct SamplingFlag {
  const char* flag;
  void (*set)(devices::SamplingParams&, double);
};
constexpr SamplingFlag sampling_flags[] = {
    {"temperature", [](devices::SamplingParams& p, double v) { p.temperature = float(v); }},
    {"top-k", [](devices::SamplingParams& p, double v) { p.top_k = int32_t(v); }},
    {"top-p", [](devices::SamplingParams& p, double v) { p.top_p = float(v); }},
    {"min-p", [](devices::SamplingParams& p, double v) { p.min_p = float(v); }},
    {"repetition-penalty",
     [](devices::SamplingParams& p, double v) { p.repetition_penalty = float(v); }},
};

// Reads every sampling flag into *out. Prints the error naming the flag; false on error.
bool parse_sampling(const cli::Flags& flags, devices::SamplingParams* out) {
  for (const SamplingFlag& f : sampling_flags) {
    auto value = flags.get_double(f.flag);
    if (!value) return false;
    if (std::string(f.flag) == "top-k" && (*value != std::floor(*value) || *value < 0.0 ||
                                           *value > double(INT32_MAX))) {
      std::fprintf(stderr, "tandem generate: --top-k must be an integer in [0, %d], got %s\n",
                   INT32_MAX, flags.get(f.flag).c_str());
      return false;
    }
    devices::SamplingParams alone;
    f.set(alone, *value);
    if (auto st = alone.validate(); !st) {
      std::fprintf(stderr, "tandem generate: --%s: %s\n", f.flag, st.error().message.c_str());
      return false;
    }
    f.set(*out, *value);
  }
  auto seed = flags.get_int("seed");
  if (!seed) return false;
  if (*seed < 0) {
    std::fprintf(stderr, "tandem generate: --seed must be >= 0, got %s\n",
                 flags.get("seed").c_str());
    return false;
  }
  out->seed = static_cast<uint64_t>(*seed);
  auto st = out->validate();
  RT_ASSERT(st.ok(), "each sampling field was validated alone");
  return true;
}

std::optional<GenerateArgs> parse(cli::Args args, int* exit_code) {
  cli::Flags flags("tandem generate --model PATH --prompt TEXT [flags]",
                   "Runs one model on the cpu device in this process and streams its text to "
                   "stdout. Greedy when --temperature is 0; otherwise the sampling core "
                   "(devices/sampling.hpp) draws with the given filters and seed.");
  flags.flag("model", "PATH", "llama2.c .bin checkpoint or HF model directory")
      .flag("prompt", "TEXT", "prompt text (BOS is added)")
      .flag("tokenizer", "PATH",
            "tokenizer file/dir (default: tokenizer.bin beside a .bin model, or the HF "
            "directory's tokenizer.json)")
      .flag("max-tokens", "N", "tokens to generate at most", "128")
      .flag("temperature", "T", "sampling temperature, 0 = greedy", "0")
      .flag("top-k", "K", "keep the K most probable tokens (0 = off)", "0")
      .flag("top-p", "P", "keep the most probable head of mass P, in (0, 1] (1 = off)", "1")
      .flag("min-p", "P", "drop tokens below P * the top probability, in [0, 1] (0 = off)", "0")
      .flag("repetition-penalty", "R", "penalize prompt and generated tokens, > 0 (1 = off)",
            "1")
      .flag("seed", "S", "sampling seed (same seed, same text)", "0")
      .flag("threads", "N", "compute threads (0 = all cores)", "0");
  if (!flags.parse(args, exit_code)) return std::nullopt;
  GenerateArgs g{flags.get("model"), flags.get("prompt"), flags.get("tokenizer")};
  *exit_code = 2;
  auto max_tokens = flags.get_int("max-tokens"), threads = flags.get_int("threads");
  if (!max_tokens || !threads || !parse_sampling(flags, &g.sampling)) return std::nullopt;
  if (g.model.empty() || !flags.has("prompt")) {
    std::fprintf(stderr, "tandem generate: --model and --prompt are required\n\n%s",
                 flags.help().c_str());
    return std::nullopt;
  }
  if (*max_tokens < 1 || *threads < 0) {
    std::fprintf(stderr, "tandem generate: --max-tokens must be >= 1, --threads >= 0\n");
    return std::nullopt;
  }
  g.max_tokens = *max_tokens;
  g.threads = *threads;
  if (g.tokenizer.empty()) g.tokenizer = default_tokenizer(g.model);
  return g;
}

int fail(const std::string& what, const Error& e) {
  std::fprintf(stderr, "\ntandem generate: %s: %s\n", what.c_str(), e.describe().c_str());
  return 1;
}

// Prefill the prompt, then decode one token at a time, streaming text. Returns the exit code.
int run(const GenerateArgs& g, devices::Device& dev, TextCodec& codec) {
  const devices::ModelConfig& c = dev.model_config();
  std::vector<int32_t> prompt = codec.encode(g.prompt);
  if (prompt.empty() || prompt.size() >= c.max_position) {
    std::fprintf(stderr, "tandem generate: the prompt is %zu tokens; the model holds %u\n",
                 prompt.size(), c.max_position);
    return 1;
  }
  uint64_t room = c.max_position - prompt.size();
  uint32_t new_max = static_cast<uint32_t>(std::min<uint64_t>(room, uint64_t(g.max_tokens)));
  uint32_t bt = dev.kv_layout().block_tokens;
  std::vector<uint32_t> table((prompt.size() + new_max + bt - 1) / bt);
  std::iota(table.begin(), table.end(), 0u);
  devices::Sampler sampler(g.sampling);
  std::vector<int32_t> history = prompt;  // what repetition_penalty sees
  auto start = Clock::now();
  devices::PrefillSeq p{0, table, 0, prompt};
  auto out = dev.prefill(std::span(&p, 1));
  if (!out) return fail("prefill", out.error());
  double prefill_ms = ms_since(start);
  codec.begin_stream(prompt.back());
  auto first = sampler.sample(out->seqs[0].logits, history);
  if (!first) return fail("sampling", first.error());
  int32_t token = first->token;
  uint32_t produced = 0;
  auto decode_start = Clock::now();
  while (true) {
    ++produced;
    if (token == c.eos_id) break;
    history.push_back(token);
    std::string text = codec.push(token);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (produced >= new_max) break;
    devices::DecodeSeq d{0, table, static_cast<uint32_t>(prompt.size() + produced - 1), {token}};
    auto step = dev.decode(std::span(&d, 1));
    if (!step) return fail("decode", step.error());
    auto next = sampler.sample(step->seqs[0].logits, history);
    if (!next) return fail("sampling", next.error());
    token = next->token;
  }
  std::string tail = codec.finish();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputc('\n', stdout);
  double decode_ms = ms_since(decode_start);
  std::fprintf(stderr, "[%zu prompt tokens in %.0f ms (%.1f tok/s); %u generated in %.0f ms "
                       "(%.1f tok/s)]\n",
               prompt.size(), prefill_ms, 1000.0 * double(prompt.size()) / prefill_ms, produced,
               decode_ms, 1000.0 * produced / std::max(decode_ms, 1e-3));
  return 0;
}

}  // namespace

int cmd_generate(cli::Args args) {
  int exit_code = 0;
  auto g = parse(args, &exit_code);
  if (!g) return exit_code;
  auto start = Clock::now();
  std::fprintf(stderr, "loading %s ...", g->model.c_str());
  std::fflush(stderr);
  auto codec = load_text_codec(g->tokenizer);
  if (!codec) return fail("tokenizer", codec.error());
  auto weights = devices::cpu::load_model(g->model);
  if (!weights) return fail("model", weights.error());
  devices::cpu::CpuDeviceOptions options;
  options.block_tokens = 16;
  // One sequence: enough blocks for the longest context the model allows.
  options.blocks_total = (weights->config.max_position + 15) / 16;
  options.threads = static_cast<uint32_t>(g->threads);
  const devices::ModelConfig c = weights->config;
  auto dev = devices::cpu::make_cpu_device(std::move(*weights), options);
  if (!dev) return fail("device", dev.error());
  std::fprintf(stderr, " %s, %u layers, hidden %u, vocab %u, %s weights; ready in %.0f ms\n",
               std::string(devices::to_string(c.arch)).c_str(), c.layers, c.hidden,
               c.vocab_size, std::string(devices::to_string(c.weight_dtype)).c_str(),
               ms_since(start));
  return run(*g, **dev, **codec);
}

}  // namespace tandem::tools
