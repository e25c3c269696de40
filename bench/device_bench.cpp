#include "bench/device_bench.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "devices/cpu/cpu_device.hpp"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Best-of-3 copy bandwidth (read + write bytes) over buffers far larger than the caches.
double stream_bytes_per_s() {
  const size_t n = size_t{64} << 20;  // 64M floats = 256 MiB per buffer
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t = Clock::now();
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    best = std::max(best, 2.0 * double(n * sizeof(float)) / seconds_since(t));
    a[rep] = b[n - 1 - rep];  // keep the copies observable
  }
  return best;
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
  uint32_t batch;
  double prefill_tok_s, decode_tok_s;
};

Row measure(devices::Device& dev, uint32_t batch, uint32_t prompt_tokens, uint32_t steps) {
  uint32_t bt = dev.kv_layout().block_tokens;
  uint32_t per_seq = (prompt_tokens + steps + bt - 1) / bt;
  std::vector<devices::PrefillSeq> pre;
  for (uint32_t i = 0; i < batch; ++i) {
    devices::PrefillSeq s{i, {}, 0, std::vector<int32_t>(prompt_tokens, 0)};
    for (uint32_t j = 0; j < prompt_tokens; ++j) s.tokens[j] = int32_t(1 + (i * 7 + j * 13) % 500);
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
  return {batch, batch * prompt_tokens / prefill_s, double(batch) * steps / decode_s};
}

}  // namespace

int run_device_bench(cli::Args args) {
  cli::Flags flags("tandem bench device [--model PATH]",
                   "cpu Device throughput at batch 1, 8, 32 vs the decode bandwidth bound.");
  flags.flag("model", "PATH", "model (default models/stories15M/stories15M.bin)",
             "models/stories15M/stories15M.bin")
      .flag("threads", "N", "compute threads (0 = all cores)", "0");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  auto threads = flags.get_int("threads");
  if (!threads || *threads < 0) return 2;
  auto weights = devices::cpu::load_model(flags.get("model"));
  if (!weights) {
    std::fprintf(stderr, "bench device: %s\n", weights.error().describe().c_str());
    return 1;
  }
  const uint32_t prompt_tokens = 64, steps = 16, batch_max = 32;
  uint32_t bt = 16, per_seq = (prompt_tokens + steps + bt - 1) / bt;
  devices::cpu::CpuDeviceOptions opt{bt, per_seq * batch_max, 0, uint32_t(*threads)};
  auto dev = devices::cpu::make_cpu_device(std::move(*weights), opt);
  if (!dev) {
    std::fprintf(stderr, "bench device: %s\n", dev.error().describe().c_str());
    return 1;
  }
  double bw = stream_bytes_per_s();
  uint64_t step_bytes = devices::cpu::weight_bytes_per_token(**dev);
  std::printf("stream copy bandwidth: %.2f GB/s; weights per decode step: %.1f MB\n", bw / 1e9,
              double(step_bytes) / 1e6);
  std::printf("decode bound (batch 1): %.1f tok/s (bandwidth / weight bytes per step)\n",
              bw / double(step_bytes));
  std::printf("%6s %14s %14s %16s\n", "batch", "prefill tok/s", "decode tok/s", "bw bound tok/s");
  for (uint32_t batch : {1u, 8u, 32u}) {
    Row r = measure(**dev, batch, prompt_tokens, steps);
    std::printf("%6u %14.1f %14.1f %16.1f\n", r.batch, r.prefill_tok_s, r.decode_tok_s,
                batch * bw / double(step_bytes));
  }
  std::printf("KV pool: %.1f MB; process RSS: %.1f MB\n",
              double((*dev)->kv_layout().pool_bytes()) / 1e6, double(rss_bytes()) / 1e6);
  return 0;
}

}  // namespace tandem::bench
