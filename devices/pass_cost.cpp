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

namespace {

double median_of(std::vector<double>& t) {
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

}  // namespace

Result<PassCosts> measure_pass_costs(Device& device, uint32_t rows_max, uint32_t runs,
                                     uint64_t seq_id, uint32_t batch_max,
                                     const std::function<double()>& now_seconds) {
  RT_ASSERT(rows_max >= 2 && runs >= 1, rows_max, runs);
  auto now = now_seconds ? now_seconds : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  constexpr uint32_t context_tokens = 64;
  const KvLayout& layout = device.kv_layout();
  const uint32_t bt = layout.block_tokens;
  const uint32_t blocks = (context_tokens + rows_max + bt - 1) / bt;  // per sequence
  if (blocks > layout.blocks_total) {
    return make_error(ErrorKind::invalid, "the KV pool (" + std::to_string(layout.blocks_total) +
                                              " blocks) is too small to time a pass");
  }
  // The batch sizes timed: powers of two up to batch_max and what the pool holds.
  std::vector<uint32_t> sizes;
  for (uint32_t b = 1; b <= std::max<uint32_t>(batch_max, 1) && b <= 32 &&
                       uint64_t(b) * blocks <= layout.blocks_total;
       b *= 2) {
    sizes.push_back(b);
  }
  const uint32_t seqs = sizes.back();
  const uint32_t vocab = device.model_config().vocab_size;
  std::vector<int32_t> context(context_tokens);
  for (uint32_t i = 0; i < context_tokens; ++i) {
    context[i] = static_cast<int32_t>((1 + i * 7) % std::max<uint32_t>(vocab, 2));
  }
  // Sequence j: id seq_id - j, blocks [j * blocks, (j + 1) * blocks), the same context.
  std::vector<std::vector<uint32_t>> tables(seqs);
  std::vector<PrefillSeq> fill;
  for (uint32_t j = 0; j < seqs; ++j) {
    for (uint32_t b = 0; b < blocks; ++b) tables[j].push_back(j * blocks + b);
    fill.push_back({seq_id - j, tables[j], 0, context, {}});
  }
  if (auto filled = device.prefill(fill); !filled.ok()) return filled.error();
  // A pass of `batch` sequences of `rows` rows each, timed, after an untimed one of the same
  // shape: a pass right after a larger one would pay for its cache misses.
  auto pass = [&](uint32_t batch, uint32_t rows, uint32_t i) -> Result<double> {
    std::vector<DecodeSeq> step;
    for (uint32_t j = 0; j < batch; ++j) {
      std::vector<int32_t> fed(rows, context[(i + j) % context_tokens]);
      step.push_back({seq_id - j, tables[j], context_tokens, std::move(fed), true});
    }
    if (auto warm = device.decode(step); !warm.ok()) return warm.error();
    const double start = now();
    auto out = device.decode(step);
    const double took = now() - start;
    if (!out.ok()) return out.error();
    return took;
  };
  // Warm passes first (caches, first touches of the weights); then one sequence's row counts
  // in turn, `runs` rounds, so that drift (another tenant, a clock change) falls on all of
  // them alike; then the batches the same way. Apart: a pass of one sequence timed among
  // passes of 32 measured up to 30% dearer than one of two rows (the cpu device here).
  for (uint32_t i = 0; i < 3; ++i) {
    if (auto warm = pass(1, rows_max, i); !warm.ok()) return warm.error();
  }
  std::vector<std::vector<double>> by_rows(rows_max), one_row(sizes.size()), all_rows(sizes.size());
  for (uint32_t i = 0; i < runs; ++i) {
    for (uint32_t r = 1; r <= rows_max; ++r) {
      auto took = pass(1, r, i);
      if (!took.ok()) return took.error();
      by_rows[r - 1].push_back(*took);
    }
  }
  for (uint32_t i = 0; i < runs; ++i) {
    for (size_t s = 1; s < sizes.size(); ++s) {  // b = 1 is by_rows' first and last
      for (uint32_t r : {1u, rows_max}) {
        auto took = pass(sizes[s], r, i);
        if (!took.ok()) return took.error();
        (r == 1 ? one_row : all_rows)[s].push_back(*took);
      }
    }
  }
  PassCosts out;
  std::vector<double> median(rows_max);
  for (uint32_t r = 0; r < rows_max; ++r) median[r] = median_of(by_rows[r]);
  if (!(median[0] > 0)) {
    return make_error(ErrorKind::failed, "a one-row decode pass took no measurable time");
  }
  for (double m : median) out.by_rows.push_back(m / median[0]);
  out.row_cost = fit_row_cost(out.by_rows);
  const double k = rows_max - 1;
  auto marginal = [k](double one, double all) {
    return std::clamp((all - one) / (k * one), row_cost_min, row_cost_max);
  };
  out.by_batch.emplace_back(1, marginal(median.front(), median.back()));
  for (size_t s = 1; s < sizes.size(); ++s) {
    const double one = median_of(one_row[s]);
    if (!(one > 0)) return make_error(ErrorKind::failed, "a decode pass took no measurable time");
    out.by_batch.emplace_back(sizes[s], marginal(one, median_of(all_rows[s])));
  }
  return out;
}

}  // namespace tandem::devices
