// Benchmark metric arithmetic for `tandem bench serve` and `tandem sim` (issue 5): from
// per-request event timelines to TTFT, TPOT, ITL, end-to-end latency, throughput, goodput
// under SLOs, errors by kind, TTFT by context length and by turn.
//
// Pure: times come in as numbers (ms from any fixed origin); no clocks or I/O.
// Definitions (vLLM benchmark_serving / DistServe):
//   TTFT  = first chunk - send
//   E2E   = end - send
//   TPOT  = (E2E - TTFT) / (output_tokens - 1), for requests with >= 2 output tokens
//   ITL   = gaps between consecutive chunks (a chunk may carry several tokens)
//   goodput = requests that succeeded and met every given SLO; as a fraction of all
//             requests (DistServe's SLO attainment) and per second of the run
// Percentiles interpolate linearly between order statistics (numpy's default).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::workload {

struct RequestTimeline {
  double send_ms = 0;
  std::vector<double> chunk_ms;  // arrival of each streamed chunk carrying tokens, ascending
  double end_ms = 0;             // stream closed (>= last chunk)
  uint32_t output_tokens = 0;    // tokens generated (usage); >= chunk count when succeeded
  uint64_t prompt_tokens = 0;    // for TTFT by context length
  uint32_t turn = 0;             // for TTFT by turn
  std::string error_kind;        // "" = succeeded; else e.g. "http_503", "timeout"
  uint64_t cached_tokens = 0;    // prompt tokens served from a prefix cache (not computed)
};

struct LatencyStats {
  uint64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;  // all 0 when count is 0
};

// Computes the stats of `samples` (any order). Empty: all zero.
LatencyStats latency_stats(std::vector<double> samples);
// Linear-interpolated percentile of ascending `sorted`, q in [0, 100]. Precondition: non-empty.
double percentile(const std::vector<double>& sorted, double q);

struct Slo {  // a request meets the SLOs when every given bound holds
  std::optional<double> ttft_ms_max;
  std::optional<double> tpot_ms_max;
  std::optional<double> e2e_ms_max;
};

struct ContextBucket {
  uint64_t prompt_tokens_min = 0;  // inclusive
  uint64_t prompt_tokens_max = 0;  // exclusive; UINT64_MAX for the last bucket
  LatencyStats ttft_ms;
};

struct BenchSummary {
  uint64_t requests_count = 0;
  uint64_t succeeded_count = 0;
  uint64_t failed_count = 0;
  double duration_ms = 0;
  double request_throughput_per_s = 0;       // succeeded requests / duration
  double output_token_throughput_per_s = 0;  // succeeded requests' output tokens / duration
  LatencyStats ttft_ms, tpot_ms, itl_ms, e2e_ms;
  uint64_t goodput_count = 0;
  double goodput_fraction = 0;  // goodput_count / requests_count
  double goodput_per_s = 0;     // goodput_count / duration
  std::map<std::string, uint64_t> errors_by_kind;
  std::vector<ContextBucket> ttft_by_context;  // one per bucket, ascending
  std::map<uint32_t, LatencyStats> ttft_by_turn;
};

struct SummaryOptions {
  Slo slo;
  // Bucket edges in prompt tokens, ascending, each > 0: buckets [0, e0), [e0, e1), ...,
  // [e_last, inf).
  std::vector<uint64_t> context_edges_tokens = {8192, 16384, 32768, 65536, 131072};
  // Run length for throughput; 0 = last end - first send over all requests.
  double duration_ms = 0;
};

// Errors: invalid, naming the request index and what is inconsistent (a chunk before the
// send or out of order, end before the last chunk, a succeeded request with fewer output
// tokens than chunks, unsorted or zero edges, negative duration).
Result<BenchSummary> summarize(const std::vector<RequestTimeline>& timelines,
                               const SummaryOptions& options);

}  // namespace tandem::workload
