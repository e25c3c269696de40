#include "bench/device_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "devices/cpu/cpu_device.hpp"
#include "tools/model_synth.hpp"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  RT_ASSERT(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

struct Bandwidth {
  double copy_bytes_per_s = 0;  // memcpy, read + write bytes counted
  double read_bytes_per_s = 0;  // `threads` threads summing disjoint slices (what decode does)
  double bound() const { return std::max(copy_bytes_per_s, read_bytes_per_s); }
};

// Best of 3 over buffers far larger than the caches (256 MiB each).
Bandwidth measure_bandwidth(uint32_t threads) {
  RT_ASSERT(threads >= 1, "threads", threads);
  const size_t n = size_t{64} << 20;
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  Bandwidth bw;
  std::vector<double> sums(threads);
  for (int rep = 0; rep < 3; ++rep) {
    auto t = Clock::now();
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    bw.copy_bytes_per_s = std::max(bw.copy_bytes_per_s, 2.0 * double(n * 4) / seconds_since(t));
    a[rep] = b[n - 1 - rep];  // keep the copies observable
    t = Clock::now();
    std::vector<std::thread> pool;
    for (uint32_t i = 0; i < threads; ++i) {
      pool.emplace_back([&b, &sums, i, threads, n] {
        size_t begin = n / threads * i, end = i + 1 == threads ? n : n / threads * (i + 1);
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t j = begin; j + 3 < end; j += 4) {
          s0 += b[j];
          s1 += b[j + 1];
          s2 += b[j + 2];
          s3 += b[j + 3];
        }
        sums[i] = double(s0 + s1 + s2 + s3);
      });
    }
    for (auto& th : pool) th.join();
    bw.read_bytes_per_s = std::max(bw.read_bytes_per_s, double(n * 4) / seconds_since(t));
  }
  double total = 0;
  for (double s : sums) total += s;
  RT_ASSERT(total > 0.0, "read stream summed nothing");
  return bw;
}

uint64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      uint64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

struct Row {
  double prefill_tok_s = 0, decode_tok_s = 0;
};

Row measure(devices::Device& dev, uint32_t batch, uint32_t prompt_tokens, uint32_t steps) {
  uint32_t bt = dev.kv_layout().block_tokens;
  uint32_t per_seq = (prompt_tokens + steps + bt - 1) / bt;
  RT_ASSERT(uint64_t{per_seq} * batch <= dev.kv_layout().blocks_total, "bench pool too small");
  int32_t vocab = int32_t(dev.model_config().vocab_size);
  std::vector<devices::PrefillSeq> pre;
  for (uint32_t i = 0; i < batch; ++i) {
    devices::PrefillSeq s{i, {}, 0, std::vector<int32_t>(prompt_tokens, 0)};
    for (uint32_t j = 0; j < prompt_tokens; ++j) {
      s.tokens[j] = int32_t(1 + (i * 7 + j * 13) % uint32_t(std::min(vocab - 1, 500)));
    }
    for (uint32_t b = 0; b < per_seq; ++b) s.block_table.push_back(i * per_seq + b);
    pre.push_back(std::move(s));
  }
  auto t = Clock::now();
  RT_ASSERT(dev.prefill(pre).ok(), "bench prefill");
  double prefill_s = seconds_since(t);
  std::vector<devices::DecodeSeq> dec;
  for (const auto& s : pre) dec.push_back({s.seq_id, s.block_table, prompt_tokens, {5}});
  t = Clock::now();
  for (uint32_t k = 0; k < steps; ++k) {
    RT_ASSERT(dev.decode(dec).ok(), "bench decode");
    for (auto& d : dec) ++d.start_pos;
  }
  double decode_s = seconds_since(t);
  return {batch * prompt_tokens / prefill_s, double(batch) * steps / decode_s};
}

constexpr uint32_t batches[] = {1, 8, 32};
constexpr uint32_t prompt_tokens = 64, steps = 32, batch_max = 32, block_tokens = 16;

// Loads `path`, prints its table (median of `repeat` runs per cell). Returns an exit code.
int bench_model(const std::string& label, const std::string& path, uint32_t threads,
                uint32_t repeat, const Bandwidth& bw) {
  auto weights = devices::cpu::load_model(path);
  if (!weights) {
    std::fprintf(stderr, "bench device: %s\n", weights.error().describe().c_str());
    return 1;
  }
  uint32_t per_seq = (prompt_tokens + steps + block_tokens - 1) / block_tokens;
  devices::cpu::CpuDeviceOptions opt{block_tokens, per_seq * batch_max, 0, threads};
  auto dev = devices::cpu::make_cpu_device(std::move(*weights), opt);
  if (!dev) {
    std::fprintf(stderr, "bench device: %s\n", dev.error().describe().c_str());
    return 1;
  }
  const devices::ModelConfig& c = (*dev)->model_config();
  uint64_t step_bytes = devices::cpu::weight_bytes_per_token(**dev);
  double bound_tok_s = bw.bound() / double(step_bytes);
  std::printf("\n== %s (%s, %u layers, hidden %u, vocab %u", label.c_str(),
              std::string(devices::to_string(c.arch)).c_str(), c.layers, c.hidden, c.vocab_size);
  if (c.experts > 0) std::printf(", %u experts, top %u", c.experts, c.experts_per_token);
  std::printf(")\nweights read per decode step: %.1f MB; batch-1 bound: %.1f tok/s\n",
              double(step_bytes) / 1e6, bound_tok_s);
  std::printf("| batch | prefill tok/s | decode tok/s | decode / bound |\n");
  std::printf("| ---: | ---: | ---: | ---: |\n");
  for (uint32_t batch : batches) {
    std::vector<double> pre, dec;
    for (uint32_t r = 0; r < repeat; ++r) {
      Row row = measure(**dev, batch, prompt_tokens, batch == 1 ? steps : steps / 2);
      pre.push_back(row.prefill_tok_s);
      dec.push_back(row.decode_tok_s);
    }
    double d = median(dec);
    std::printf("| %u | %.1f | %.1f | %.0f%%%s |\n", batch, median(pre), d,
                100.0 * d / bound_tok_s, batch == 1 ? "" : " (of the batch-1 bound)");
  }
  std::printf("memory: KV pool %.1f MB; process RSS %.1f MB (mapped weights + pool + scratch)\n",
              double((*dev)->kv_layout().pool_bytes()) / 1e6, double(rss_bytes()) / 1e6);
  return 0;
}

// The MoE model the bench synthesizes: ~200 MB of f32 weights, ~52 MB read per decode step.
tools::SynthOptions bench_moe_options() {
  tools::SynthOptions o;
  o.arch = devices::Arch::minimax_m2;
  o.layers = 4;
  o.hidden = 512;
  o.heads = 8;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.ffn = 512;
  o.experts = 16;
  o.experts_per_token = 2;
  o.vocab = 8192;
  o.max_position = 512;
  o.seed = 1;
  return o;
}

}  // namespace

int run_device_bench(cli::Args args) {
  cli::Flags flags("tandem bench device [--model PATH] [--no-moe]",
                   "cpu Device prefill/decode tok/s at batch 1, 8, 32 for a model and a "
                   "synthesized MoE model, beside the decode memory-bandwidth bound.");
  flags.flag("model", "PATH", "model", "models/stories15M/stories15M.bin")
      .flag("no-moe", "", "skip the synthesized MiniMax-M2-style MoE model")
      .flag("repeat", "N", "runs per cell; the median is printed", "3")
      .flag("threads", "N", "compute threads (0 = all cores)", "0");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  auto threads = flags.get_int("threads"), repeat = flags.get_int("repeat");
  if (!threads || !repeat) return 2;
  if (*threads < 0 || *repeat < 1 || *repeat > 99) {
    std::fprintf(stderr, "bench device: --threads must be >= 0, --repeat in [1, 99]\n");
    return 2;
  }
  uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  uint32_t stream_threads = *threads > 0 ? uint32_t(*threads) : cores;
  Bandwidth bw = measure_bandwidth(stream_threads);
  std::printf("machine: %u cores; stream copy %.2f GB/s, read (%u threads) %.2f GB/s; "
              "bound uses the larger\n",
              cores, bw.copy_bytes_per_s / 1e9, stream_threads, bw.read_bytes_per_s / 1e9);
  std::printf("prompt %u tokens, decode %u steps (batch 1; %u at batch 8/32), block %u tokens, "
              "median of %lld runs\n",
              prompt_tokens, steps, steps / 2, block_tokens, static_cast<long long>(*repeat));
  int rc = bench_model("model " + flags.get("model"), flags.get("model"), uint32_t(*threads),
                       uint32_t(*repeat), bw);
  if (rc != 0 || flags.has("no-moe")) return rc;
  auto dir = std::filesystem::temp_directory_path() /
             ("tandem-bench-moe-" + std::to_string(::getpid()));
  if (auto st = tools::synth_model(bench_moe_options(), dir.string()); !st) {
    std::fprintf(stderr, "bench device: synth: %s\n", st.error().describe().c_str());
    return 1;
  }
  rc = bench_model("synth MoE (tandem model synth --arch minimax-m2 --layers 4 --hidden 512 "
                   "--heads 8 --kv-heads 2 --head-dim 64 --ffn 512 --experts 16 "
                   "--experts-per-token 2 --vocab 8192 --max-position 512 --seed 1)",
                   dir.string(), uint32_t(*threads), uint32_t(*repeat), bw);
  std::filesystem::remove_all(dir);
  return rc;
}

}  // namespace tandem::bench
