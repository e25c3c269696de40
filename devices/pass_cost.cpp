#include "devices/pass_cost.hpp"

#include <algorithm>
#include <chrono>

#include "runtime/base/assert.hpp"

namespace tandem::devices {

double fit_row_cost(std::span<const double> by_rows) {
  RT_ASSERT(by_rows.size() >= 2, by_rows.size());
  // cost(r) - 1 = row_cost * (r - 1): the slope through the origin of (r - 1, cost - 1).
  double xy = 0, xx = 0;
  for (size_t i = 1; i < by_rows.size(); ++i) {
    const double x = static_cast<double>(i);
    xy += x * (by_rows[i] - 1.0);
    xx += x * x;
  }
  return std::clamp(xy / xx, row_cost_min, row_cost_max);
}

Result<PassCosts> measure_pass_costs(Device& device, uint32_t rows_max, uint32_t runs,
                                     uint64_t seq_id,
                                     const std::function<double()>& now_seconds) {
  RT_ASSERT(rows_max >= 2 && runs >= 1, rows_max, runs);
  auto now = now_seconds ? now_seconds : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  constexpr uint32_t context_tokens = 64;
  const KvLayout& layout = device.kv_layout();
  const uint32_t bt = layout.block_tokens;
  const uint32_t blocks = (context_tokens + rows_max + bt - 1) / bt;
  if (blocks > layout.blocks_total) {
    return make_error(ErrorKind::invalid, "the KV pool (" + std::to_string(layout.blocks_total) +
                                              " blocks) is too small to time a pass");
  }
  std::vector<uint32_t> table(blocks);
  for (uint32_t b = 0; b < blocks; ++b) table[b] = b;
  const uint32_t vocab = device.model_config().vocab_size;
  std::vector<int32_t> context(context_tokens);
  for (uint32_t i = 0; i < context_tokens; ++i) {
    context[i] = static_cast<int32_t>((1 + i * 7) % std::max<uint32_t>(vocab, 2));
  }
  auto filled = device.prefill(std::vector<PrefillSeq>{{seq_id, table, 0, context, {}}});
  if (!filled.ok()) return filled.error();
  // Warm passes first (caches, first touches of the weights), then the row counts in turn,
  // `runs` rounds, so that drift (another tenant, a clock change) falls on all of them alike.
  auto pass = [&](uint32_t rows, uint32_t i) -> Result<double> {
    std::vector<int32_t> fed(rows, context[i % context_tokens]);
    const double start = now();
    auto out = device.decode(std::vector<DecodeSeq>{{seq_id, table, context_tokens, fed, true}});
    const double took = now() - start;
    if (!out.ok()) return out.error();
    return took;
  };
  for (uint32_t i = 0; i < 3; ++i) {
    if (auto warm = pass(rows_max, i); !warm.ok()) return warm.error();
  }
  std::vector<std::vector<double>> times(rows_max);
  for (uint32_t i = 0; i < runs; ++i) {
    for (uint32_t r = 1; r <= rows_max; ++r) {
      auto took = pass(r, i);
      if (!took.ok()) return took.error();
      times[r - 1].push_back(*took);
    }
  }
  PassCosts out;
  std::vector<double> median(rows_max);
  for (uint32_t r = 0; r < rows_max; ++r) {
    auto& t = times[r];
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    median[r] = t[t.size() / 2];
  }
  if (!(median[0] > 0)) {
    return make_error(ErrorKind::failed, "a one-row decode pass took no measurable time");
  }
  for (double m : median) out.by_rows.push_back(m / median[0]);
  out.row_cost = fit_row_cost(out.by_rows);
  return out;
}

}  // namespace tandem::devices
