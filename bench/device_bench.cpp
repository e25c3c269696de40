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

// 32 bytes, 32-aligned: the read stream's unit (std::vector uses aligned new for it).
struct alignas(32) Chunk {
  uint64_t words[4];
};

double median(std::vector<double> v) {
  RT_ASSERT(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

using U64x4 = uint64_t __attribute__((vector_size(32)));

// XOR of words[begin, end) (end - begin a multiple of 16), 256 bits at a time: a read stream
// the core can issue at full rate. Scalar fallback on CPUs without AVX2.
__attribute__((target("avx2"))) uint64_t xor_avx2(const uint64_t* words, size_t count) {
  const U64x4* p = reinterpret_cast<const U64x4*>(words);
  U64x4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (size_t j = 0; j + 4 <= count / 4; j += 4) {
    a0 ^= p[j];
    a1 ^= p[j + 1];
    a2 ^= p[j + 2];
    a3 ^= p[j + 3];
  }
  U64x4 x = a0 ^ a1 ^ a2 ^ a3;
  return x[0] ^ x[1] ^ x[2] ^ x[3];
}

uint64_t xor_words(const uint64_t* words, size_t count) {
  RT_ASSERT(count % 16 == 0, "xor_words count", count);
  RT_ASSERT(reinterpret_cast<uintptr_t>(words) % 32 == 0, "xor_words alignment");
  if (__builtin_cpu_supports("avx2")) return xor_avx2(words, count);
  uint64_t acc[8] = {};
  for (size_t j = 0; j + 8 <= count; j += 8) {
    for (int u = 0; u < 8; ++u) acc[u] ^= words[j + u];
  }
  uint64_t x = 0;
  for (uint64_t a : acc) x ^= a;
  return x;
}

// Read bandwidth: `threads` threads XOR-reduce disjoint slices of `words` (a pure read
// stream, what a weight sweep is). Best of `reps` passes.
double read_bytes_per_s(const std::vector<Chunk>& chunks, uint32_t threads, int reps) {
  RT_ASSERT(threads >= 1 && reps >= 1, "read stream", threads, reps);
  RT_ASSERT(chunks.size() % (size_t{threads} * 4) == 0, "read stream buffer size");
  const uint64_t* words = chunks[0].words;
  size_t words_count = chunks.size() * 4;
  std::vector<uint64_t> sums(threads);
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    auto t = Clock::now();
    std::vector<std::thread> pool;
    size_t slice = words_count / threads;
    for (uint32_t i = 0; i < threads; ++i) {
      pool.emplace_back([words, &sums, i, slice] {
        sums[i] = xor_words(words + slice * i, slice);
      });
    }
    for (auto& th : pool) th.join();
    best = std::max(best, double(words_count * 8) / seconds_since(t));
  }
  uint64_t all = 0;
  for (uint64_t x : sums) all ^= x;
  RT_ASSERT(all != 1, "keeps the reduction observable");
  return best;
}

struct Bandwidth {
  double read_bytes_per_s = 0;  // 256 MiB pure read (a weight sweep's pattern): the better of
                                // 1 thread and all cores
  double copy_bytes_per_s = 0;  // memcpy 128 MiB, read + write bytes counted (STREAM "copy")
};

// DRAM stream bandwidth over buffers larger than any cache a step could keep the weights in.
// Best of 2 each; ~0.5 s. Taken right before each measured batch-1 decode run, so both see
// the same machine load.
Bandwidth measure_bandwidth(uint32_t cores) {
  Bandwidth bw;
  {
    const size_t n = size_t{128} << 20;
    std::vector<std::byte> a(n, std::byte{1}), b(n, std::byte{0});
    for (int rep = 0; rep < 2; ++rep) {
      auto t = Clock::now();
      std::memcpy(b.data(), a.data(), n);
      bw.copy_bytes_per_s = std::max(bw.copy_bytes_per_s, 2.0 * double(n) / seconds_since(t));
      a[size_t(rep)] = b[n - 1 - size_t(rep)];  // keep the copies observable
    }
  }
  // ~256 MiB, a multiple of 4 chunks (16 words) per thread
  size_t count = (size_t{8} << 20) / (size_t{4} * cores) * (size_t{4} * cores);
  std::vector<Chunk> chunks(count, Chunk{{1, 2, 3, 4}});
  bw.read_bytes_per_s =
      std::max(read_bytes_per_s(chunks, 1, 2), read_bytes_per_s(chunks, cores, 2));
  RT_ASSERT(bw.read_bytes_per_s > 0 && bw.copy_bytes_per_s > 0, "bandwidths measured");
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

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
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

struct BoundRatios {
  std::vector<double> read_bw, copy_bw, vs_read, vs_copy;  // one entry per batch-1 run
};

// Prints the table rows (median of `repeat` runs per cell); fills `ratios` at batch 1.
void bench_rows(devices::Device& dev, uint32_t repeat, uint32_t cores, BoundRatios* ratios) {
  double step_bytes = double(devices::cpu::weight_bytes_per_token(dev));
  RT_ASSERT(step_bytes > 0, "weights per step");
  for (uint32_t batch : batches) {
    std::vector<double> pre, dec;
    for (uint32_t r = 0; r < repeat; ++r) {
      Bandwidth bw;
      if (batch == 1) bw = measure_bandwidth(cores);
      Row row = measure(dev, batch, prompt_tokens, batch == 1 ? steps : steps / 2);
      pre.push_back(row.prefill_tok_s);
      dec.push_back(row.decode_tok_s);
      if (batch != 1) continue;
      ratios->read_bw.push_back(bw.read_bytes_per_s);
      ratios->copy_bw.push_back(bw.copy_bytes_per_s);
      ratios->vs_read.push_back(row.decode_tok_s / (bw.read_bytes_per_s / step_bytes));
      ratios->vs_copy.push_back(row.decode_tok_s / (bw.copy_bytes_per_s / step_bytes));
    }
    std::printf("| %u | %.1f | %.1f |\n", batch, median(pre), median(dec));
  }
}

// Loads `path`, prints its table and its bound. Returns an exit code.
int bench_model(const std::string& label, const std::string& path,
                devices::cpu::CpuDeviceOptions opt, uint32_t cores, uint32_t repeat) {
  auto weights = devices::cpu::load_model(path);
  if (!weights) {
    std::fprintf(stderr, "bench device: %s\n", weights.error().describe().c_str());
    return 1;
  }
  uint32_t per_seq = (prompt_tokens + steps + block_tokens - 1) / block_tokens;
  opt.block_tokens = block_tokens;
  opt.blocks_total = per_seq * batch_max;
  auto dev = devices::cpu::make_cpu_device(std::move(*weights), opt);
  if (!dev) {
    std::fprintf(stderr, "bench device: %s\n", dev.error().describe().c_str());
    return 1;
  }
  const devices::ModelConfig& c = (*dev)->model_config();
  uint64_t step_bytes = devices::cpu::weight_bytes_per_token(**dev);
  std::printf("\n== %s\n(%s, %u layers, hidden %u, vocab %u", label.c_str(),
              std::string(devices::to_string(c.arch)).c_str(), c.layers, c.hidden, c.vocab_size);
  if (c.experts > 0) std::printf(", %u experts, top %u", c.experts, c.experts_per_token);
  std::printf("); weights read per decode step: %.1f MB\n\n", double(step_bytes) / 1e6);
  std::printf("| batch | prefill tok/s | decode tok/s |\n| ---: | ---: | ---: |\n");
  BoundRatios r;
  bench_rows(**dev, repeat, cores, &r);
  double mb = double(step_bytes);
  std::printf("\nbatch-1 decode vs the bandwidth bound (weights per step / stream bandwidth "
              "measured right before each run; medians):\n");
  std::printf("  read stream (best of 1 and %u threads) %.2f GB/s -> bound %.1f tok/s; "
              "decode at %.0f%%\n",
              cores, median(r.read_bw) / 1e9, median(r.read_bw) / mb, 100.0 * median(r.vs_read));
  std::printf("  copy stream (memcpy, read+write counted) %.2f GB/s -> bound %.1f tok/s; "
              "decode at %.0f%%\n",
              median(r.copy_bw) / 1e9, median(r.copy_bw) / mb, 100.0 * median(r.vs_copy));
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
      .flag("threads", "N", "BLAS threads for multi-token passes (0 = all cores)", "0")
      .flag("single-token-threads", "N", "BLAS threads for one-token passes (0 = --threads)",
            "1");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  auto threads = flags.get_int("threads"), repeat = flags.get_int("repeat"),
       single = flags.get_int("single-token-threads");
  if (!threads || !repeat || !single) return 2;
  if (*threads < 0 || *single < 0 || *repeat < 1 || *repeat > 99) {
    std::fprintf(stderr, "bench device: --threads and --single-token-threads must be >= 0, "
                         "--repeat in [1, 99]\n");
    return 2;
  }
  uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf("%s\n", devices::cpu::select_blas_kernels().c_str());
  std::printf("machine: %u cores, load average %s (before the run)\n", cores,
              load_average().c_str());
  std::printf("prompt %u tokens, decode %u steps (batch 1; %u at batch 8/32), block %u tokens, "
              "median of %lld runs per cell; BLAS threads: %s for multi-token passes, %s for "
              "one-token passes\n",
              prompt_tokens, steps, steps / 2, block_tokens, static_cast<long long>(*repeat),
              *threads == 0 ? "all cores" : std::to_string(*threads).c_str(),
              *single == 0 ? "the same" : std::to_string(*single).c_str());
  devices::cpu::CpuDeviceOptions opt;
  opt.threads = uint32_t(*threads);
  opt.single_token_threads = uint32_t(*single);
  int rc = bench_model("model " + flags.get("model"), flags.get("model"), opt, cores,
                       uint32_t(*repeat));
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
                   dir.string(), opt, cores, uint32_t(*repeat));
  std::filesystem::remove_all(dir);
  return rc;
}

}  // namespace tandem::bench
