#include "devices/kv_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "devices/cpu/weights.hpp"
#include "devices/sim/sim_model.hpp"

namespace tandem::devices {

namespace {

// cpu: fp32 K and V of every layer and KV head, per token, from the model's shape alone
// (HF config.json, or the 7-int32 llama2.c header); no tensor is read.
Result<uint64_t> cpu_token_bytes(const std::string& model_path) {
  namespace fs = std::filesystem;
  uint64_t layers = 0, kv_heads = 0, head_dim = 0;
  std::error_code ignored;
  std::string checkpoint = model_path;
  if (fs::is_directory(model_path, ignored) && !fs::exists(fs::path(model_path) / "config.json")) {
    // A llama2.c directory (as the cpu loader reads it): its one .bin besides tokenizer.bin.
    for (const auto& entry : fs::directory_iterator(model_path, ignored)) {
      const fs::path& p = entry.path();
      if (p.extension() == ".bin" && p.filename() != "tokenizer.bin") checkpoint = p.string();
    }
  }
  if (fs::is_directory(checkpoint, ignored)) {
    std::ifstream in(fs::path(model_path) / "config.json", std::ios::binary);
    if (!in) return make_error(ErrorKind::not_found, model_path + "/config.json: cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    auto config = cpu::parse_hf_config(text.str(), model_path + "/config.json");
    if (!config) return config.error();
    layers = config->layers, kv_heads = config->kv_heads, head_dim = config->head_dim;
  } else {
    std::ifstream in(checkpoint, std::ios::binary);
    int32_t header[7] = {};
    if (!in.read(reinterpret_cast<char*>(header), sizeof header)) {
      return make_error(ErrorKind::not_found, checkpoint + ": cannot read a llama2.c header");
    }
    if (header[0] <= 0 || header[2] <= 0 || header[3] <= 0 || header[4] <= 0) {
      return make_error(ErrorKind::invalid, checkpoint + ": bad llama2.c header");
    }
    layers = uint64_t(header[2]), kv_heads = uint64_t(header[4]);
    head_dim = uint64_t(header[0]) / uint64_t(header[3]);
  }
  return layers * 2 * kv_heads * head_dim * sizeof(float);
}

}  // namespace

Result<uint64_t> kv_pool_host_bytes(const DeviceSpec& spec) {
  if (spec.kind == config::DeviceKind::cpu) {
    auto token_bytes = cpu_token_bytes(spec.model_path);
    if (!token_bytes) return token_bytes.error();
    return *token_bytes * spec.block_tokens * spec.blocks_total;
  }
  if (spec.kind != config::DeviceKind::sim) return uint64_t{0};
  auto params = sim::params_from_map(spec.sim);
  if (!params) return params.error();
  KvLayout layout = sim::sim_kv_layout(*params, spec.block_tokens, spec.blocks_total);
  RT_ASSERT(layout.block_bytes() > 0, "a sim block has bytes");
  return layout.pool_bytes();
}

uint64_t host_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_bytes);
}

uint64_t kv_pool_budget_bytes(uint64_t memory_bytes) {
  constexpr uint64_t margin_min_bytes = uint64_t{1} << 30;
  uint64_t margin = std::max(memory_bytes / 10, margin_min_bytes);
  return memory_bytes > margin ? memory_bytes - margin : 0;
}

std::string describe_bytes(uint64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f GiB (%llu bytes)",
                static_cast<double>(bytes) / double(uint64_t{1} << 30),
                static_cast<unsigned long long>(bytes));
  return text;
}

std::optional<std::string> check_kv_pools_fit(const std::string& who,
                                              std::span<const KvPoolUse> pools,
                                              uint64_t memory_bytes) {
  uint64_t total = 0;
  for (const KvPoolUse& pool : pools) total += pool.bytes;
  uint64_t budget = kv_pool_budget_bytes(memory_bytes);
  RT_ASSERT(budget <= memory_bytes, "budget within memory");
  if (memory_bytes == 0 || total <= budget) return std::nullopt;
  std::string out = who + ": its KV pools and buffers need " + describe_bytes(total) +
                    ", more than this host's memory allows: " + describe_bytes(memory_bytes) +
                    " physical, of which " + describe_bytes(budget) +
                    " for KV pools (the rest is kept for the process and the system). Pools:";
  for (const KvPoolUse& pool : pools) {
    if (pool.bytes == 0) continue;
    if (!pool.what.empty()) {
      out += "\n  " + pool.what + " = " + describe_bytes(pool.bytes);
      continue;
    }
    out += "\n  executor '" + pool.executor + "': kv_blocks " + std::to_string(pool.kv_blocks) +
           " x model.block_tokens " + std::to_string(pool.block_tokens) + " = " +
           describe_bytes(pool.bytes);
  }
  out += "\nShrink them: the executors' kv_blocks, [sim] kv_scale (or an executor's sim = "
         "{ kv_scale = ... }; KV row bytes = kv_bytes_per_token x kv_scale), or "
         "model.block_tokens; [fabric] recv_buffers or frame_bytes_max; [kv_offload] "
         "host_cache_bytes or staging_blocks; or run fewer executors on this host.";
  RT_ASSERT(total > budget, "reported only when over budget");
  return out;
}

}  // namespace tandem::devices
