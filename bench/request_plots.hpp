// The per-request latency plots of `tandem bench serve --svg-dir` and `tandem sim --svg-dir`
// (issue 5), built from request timelines (tools/workload/bench_metrics.hpp) and drawn by
// bench/svg_plot. Pure: data in, charts / SVG text out.
//
// Only succeeded requests with a first chunk count (failed ones have no TTFT). Times in the
// timelines are ms from any fixed origin; "start offset" is measured from the earliest send.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "bench/svg_plot.hpp"
#include "tools/workload/bench_metrics.hpp"

namespace tandem::bench {

// TTFT CDF: x = TTFT (ms), y = fraction of requests with TTFT <= x (a step per request).
plot::Chart ttft_cdf_chart(const std::vector<workload::RequestTimeline>& timelines,
                           const std::string& subtitle);

// TTFT over time: one dot per request at (send offset s, TTFT ms), and the rolling p50 over
// windows of max(5, n / 20) consecutive requests (in send order) as a line at each window's
// middle request.
plot::Chart ttft_over_time_chart(const std::vector<workload::RequestTimeline>& timelines,
                                 const std::string& subtitle);

// TTFT vs context length: one dot per request at (prompt tokens, TTFT ms), and a line through
// each non-empty bucket's (median prompt tokens, p50 TTFT). `edges_tokens`: ascending bucket
// edges as in workload::SummaryOptions::context_edges_tokens (asserted ascending).
plot::Chart ttft_vs_context_chart(const std::vector<workload::RequestTimeline>& timelines,
                                  const std::vector<uint64_t>& edges_tokens,
                                  const std::string& subtitle);

// Every request plot as (file name, SVG): ttft_cdf.svg, ttft_over_time.svg,
// ttft_vs_context.svg.
std::vector<std::pair<std::string, std::string>> request_plots(
    const std::vector<workload::RequestTimeline>& timelines, const std::string& subtitle);

}  // namespace tandem::bench
