#include "bench/request_plots.hpp"

#include <algorithm>
#include <cstdint>

#include "runtime/base/assert.hpp"

namespace tandem::bench {
namespace {

struct Sample {
  double send_ms = 0;
  double ttft_ms = 0;
  uint64_t prompt_tokens = 0;
};

std::vector<Sample> samples_of(const std::vector<workload::RequestTimeline>& timelines) {
  std::vector<Sample> out;
  for (const workload::RequestTimeline& t : timelines) {
    if (!t.error_kind.empty() || t.chunk_ms.empty()) continue;
    out.push_back({t.send_ms, t.chunk_ms[0] - t.send_ms, t.prompt_tokens});
  }
  return out;
}

std::string with_subtitle(std::string title, const std::string& subtitle) {
  return subtitle.empty() ? title : title + " - " + subtitle;
}

double median(std::vector<double> v) {
  RT_ASSERT(!v.empty());
  std::sort(v.begin(), v.end());
  return workload::percentile(v, 50);
}

}  // namespace

plot::Chart ttft_cdf_chart(const std::vector<workload::RequestTimeline>& timelines,
                           const std::string& subtitle) {
  std::vector<double> ttft;
  for (const Sample& s : samples_of(timelines)) ttft.push_back(s.ttft_ms);
  std::sort(ttft.begin(), ttft.end());
  plot::Chart c;
  c.title = with_subtitle("TTFT CDF, " + std::to_string(ttft.size()) + " requests", subtitle);
  c.x_label = "TTFT (ms)";
  c.y_label = "fraction of requests";
  c.y_min = 0;
  c.y_max = 1;
  plot::Series s{"TTFT", {}, plot::Mark::line};
  const auto n = static_cast<double>(ttft.size());
  for (size_t i = 0; i < ttft.size(); ++i) {
    s.points.push_back({ttft[i], static_cast<double>(i) / n});
    s.points.push_back({ttft[i], static_cast<double>(i + 1) / n});
  }
  RT_ASSERT(s.points.size() == 2 * ttft.size(), s.points.size());
  c.series.push_back(std::move(s));
  return c;
}

plot::Chart ttft_over_time_chart(const std::vector<workload::RequestTimeline>& timelines,
                                 const std::string& subtitle) {
  std::vector<Sample> samples = samples_of(timelines);
  std::stable_sort(samples.begin(), samples.end(),
                   [](const Sample& a, const Sample& b) { return a.send_ms < b.send_ms; });
  double origin_ms = samples.empty() ? 0 : samples.front().send_ms;
  for (const workload::RequestTimeline& t : timelines) origin_ms = std::min(origin_ms, t.send_ms);
  plot::Chart c;
  c.title = with_subtitle("TTFT over time", subtitle);
  c.x_label = "request start offset (s)";
  c.y_label = "TTFT (ms)";
  plot::Series dots{"request", {}, plot::Mark::dots};
  for (const Sample& s : samples) dots.points.push_back({(s.send_ms - origin_ms) / 1e3, s.ttft_ms});
  size_t window = std::max<size_t>(5, samples.size() / 20);
  plot::Series rolling{
      "rolling p50 (" + std::to_string(window) + " requests)", {}, plot::Mark::line};
  for (size_t start = 0; start + window <= samples.size(); ++start) {
    std::vector<double> v;
    for (size_t k = start; k < start + window; ++k) v.push_back(samples[k].ttft_ms);
    rolling.points.push_back({dots.points[start + window / 2].x, median(std::move(v))});
  }
  RT_ASSERT(rolling.points.size() <= dots.points.size(), rolling.points.size());
  c.series.push_back(std::move(dots));
  c.series.push_back(std::move(rolling));
  return c;
}

plot::Chart ttft_vs_context_chart(const std::vector<workload::RequestTimeline>& timelines,
                                  const std::vector<uint64_t>& edges_tokens,
                                  const std::string& subtitle) {
  RT_ASSERT(std::is_sorted(edges_tokens.begin(), edges_tokens.end()));
  std::vector<Sample> samples = samples_of(timelines);
  plot::Chart c;
  c.title = with_subtitle("TTFT vs context length", subtitle);
  c.x_label = "prompt length (tokens)";
  c.y_label = "TTFT (ms)";
  plot::Series dots{"request", {}, plot::Mark::dots};
  std::vector<std::vector<Sample>> buckets(edges_tokens.size() + 1);
  for (const Sample& s : samples) {
    dots.points.push_back({static_cast<double>(s.prompt_tokens), s.ttft_ms});
    auto b = std::upper_bound(edges_tokens.begin(), edges_tokens.end(), s.prompt_tokens) -
             edges_tokens.begin();
    buckets[static_cast<size_t>(b)].push_back(s);
  }
  plot::Series p50{"p50 per bucket", {}, plot::Mark::line_dots};
  for (const std::vector<Sample>& bucket : buckets) {
    if (bucket.empty()) continue;
    std::vector<double> tokens, ttft;
    for (const Sample& s : bucket) {
      tokens.push_back(static_cast<double>(s.prompt_tokens));
      ttft.push_back(s.ttft_ms);
    }
    p50.points.push_back({median(std::move(tokens)), median(std::move(ttft))});
  }
  RT_ASSERT(p50.points.size() <= buckets.size(), p50.points.size());
  c.series.push_back(std::move(dots));
  c.series.push_back(std::move(p50));
  return c;
}

std::vector<std::pair<std::string, std::string>> request_plots(
    const std::vector<workload::RequestTimeline>& timelines, const std::string& subtitle) {
  workload::SummaryOptions defaults;
  return {
      {"ttft_cdf.svg", plot::render_svg(ttft_cdf_chart(timelines, subtitle))},
      {"ttft_over_time.svg", plot::render_svg(ttft_over_time_chart(timelines, subtitle))},
      {"ttft_vs_context.svg",
       plot::render_svg(ttft_vs_context_chart(timelines, defaults.context_edges_tokens, subtitle))},
  };
}

}  // namespace tandem::bench
