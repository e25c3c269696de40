// `tandem bench sweep` (issue 5): the same seeded workload over several concurrencies and
// several configurations, into one table (text, JSON, CSV) and one SVG per metric with one
// series per configuration.
//
// This is the pure part: the driver over an abstract back-end, argument parsing, and the
// reports. The back-ends (in-process `tandem sim`, or real clusters driven through
// `tandem bench serve`) are in bench/sweep_cli.cpp. No I/O, clocks or threads here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/result.hpp"
#include "tools/workload/bench_metrics.hpp"

namespace tandem::bench {

struct SweepConfig {
  std::string name;  // [A-Za-z0-9_.-]+, unique in a sweep
  std::string spec;  // back-end specific: sim flags ("policy:prefix-aware,aggregated") or a
                     // manifest path
};

// One (configuration, concurrency) point.
struct SweepRow {
  std::string config;
  uint32_t concurrency = 0;
  uint64_t requests_count = 0;
  uint64_t succeeded_count = 0;
  uint64_t failed_count = 0;
  double ttft_p50_ms = 0, ttft_p90_ms = 0, ttft_p99_ms = 0;
  double tpot_p50_ms = 0;
  double e2e_p50_ms = 0;
  double hit_rate = -1;  // token-weighted prefix hit rate in [0, 1]; -1 = unknown
  double output_tokens_per_s = 0;
  double requests_per_s = 0;
};

// The row's latency and throughput fields from a bench summary (hit_rate given separately:
// -1 when unknown).
SweepRow row_from_summary(const std::string& config, uint32_t concurrency,
                          const workload::BenchSummary& summary, double hit_rate);

// What runs one point. Calls come from one thread, in the order begin_config, run_point for
// each concurrency, end_config.
class SweepBackend {
 public:
  virtual ~SweepBackend() = default;
  // Prepares a configuration (e.g. starts its cluster). An error stops the sweep.
  virtual Status begin_config(const SweepConfig& config) = 0;
  // Runs the workload at `concurrency` on the prepared configuration.
  virtual Result<SweepRow> run_point(const SweepConfig& config, uint32_t concurrency) = 0;
  // Releases the configuration; called once after every successful begin_config, also when
  // one of its points failed.
  virtual void end_config(const SweepConfig& config) = 0;
};

// Every configuration (outer loop, in order) at every concurrency (inner loop, in order).
// The first failure stops the sweep; its error is prefixed "config NAME, concurrency N: ".
// Preconditions (asserted): configs and concurrencies non-empty.
Result<std::vector<SweepRow>> run_sweep(SweepBackend& backend,
                                        const std::vector<SweepConfig>& configs,
                                        const std::vector<uint32_t>& concurrencies);

// "8,16,32" -> {8, 16, 32}. Errors (invalid, naming the item): empty list or item, not a
// number, 0, above 1,000,000, a repeated value.
Result<std::vector<uint32_t>> parse_concurrency_list(std::string_view text);

// "NAME=SPEC" -> {NAME, SPEC}. Errors (invalid, naming the argument): no '=', empty name or
// spec, a name with characters outside [A-Za-z0-9_.-].
Result<SweepConfig> parse_config_arg(std::string_view text);

struct SweepMeta {
  std::string backend;   // "sim" | "serve"
  std::string workload;  // e.g. "agentic"
  uint64_t seed = 0;
  double duration_s = 0;
};

// A fixed-width table, one row per point, in the rows' order.
std::string sweep_table(const std::vector<SweepRow>& rows);
// Header line then one line per row; unknown hit rate is an empty field.
std::string sweep_csv(const std::vector<SweepRow>& rows);
// {"meta": {...}, "rows": [{...}, ...]}; unknown hit rate is null.
std::string sweep_json(const std::vector<SweepRow>& rows, const SweepMeta& meta);
// (file name, SVG) for TTFT p50, TTFT p90, token hit rate and output throughput vs
// concurrency, one series per configuration (rows' order of first appearance); points with
// an unknown hit rate are left out of the hit-rate plot.
std::vector<std::pair<std::string, std::string>> sweep_plots(const std::vector<SweepRow>& rows,
                                                             const std::string& subtitle);

}  // namespace tandem::bench
