#include "bench/spec_decode_bench.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/decode/decode_scheduler.hpp"
#include "actors/decode/spec_step.hpp"
#include "devices/cpu/cpu_device.hpp"
#include "devices/cpu/weights.hpp"
#include "devices/device.hpp"
#include "devices/pass_cost.hpp"
#include "kvstore/prefix_cache.hpp"
#include "tools/model_synth.hpp"
#include "tools/text_codec.hpp"

namespace tandem::bench {
namespace {

using Tokens = std::vector<int32_t>;
using Clock = std::chrono::steady_clock;
using decode::SpecMethod;

const char* const kPrompts[] = {
    "Once upon a time",          "The little dog",           "Tom and Sue went to the park",
    "There was a big red ball",  "One day, a cat",           "Lily wanted to bake a cake",
    "The sun was shining and",   "Ben had a toy car",        "In a small house lived",
    "The bird sang a song",      "Mom said it was time for bed", "A little boy named Tim",
    "The tree was very tall",    "Sam found a shiny rock",   "It was a rainy day",
    "The girl liked to draw",    "Once there was a fish",    "The bear was hungry",
    "Anna and her friend",       "The old man smiled",
};

// Chained per-block hashes of a prompt (the prefix cache's keys; any prefix-determined chain
// does: repeated prompts hit, as on the served path).
std::vector<kv::BlockHash> chain_hashes(const Tokens& tokens, uint32_t block_tokens) {
  std::vector<kv::BlockHash> out;
  uint64_t state = 1469598103934665603ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    state = (state ^ static_cast<uint32_t>(tokens[i])) * 1099511628211ull;
    if ((i + 1) % block_tokens == 0) {
      kv::BlockHash h;
      for (int b = 0; b < 8; ++b) h.bytes[b] = static_cast<uint8_t>(state >> (8 * b));
      out.push_back(h);
    }
  }
  return out;
}

// CPU time of the calling thread (the engine runs on it; BLAS with 1 thread too): what the
// work cost, less exposed than wall time to the other tenants of shared cores.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct Totals {
  double seconds = 0, cpu_seconds = 0;
  double draft_seconds = 0;  // eagle3: thread time in the draft model
  uint64_t generated = 0, seq_steps = 0;
  decode::DecodeCounters counters;
  std::vector<Tokens> outputs;  // per request, in input order
};

// One decode instance's engine over `prompts`, `streams` at a time, greedy.
class Engine {
 public:
  Engine(devices::Device& device, SpecMethod method, uint32_t k, uint32_t max_model_tokens,
         double row_cost, const std::vector<std::pair<uint32_t, double>>& batch_costs)
      : device_(device),
        cache_(device.kv_layout().blocks_total, device.kv_layout().block_tokens) {
    decode::DecodeConfig c;
    c.block_tokens = device.kv_layout().block_tokens;
    c.waiting_max = 1024;
    c.seqs_max = 64;
    c.step_tokens_max = 512;
    c.max_model_tokens = max_model_tokens;
    c.spec.method = method;
    c.spec.draft_tokens_max = k;
    c.spec.row_cost = row_cost;
    c.spec.batch_row_costs = batch_costs;
    scheduler_ = std::make_unique<decode::DecodeScheduler>(c, cache_);
  }

  Result<Totals> run(const std::vector<Tokens>& prompts, uint32_t streams, uint32_t max_tokens) {
    Totals t;
    t.outputs.assign(prompts.size(), {});
    std::map<decode::SeqId, size_t> live;  // seq -> request index
    std::map<decode::SeqId, Tokens> history;
    size_t next = 0;
    const auto before = scheduler_->counters();
    const auto start = Clock::now();
    const double cpu_start = thread_seconds();
    auto submit = [&]() -> Status {
      decode::DecodeRequest r;
      r.id = ++ids_;
      r.prompt = prompts[next];
      r.prefix_hashes = chain_hashes(r.prompt, cache_.sub_block_tokens());
      r.max_tokens = max_tokens;
      r.eos_token = device_.model_config().eos_id;
      r.stop_token_ids = {device_.model_config().bos_id};
      history[r.id] = r.prompt;
      live[r.id] = next++;
      return scheduler_->submit(std::move(r));
    };
    devices::SamplingParams greedy;
    greedy.temperature = 0;
    const uint32_t vocab = device_.model_config().vocab_size;
    while (next < prompts.size() || !live.empty()) {
      while (next < prompts.size() && live.size() < streams) {
        if (Status s = submit(); !s.ok()) return s.error();
      }
      auto plan = scheduler_->plan_step();
      if (plan.entries.empty()) return make_error(ErrorKind::failed, "the engine planned nothing");
      std::vector<devices::PrefillSeq> prefill;
      std::vector<devices::DecodeSeq> decodes;
      std::vector<size_t> prefill_at, decode_at;
      for (size_t i = 0; i < plan.entries.size(); ++i) {
        const auto& e = plan.entries[i];
        std::vector<uint32_t> table(e.block_table.begin(), e.block_table.end());
        if (e.sample && (e.tokens.size() == 1 || e.draft_tokens_count > 0)) {
          // Greedy, no penalties, no logprobs: the rows' argmax is all the engine needs.
          decodes.push_back({e.seq, std::move(table), e.start_position, e.tokens, true});
          decode_at.push_back(i);
        } else {
          prefill.push_back({e.seq, std::move(table), e.start_position, e.tokens, {}});
          prefill_at.push_back(i);
        }
      }
      std::vector<decode::SampledTokens> sampled;
      auto take = [&](const decode::DecodeEntry& e, const devices::SeqOutput& out) -> Status {
        if (!e.sample) return {};
        std::span<const int32_t> drafts(e.tokens.data() + e.tokens.size() - e.draft_tokens_count,
                                        e.draft_tokens_count);
        Tokens& h = history.at(e.seq);
        auto emitted = decode::verify_step(greedy, 0, {out.logits, out.tokens}, vocab, drafts, h);
        if (!emitted.ok()) return emitted.error();
        decode::SampledTokens one{e.seq, {}};
        for (const auto& tok : emitted->tokens) one.tokens.push_back(tok.token);
        sampled.push_back(std::move(one));
        return {};
      };
      if (!prefill.empty()) {
        auto out = device_.prefill(prefill);
        if (!out.ok()) return out.error();
        for (size_t i = 0; i < prefill_at.size(); ++i) {
          if (Status s = take(plan.entries[prefill_at[i]], out->seqs[i]); !s.ok()) return s.error();
        }
      }
      if (!decodes.empty()) {
        auto out = device_.decode(decodes);
        if (!out.ok()) return out.error();
        for (size_t i = 0; i < decode_at.size(); ++i) {
          if (Status s = take(plan.entries[decode_at[i]], out->seqs[i]); !s.ok()) return s.error();
        }
        t.seq_steps += decodes.size();
      }
      for (const auto& u : scheduler_->on_step_result(plan.step_id, sampled)) {
        Tokens& out = t.outputs[live.at(u.seq)];
        out.insert(out.end(), u.tokens.begin(), u.tokens.end());
        Tokens& h = history.at(u.seq);
        h.insert(h.end(), u.tokens.begin(), u.tokens.end());
        t.generated += u.tokens.size();
        if (u.finished) {
          if (*u.finished == decode::FinishReason::failed) {
            return make_error(ErrorKind::failed, "a sequence failed in the engine");
          }
          live.erase(u.seq);
          history.erase(u.seq);
        }
      }
      if (Status s = model_drafts(decodes, sampled); !s.ok()) return s.error();
    }
    t.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    t.cpu_seconds = thread_seconds() - cpu_start;
    t.draft_seconds = draft_seconds_;
    draft_seconds_ = 0;
    const auto& now = scheduler_->counters();
    t.counters.spec_drafts_count = now.spec_drafts_count - before.spec_drafts_count;
    t.counters.spec_draft_tokens_count = now.spec_draft_tokens_count - before.spec_draft_tokens_count;
    t.counters.spec_accepted_tokens_count =
        now.spec_accepted_tokens_count - before.spec_accepted_tokens_count;
    return t;
  }

 private:
  // eagle3: the next drafts of the sequences the step decoded, as the decode shell asks them.
  Status model_drafts(const std::vector<devices::DecodeSeq>& decodes,
                      const std::vector<decode::SampledTokens>& sampled) {
    scheduler_->model_draft_wants(wants_);
    if (wants_.empty()) return {};
    std::map<decode::SeqId, const Tokens*> emitted;
    for (const auto& s : sampled) emitted[s.seq] = &s.tokens;
    std::vector<devices::DraftSeq> batch;
    for (const auto& d : decodes) {
      for (const auto& w : wants_) {
        if (w.seq == d.seq_id && emitted.count(w.seq)) {
          batch.push_back({w.seq, *emitted[w.seq], w.tokens});
        }
      }
    }
    if (batch.empty()) return {};
    double s = thread_seconds();
    auto drafts = device_.draft(batch, {});
    draft_seconds_ += thread_seconds() - s;
    if (!drafts.ok()) return drafts.error();
    for (const auto& d : *drafts) scheduler_->set_model_drafts(d.seq_id, d.tokens);
    return {};
  }

  devices::Device& device_;
  std::vector<decode::DecodeScheduler::DraftWant> wants_;
  double draft_seconds_ = 0;
  kv::PrefixCache cache_;
  std::unique_ptr<decode::DecodeScheduler> scheduler_;
  decode::SeqId ids_ = 0;
};

// What crosses the Device seam per decode step at MiniMax-M2's vocabulary (200,064): a
// synthesized one-layer model of that vocabulary, `batch` sequences of k + 1 rows, the full
// logits vs each row's argmax (DecodeSeq::argmax_only). Bytes are the output's payload
// (floats and token ids); time is the pass's, median of `runs`.
int seam_bench(uint32_t batch, uint32_t k, int runs) {
  std::string dir = "/tmp/tandem-seam-bench-" + std::to_string(::getpid());
  tools::SynthOptions o;
  o.layers = 1;
  o.hidden = 64;
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = 16;
  o.ffn = 128;
  o.vocab = 200064;
  o.max_position = 64;
  if (Status s = tools::synth_model(o, dir); !s.ok()) {
    std::fprintf(stderr, "seam bench: %s\n", s.error().describe().c_str());
    return 1;
  }
  auto weights = devices::cpu::load_model(dir);
  std::filesystem::remove_all(dir);
  if (!weights.ok()) {
    std::fprintf(stderr, "seam bench: %s\n", weights.error().describe().c_str());
    return 1;
  }
  devices::cpu::CpuDeviceOptions options;
  options.blocks_total = batch * 2;
  options.threads = 1;
  auto device = devices::cpu::make_cpu_device(std::move(*weights), options);
  if (!device.ok()) {
    std::fprintf(stderr, "seam bench: %s\n", device.error().describe().c_str());
    return 1;
  }
  std::vector<devices::PrefillSeq> prompts;
  std::vector<devices::DecodeSeq> steps;
  for (uint32_t s = 0; s < batch; ++s) {
    std::vector<uint32_t> table{2 * s, 2 * s + 1};
    prompts.push_back({s, table, 0, Tokens(8, static_cast<int32_t>(300 + s)), {}});
    steps.push_back({s, table, 8, Tokens(k + 1, 7), false});
  }
  if (auto p = (*device)->prefill(prompts); !p.ok()) return 1;
  std::printf("Device seam at vocab %u: %u sequences x %u rows (k = %u) per decode step\n",
              o.vocab, batch, k + 1, k);
  std::printf("%-14s %14s %12s\n", "output", "bytes/step", "ms/step");
  double full_bytes = 0;
  // full logits; argmax rows; argmax rows scored with logprobs top-5 (greedy + logprobs).
  const char* names[] = {"full logits", "argmax rows", "argmax+top5"};
  for (int mode = 0; mode < 3; ++mode) {
    for (auto& s : steps) {
      s.argmax_only = mode > 0;
      s.logprobs_top_n = mode == 2 ? 5 : -1;
    }
    std::vector<double> t;
    uint64_t bytes = 0;
    for (int i = 0; i < runs; ++i) {
      double t0 = thread_seconds();
      auto out = (*device)->decode(steps);
      t.push_back(thread_seconds() - t0);
      if (!out.ok()) return 1;
      bytes = 0;
      for (const auto& so : out->seqs) {
        bytes += 4 * (so.logits.size() + so.tokens.size());
        for (const auto& sc : so.scored) bytes += 4 + 8 * sc.top.size();  // logprob + pairs
      }
    }
    std::sort(t.begin(), t.end());
    if (mode == 0) full_bytes = double(bytes);
    char ratio[64] = "";
    if (mode > 0) std::snprintf(ratio, sizeof ratio, " (%.0fx fewer bytes)", full_bytes / double(bytes));
    std::printf("%-14s %14llu %12.1f%s\n", names[mode], static_cast<unsigned long long>(bytes),
                t[t.size() / 2] * 1e3, ratio);
  }
  return 0;
}

std::vector<uint32_t> parse_list(const std::string& text) {
  std::vector<uint32_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v == 0 || v > 64) return {};
    out.push_back(static_cast<uint32_t>(v));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

int run_spec_decode_bench(cli::Args args) {
  cli::Flags f("tandem bench spec-decode [--model PATH] [--streams 1,8] [--workloads W,...]",
               "Speculative decoding on the cpu device, greedy: decode tok/s and tokens per\n"
               "step for off, ngram and suffix on the same requests, side by side.");
  f.flag("model", "PATH", "llama2.c model (its tokenizer.bin beside it)",
         "models/stories15M/stories15M.bin")
      .flag("streams", "LIST", "concurrent streams, comma-separated", "1,8")
      .flag("workloads", "LIST", "fresh, again, echo (comma-separated)", "again,echo,fresh")
      .flag("max-tokens", "N", "tokens generated per request", "96")
      .flag("draft-tokens", "K", "draft tokens at most per step", "4")
      .flag("prompts", "N", "prompts (of the 20 built in)", "20")
      .flag("threads", "N", "BLAS threads", "1")
      .flag("repeat", "N", "runs per method, interleaved; medians printed", "3")
      .flag("row-cost", "C", "[speculative] row_cost the drafters size drafts with, or "
                             "\"measured\": the fit to this device's pass costs, as a decode "
                             "executor measures it when it opens", "measured")
      .flag("draft-model", "DIR", "EAGLE-3 head for --model (default: a synthesized one, "
                                  "random weights: its cost, not its acceptance)", "")
      .flag("seam", "", "instead: bytes per step across the Device seam, full logits vs argmax "
                        "rows, vocab 200,064, batch 64, k = --draft-tokens");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  auto max_tokens = f.get_int("max-tokens");
  auto k = f.get_int("draft-tokens");
  auto prompts_n = f.get_int("prompts");
  auto threads = f.get_int("threads");
  auto repeat = f.get_int("repeat");
  const bool row_cost_measured = f.get("row-cost") == "measured";
  auto row_cost_flag = row_cost_measured ? std::optional<double>(1.0) : f.get_double("row-cost");
  std::vector<uint32_t> streams = parse_list(f.get("streams"));
  std::vector<std::string> workloads;
  for (std::string w : {"fresh", "again", "echo"}) {
    if (("," + f.get("workloads") + ",").find("," + w + ",") != std::string::npos) {
      workloads.push_back(w);
    }
  }
  if (!max_tokens || *max_tokens < 1 || *max_tokens > 200 || !k || *k < 1 || *k > 16 ||
      !prompts_n || *prompts_n < 1 || *prompts_n > 20 || !threads || *threads < 1 ||
      !repeat || *repeat < 1 || *repeat > 50 || !row_cost_flag || !(*row_cost_flag > 0) ||
      *row_cost_flag > 4 || streams.empty() || workloads.empty()) {
    std::fprintf(stderr, "tandem bench spec-decode: --max-tokens 1..200, --draft-tokens 1..16, "
                         "--prompts 1..20, --threads >= 1, --repeat 1..50, --row-cost (0, 4], "
                         "--streams a list of 1..64, --workloads of fresh, again, echo\n");
    return 2;
  }
  if (f.has("seam")) return seam_bench(64, static_cast<uint32_t>(*k), 5);
  std::string model = f.get("model");
  std::string dir = model.substr(0, model.find_last_of('/') == std::string::npos
                                        ? 0
                                        : model.find_last_of('/'));
  auto codec = tools::load_text_codec(dir.empty() ? "." : dir);
  if (!codec.ok()) {
    std::fprintf(stderr, "tandem bench spec-decode: tokenizer: %s\n",
                 codec.error().describe().c_str());
    return 1;
  }
  auto weights = devices::cpu::load_model(model);
  if (!weights.ok()) {
    std::fprintf(stderr, "tandem bench spec-decode: model: %s\n", weights.error().describe().c_str());
    return 1;
  }
  const uint32_t max_model = weights->config.max_position;
  devices::cpu::CpuDeviceOptions options;
  options.block_tokens = 16;
  options.blocks_total = 64 * ((max_model + 15) / 16);
  options.threads = static_cast<uint32_t>(*threads);
  options.draft_model_path = f.get("draft-model");
  std::string synthesized;
  if (options.draft_model_path.empty()) {
    synthesized = "/tmp/tandem-spec-bench-eagle3-" + std::to_string(::getpid());
    if (Status st = tools::synth_eagle3(weights->config, {}, synthesized); !st.ok()) {
      std::fprintf(stderr, "tandem bench spec-decode: eagle3 head: %s\n",
                   st.error().describe().c_str());
      return 1;
    }
    options.draft_model_path = synthesized;
  }
  auto device = devices::cpu::make_cpu_device(std::move(*weights), options);
  if (!synthesized.empty()) std::filesystem::remove_all(synthesized);
  if (!device.ok()) {
    std::fprintf(stderr, "tandem bench spec-decode: device: %s\n", device.error().describe().c_str());
    return 1;
  }
  std::vector<Tokens> prompts;
  for (int64_t i = 0; i < *prompts_n; ++i) prompts.push_back((*codec)->encode(kPrompts[i]));
  const auto mt = static_cast<uint32_t>(*max_tokens);
  std::printf("spec-decode bench: %s, %zu prompts x %u tokens, k = %lld, greedy, cpu device "
              "(%lld BLAS threads)\n", model.c_str(), prompts.size(), mt,
              static_cast<long long>(*k), static_cast<long long>(*threads));
  // The device's cost of a decode pass of one sequence by rows (1 .. k + 1), thread CPU time
  // (BLAS on this thread), as an executor measures it when it opens (by wall time there).
  auto measured = devices::measure_pass_costs(**device, std::max<uint32_t>(2, uint32_t(*k) + 1),
                                              40, ~uint64_t{0}, 32, thread_seconds);
  if (!measured.ok()) {
    std::fprintf(stderr, "tandem bench spec-decode: timing passes: %s\n",
                 measured.error().describe().c_str());
    return 1;
  }
  const std::vector<double>& costs = measured->by_rows;
  const double row_cost = row_cost_measured ? measured->row_cost : *row_cost_flag;
  std::printf("decode pass of one sequence, cost by rows (x one row):");
  for (size_t r = 0; r < costs.size(); ++r) std::printf(" %zu: %.2f", r + 1, costs[r]);
  std::printf("; row_cost fitted: %.3f (the drafters use %.3f%s)\n", measured->row_cost,
              row_cost, row_cost_measured ? ", measured" : ", given");
  std::printf("one more row in a pass of b sequences, x the pass's cost per sequence:");
  for (const auto& [b, c] : measured->by_batch) std::printf(" %u: %.3f", b, c);
  std::printf(" (%s)\n", row_cost_measured ? "the drafters use these"
                                            : "not used: --row-cost given");
  const std::vector<std::pair<uint32_t, double>> batch_costs =
      row_cost_measured ? measured->by_batch : std::vector<std::pair<uint32_t, double>>{};
  std::printf("%-7s %-8s %-7s %9s %8s %9s %8s %9s %11s %9s %s\n", "streams", "workload",
              "method", "tok/s", "x off", "cpu tok/s", "x off", "tok/step", "acc/drafted",
              "drafted", "text");
  int mismatches = 0;
  const auto repeats = static_cast<uint32_t>(*repeat);
  const SpecMethod methods[] = {SpecMethod::none, SpecMethod::ngram, SpecMethod::suffix,
                                SpecMethod::eagle3};
  std::printf("eagle3: %s head (off, ngram and suffix run on the same device: its decode passes "
              "keep the head's target states for all)\n",
              f.get("draft-model").empty() ? "a synthesized (random)" : f.get("draft-model").c_str());
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (uint32_t n : streams) {
    for (const std::string& w : workloads) {
      // Each method `repeats` times, interleaved (off, ngram, suffix, off, ...): the
      // machine's drift hits them alike; medians are printed.
      std::map<SpecMethod, std::vector<double>> wall, cpu;
      std::map<SpecMethod, Totals> last;
      for (uint32_t rep = 0; rep < repeats; ++rep) {
        for (SpecMethod m : methods) {
          Engine engine(**device, m, static_cast<uint32_t>(*k), max_model, row_cost, batch_costs);
          std::vector<Tokens> timed = prompts;
          if (w != "fresh") {
            auto first = engine.run(prompts, n, mt);  // untimed: the first ask
            if (!first.ok()) {
              std::fprintf(stderr, "engine: %s\n", first.error().describe().c_str());
              return 1;
            }
            if (w == "echo") {
              for (size_t i = 0; i < prompts.size(); ++i) {
                Tokens p = prompts[i];
                p.insert(p.end(), first->outputs[i].begin(), first->outputs[i].end());
                Tokens again = (*codec)->encode(std::string("\n") + kPrompts[i]);
                p.insert(p.end(), again.begin() + 1, again.end());  // without its BOS
                if (p.size() + mt >= max_model) p.resize(max_model - mt - 1);
                timed[i] = std::move(p);
              }
            }
          }
          auto r = engine.run(timed, n, mt);
          if (!r.ok()) {
            std::fprintf(stderr, "engine: %s\n", r.error().describe().c_str());
            return 1;
          }
          wall[m].push_back(double(r->generated) / std::max(r->seconds, 1e-9));
          cpu[m].push_back(double(r->generated) / std::max(r->cpu_seconds, 1e-9));
          last[m] = std::move(r).value();
        }
      }
      const double off_wall = median(wall[SpecMethod::none]);
      const double off_cpu = median(cpu[SpecMethod::none]);
      for (SpecMethod m : methods) {
        const Totals& r = last[m];
        bool same = m == SpecMethod::none || r.outputs == last[SpecMethod::none].outputs;
        mismatches += same ? 0 : 1;
        const auto& c = r.counters;
        std::printf("%-7u %-8s %-7s %9.1f %8.2f %9.1f %8.2f %9.2f %11.2f %9llu %s\n", n,
                    w.c_str(), m == SpecMethod::none ? "off" : std::string(decode::to_string(m)).c_str(),
                    median(wall[m]), median(wall[m]) / off_wall, median(cpu[m]),
                    median(cpu[m]) / off_cpu,
                    double(r.generated) / double(std::max<uint64_t>(r.seq_steps, 1)),
                    c.spec_drafts_count == 0
                        ? 0.0
                        : double(c.spec_accepted_tokens_count) / double(c.spec_drafts_count),
                    static_cast<unsigned long long>(c.spec_drafts_count),
                    same ? "identical" : "DIFFERS");
        if (m == SpecMethod::eagle3) {
          std::printf("%-7s %-8s %-7s draft model: %.1f%% of the run's thread time\n", "", "",
                      "", 100.0 * r.draft_seconds / std::max(r.cpu_seconds, 1e-9));
        }
        std::fflush(stdout);
      }
    }
  }
  if (mismatches > 0) {
    std::fprintf(stderr, "tandem bench spec-decode: %d runs' text differs from off\n", mismatches);
    return 1;
  }
  return 0;
}

}  // namespace tandem::bench
