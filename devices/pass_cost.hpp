// tandem/devices: what one more row of a decode pass costs on this device, measured (issue 39).
// Speculative decoding sizes its drafts by it (actors/decode/drafter.hpp row_cost): a draft
// of k tokens rides in a pass of k + 1 rows, worth sending only when the tokens it is expected
// to yield outweigh what the rows cost. That cost is the host's or the accelerator's, not a
// constant: 0.35 on one Intel host here, 0.07 measured on an AMD EPYC, far less on an NPU
// whose one-token pass is memory-bound. So a decode executor measures it when it opens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices {

struct PassCosts {
  std::vector<double> by_rows;  // [r - 1]: a pass of r rows, in one-row passes (by_rows[0] = 1)
  double row_cost = 0;          // fit_row_cost(by_rows)
  // (b, m): in a pass of b sequences, one more row costs m of the pass's cost per sequence:
  // m = (C(b, k + 1) - C(b, 1)) / (k C(b, 1)), C(b, r) a pass of b sequences of r rows each
  // (k = rows_max - 1). b = 1, 2, 4, 8, 16, 32 up to batch_max and what the pool holds.
  // decode::SpecConfig::batch_row_costs.
  std::vector<std::pair<uint32_t, double>> by_batch;
};

// The least-squares slope of cost(r) = 1 + row_cost (r - 1) through by_rows, clamped to
// [row_cost_min, row_cost_max]. Precondition (asserted): by_rows.size() >= 2.
inline constexpr double row_cost_min = 0.01;
inline constexpr double row_cost_max = 4.0;
double fit_row_cost(std::span<const double> by_rows);

// Times decode passes of one sequence of `rows` rows, rows = 1 .. rows_max (>= 2), after a
// 64-token context: the median of `runs` passes each (after 3 untimed ones; the shapes take
// turns, so drift falls on all alike, and each timed pass follows an untimed one of its
// shape), by `now_seconds` (wall time by default). It writes KV into the pool's first blocks: call it before the pool holds anything
// (an executor, when its device opens), with a sequence id no caller uses (`seq_id`).
// Then the same for batches (by_batch), sequence ids seq_id, seq_id - 1, ...
Result<PassCosts> measure_pass_costs(Device& device, uint32_t rows_max, uint32_t runs,
                                     uint64_t seq_id, uint32_t batch_max = 1,
                                     const std::function<double()>& now_seconds = {});

}  // namespace tandem::devices
