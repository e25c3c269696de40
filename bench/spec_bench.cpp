#include "bench/spec_bench.hpp"

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "actors/decode/ngram_proposer.hpp"
#include "actors/decode/suffix_tree.hpp"
#include "bench/seconds_per_run.hpp"
#include "devices/sampling.hpp"

namespace tandem::bench {
namespace {

using Tokens = std::vector<int32_t>;
using Clock = std::chrono::steady_clock;

struct Request {
  Tokens prompt, output;
};

// `requests` requests over one `file_tokens`-token file: the prompt is an instruction and the
// file, the output the file rewritten with ~2% of its tokens edited (repetitive), or tokens
// unrelated to anything (fresh).
std::vector<Request> workload(bool repetitive, uint32_t requests, uint32_t file_tokens,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % 32000); };
  Tokens file(file_tokens);
  for (int32_t& t : file) t = token();
  std::vector<Request> out;
  for (uint32_t r = 0; r < requests; ++r) {
    Request q;
    for (int i = 0; i < 64; ++i) q.prompt.push_back(token());  // the instruction
    q.prompt.insert(q.prompt.end(), file.begin(), file.end());
    for (uint32_t i = 0; i < file_tokens; ++i) {
      if (!repetitive) {
        q.output.push_back(token());
      } else if (rng() % 100 < 2) {
        q.output.push_back(token());  // an edit: replaced
        if (rng() % 2) q.output.push_back(token());  // or grown
      } else {
        q.output.push_back(file[i]);
      }
    }
    out.push_back(std::move(q));
  }
  return out;
}

struct Replay {
  uint64_t steps = 0, accepted = 0, tokens = 0;
  double seconds = 0;  // in the proposer: appends and proposals
};

// One method over the requests: propose(k) then append(accepted + the next true token).
template <typename Make, typename Done>
Replay replay(const std::vector<Request>& requests, uint32_t k, Make make, Done done) {
  Replay r;
  for (const Request& q : requests) {
    auto t0 = Clock::now();
    auto p = make();
    p.append(q.prompt);
    r.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t at = 0; at < q.output.size();) {
      auto s0 = Clock::now();
      Tokens draft = [&] {
        if constexpr (requires { p.propose(k).tokens; }) return p.propose(k).tokens;
        else return p.propose(k);
      }();
      uint32_t ok = 0;
      while (ok < draft.size() && at + ok < q.output.size() && draft[ok] == q.output[at + ok]) ++ok;
      const size_t step = std::min<size_t>(q.output.size() - at, ok + 1);
      p.append(std::span(q.output).subspan(at, step));
      r.seconds += std::chrono::duration<double>(Clock::now() - s0).count();
      ++r.steps;
      r.accepted += ok;
      r.tokens += step;
      at += step;
    }
    done(q.output);
  }
  return r;
}

double sample_seconds(uint32_t vocab, double seconds_min) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> row(vocab);
  for (float& x : row) x = normal(rng);
  devices::Sampler sampler(devices::SamplingParams{});
  return seconds_per_run(seconds_min, [&] {
    if (!sampler.sample(row, {}).ok()) std::abort();
  });
}

}  // namespace

int run_spec_bench(cli::Args args) {
  cli::Flags f("tandem bench spec [--requests N] [--file-tokens N] [--draft-tokens K]",
               "The speculative proposers offline on a repetitive and a fresh workload: mean\n"
               "accepted tokens per step (greedy against the true continuation), and the\n"
               "proposer's CPU time per step beside one sample over a 200,064-token row.");
  f.flag("requests", "N", "requests per workload (sharing one file)", "8")
      .flag("file-tokens", "N", "tokens of the file each request rewrites", "4000")
      .flag("draft-tokens", "K", "draft tokens per step", "4")
      .flag("seed", "S", "workload seed", "1");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  auto requests = f.get_int("requests");
  auto file_tokens = f.get_int("file-tokens");
  auto k = f.get_int("draft-tokens");
  auto seed = f.get_int("seed");
  if (!requests || *requests < 1 || *requests > 10000 || !file_tokens || *file_tokens < 1 ||
      *file_tokens > 1000000 || !k || *k < 1 || *k > 16 || !seed || *seed < 0) {
    std::fprintf(stderr, "tandem bench spec: --requests 1..10000, --file-tokens 1..1000000, "
                         "--draft-tokens 1..16, --seed >= 0\n");
    return 2;
  }
  const double sample_s = sample_seconds(200064, 0.5);
  std::printf("spec bench: %lld requests x %lld file tokens, k = %lld; baseline: one sample of "
              "a 200064-token row = %.1f us\n",
              static_cast<long long>(*requests), static_cast<long long>(*file_tokens),
              static_cast<long long>(*k), sample_s * 1e6);
  std::printf("%-11s %-7s %8s %10s %10s %12s %14s\n", "workload", "method", "steps",
              "accepted", "tok/step", "us/step", "step/sample");
  for (bool repetitive : {true, false}) {
    auto reqs = workload(repetitive, static_cast<uint32_t>(*requests),
                         static_cast<uint32_t>(*file_tokens), static_cast<uint64_t>(*seed));
    const auto kk = static_cast<uint32_t>(*k);
    decode::SuffixConfig config;
    decode::SuffixCache cache(config);
    Replay ngram = replay(reqs, kk, [] { return decode::NgramProposer(decode::NgramConfig{}); },
                          [](const Tokens&) {});
    Replay suffix = replay(
        reqs, kk, [&] { return decode::SuffixProposer(config, &cache); },
        [&](const Tokens& out) { cache.add(out); });
    for (auto [name, r] : {std::pair{"ngram", ngram}, std::pair{"suffix", suffix}}) {
      const double per_step = r.seconds / static_cast<double>(r.steps);
      std::printf("%-11s %-7s %8llu %10.3f %10.3f %12.2f %14.3f\n",
                  repetitive ? "repetitive" : "fresh", name,
                  static_cast<unsigned long long>(r.steps),
                  static_cast<double>(r.accepted) / static_cast<double>(r.steps),
                  static_cast<double>(r.tokens) / static_cast<double>(r.steps), per_step * 1e6,
                  per_step / sample_s);
    }
  }
  return 0;
}

}  // namespace tandem::bench
