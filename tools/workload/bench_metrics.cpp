#include "tools/workload/bench_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::workload {

double percentile(const std::vector<double>& sorted, double q) {
  RT_ASSERT(!sorted.empty());
  RT_ASSERT(q >= 0 && q <= 100, q);
  double rank = q / 100.0 * static_cast<double>(sorted.size() - 1);
  auto below = static_cast<size_t>(std::floor(rank));
  size_t above = std::min(below + 1, sorted.size() - 1);
  double fraction = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

LatencyStats latency_stats(std::vector<double> samples) {
  LatencyStats stats;
  if (samples.empty()) return stats;
  std::sort(samples.begin(), samples.end());
  stats.count = samples.size();
  stats.mean =
      std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  stats.p50 = percentile(samples, 50);
  stats.p90 = percentile(samples, 90);
  stats.p99 = percentile(samples, 99);
  stats.min = samples.front();
  stats.max = samples.back();
  RT_ASSERT(stats.min <= stats.p50 && stats.p50 <= stats.p99 && stats.p99 <= stats.max);
  return stats;
}

namespace {

Error bad_request(size_t index, const std::string& what) {
  return make_error(ErrorKind::invalid, "request " + std::to_string(index) + ": " + what);
}

Status check_timeline(const RequestTimeline& t, size_t index) {
  if (!std::isfinite(t.send_ms) || !std::isfinite(t.end_ms)) {
    return bad_request(index, "send_ms and end_ms must be finite");
  }
  if (t.end_ms < t.send_ms) return bad_request(index, "end_ms is before send_ms");
  double previous = t.send_ms;
  for (size_t i = 0; i < t.chunk_ms.size(); ++i) {
    if (!(t.chunk_ms[i] >= previous)) {
      return bad_request(
          index, "chunk " + std::to_string(i) +
                     (i == 0 ? " is before send_ms" : " is before chunk " + std::to_string(i - 1)));
    }
    previous = t.chunk_ms[i];
  }
  if (t.end_ms < previous) return bad_request(index, "end_ms is before the last chunk");
  if (t.error_kind.empty() && t.output_tokens < t.chunk_ms.size()) {
    return bad_request(index, "output_tokens " + std::to_string(t.output_tokens) +
                                  " is below its " + std::to_string(t.chunk_ms.size()) + " chunks");
  }
  return {};
}

Status check_options(const SummaryOptions& options) {
  const std::vector<uint64_t>& edges = options.context_edges_tokens;
  for (size_t i = 0; i < edges.size(); ++i) {
    if (edges[i] == 0 || (i > 0 && edges[i] <= edges[i - 1])) {
      return make_error(ErrorKind::invalid,
                        "context_edges_tokens must be positive and strictly ascending");
    }
  }
  if (!(options.duration_ms >= 0)) {
    return make_error(ErrorKind::invalid, "duration_ms must be >= 0");
  }
  return {};
}

bool meets(const Slo& slo, double ttft_ms, std::optional<double> tpot_ms, double e2e_ms) {
  if (slo.ttft_ms_max && ttft_ms > *slo.ttft_ms_max) return false;
  if (slo.tpot_ms_max && tpot_ms && *tpot_ms > *slo.tpot_ms_max) return false;
  if (slo.e2e_ms_max && e2e_ms > *slo.e2e_ms_max) return false;
  return true;
}

size_t bucket_of(const std::vector<uint64_t>& edges, uint64_t prompt_tokens) {
  return static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), prompt_tokens) -
                             edges.begin());
}

}  // namespace

Result<BenchSummary> summarize(const std::vector<RequestTimeline>& timelines,
                               const SummaryOptions& options) {
  Status valid = check_options(options);
  if (!valid) return valid.error();
  for (size_t i = 0; i < timelines.size(); ++i) {
    Status ok = check_timeline(timelines[i], i);
    if (!ok) return ok.error();
  }
  const std::vector<uint64_t>& edges = options.context_edges_tokens;
  BenchSummary summary;
  summary.requests_count = timelines.size();
  std::vector<double> ttft, tpot, itl, e2e;
  std::vector<std::vector<double>> ttft_by_bucket(edges.size() + 1);
  std::map<uint32_t, std::vector<double>> ttft_by_turn;
  double first_send = INFINITY, last_end = -INFINITY;
  uint64_t output_tokens_sum = 0;
  for (const RequestTimeline& t : timelines) {
    first_send = std::min(first_send, t.send_ms);
    last_end = std::max(last_end, t.end_ms);
    if (!t.error_kind.empty()) {
      ++summary.failed_count;
      ++summary.errors_by_kind[t.error_kind];
      continue;
    }
    ++summary.succeeded_count;
    output_tokens_sum += t.output_tokens;
    double e2e_ms = t.end_ms - t.send_ms;
    e2e.push_back(e2e_ms);
    if (t.chunk_ms.empty()) {  // nothing streamed: counts for E2E only, never as goodput
      continue;
    }
    double ttft_ms = t.chunk_ms.front() - t.send_ms;
    ttft.push_back(ttft_ms);
    ttft_by_bucket[bucket_of(edges, t.prompt_tokens)].push_back(ttft_ms);
    ttft_by_turn[t.turn].push_back(ttft_ms);
    std::optional<double> tpot_ms;
    if (t.output_tokens > 1) {
      tpot_ms = (e2e_ms - ttft_ms) / static_cast<double>(t.output_tokens - 1);
      tpot.push_back(*tpot_ms);
    }
    for (size_t i = 1; i < t.chunk_ms.size(); ++i) itl.push_back(t.chunk_ms[i] - t.chunk_ms[i - 1]);
    if (meets(options.slo, ttft_ms, tpot_ms, e2e_ms)) ++summary.goodput_count;
  }
  summary.duration_ms = options.duration_ms > 0 ? options.duration_ms
                        : timelines.empty()     ? 0.0
                                                : last_end - first_send;
  double duration_s = summary.duration_ms / 1000.0;
  if (duration_s > 0) {
    summary.request_throughput_per_s = static_cast<double>(summary.succeeded_count) / duration_s;
    summary.output_token_throughput_per_s = static_cast<double>(output_tokens_sum) / duration_s;
    summary.goodput_per_s = static_cast<double>(summary.goodput_count) / duration_s;
  }
  if (summary.requests_count > 0) {
    summary.goodput_fraction =
        static_cast<double>(summary.goodput_count) / static_cast<double>(summary.requests_count);
  }
  summary.ttft_ms = latency_stats(std::move(ttft));
  summary.tpot_ms = latency_stats(std::move(tpot));
  summary.itl_ms = latency_stats(std::move(itl));
  summary.e2e_ms = latency_stats(std::move(e2e));
  for (size_t b = 0; b <= edges.size(); ++b) {
    summary.ttft_by_context.push_back({b == 0 ? 0 : edges[b - 1],
                                       b == edges.size() ? UINT64_MAX : edges[b],
                                       latency_stats(std::move(ttft_by_bucket[b]))});
  }
  for (auto& [turn, samples] : ttft_by_turn) summary.ttft_by_turn[turn] = latency_stats(samples);
  RT_ASSERT(summary.succeeded_count + summary.failed_count == summary.requests_count);
  RT_ASSERT(summary.goodput_count <= summary.succeeded_count);
  return summary;
}

}  // namespace tandem::workload
