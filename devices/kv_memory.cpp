#include "devices/kv_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "devices/sim/sim_model.hpp"

namespace tandem::devices {

Result<uint64_t> kv_pool_host_bytes(const DeviceSpec& spec) {
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

std::optional<std::string> check_kv_pools_fit(const std::string& node,
                                              std::span<const KvPoolUse> pools,
                                              uint64_t memory_bytes) {
  uint64_t total = 0;
  for (const KvPoolUse& pool : pools) total += pool.bytes;
  uint64_t budget = kv_pool_budget_bytes(memory_bytes);
  RT_ASSERT(budget <= memory_bytes, "budget within memory");
  if (memory_bytes == 0 || total <= budget) return std::nullopt;
  std::string out = "node '" + node + "': its KV pools need " + describe_bytes(total) +
                    ", more than this host's memory allows: " + describe_bytes(memory_bytes) +
                    " physical, of which " + describe_bytes(budget) +
                    " for KV pools (the rest is kept for the process and the system). Pools:";
  for (const KvPoolUse& pool : pools) {
    if (pool.bytes == 0) continue;
    out += "\n  executor '" + pool.executor + "': kv_blocks " + std::to_string(pool.kv_blocks) +
           " x model.block_tokens " + std::to_string(pool.block_tokens) + " = " +
           describe_bytes(pool.bytes);
  }
  out += "\nShrink them: the executors' kv_blocks, [sim] kv_scale (or an executor's sim = "
         "{ kv_scale = ... }; KV row bytes = kv_bytes_per_token x kv_scale), or "
         "model.block_tokens; or run fewer executors on this node.";
  RT_ASSERT(total > budget, "reported only when over budget");
  return out;
}

}  // namespace tandem::devices
