// Text, JSON and SVG output of `tandem bench serve` (declared in bench/serve_bench.hpp).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/serve_bench.hpp"
#include "bench/request_plots.hpp"
#include "runtime/base/assert.hpp"

namespace tandem::bench {
namespace {

using nlohmann::json;

json stats_json(const workload::LatencyStats& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90},
          {"p99", s.p99},     {"min", s.min},   {"max", s.max}};
}

std::string stats_row(const char* name, const workload::LatencyStats& s) {
  char line[200];
  std::snprintf(line, sizeof(line), "  %-10s %10.3f %10.3f %10.3f %10.3f %10.3f  (n=%llu)\n",
                name, s.mean, s.p50, s.p90, s.p99, s.max,
                static_cast<unsigned long long>(s.count));
  return line;
}

json summary_json(const workload::BenchSummary& s) {
  json j = {{"requests_count", s.requests_count},
            {"succeeded_count", s.succeeded_count},
            {"failed_count", s.failed_count},
            {"duration_ms", s.duration_ms},
            {"request_throughput_per_s", s.request_throughput_per_s},
            {"output_token_throughput_per_s", s.output_token_throughput_per_s},
            {"ttft_ms", stats_json(s.ttft_ms)},
            {"tpot_ms", stats_json(s.tpot_ms)},
            {"itl_ms", stats_json(s.itl_ms)},
            {"e2e_ms", stats_json(s.e2e_ms)},
            {"goodput_count", s.goodput_count},
            {"goodput_fraction", s.goodput_fraction},
            {"goodput_per_s", s.goodput_per_s},
            {"errors_by_kind", s.errors_by_kind}};
  json buckets = json::array();
  for (const auto& b : s.ttft_by_context) {
    buckets.push_back({{"prompt_tokens_min", b.prompt_tokens_min},
                       {"prompt_tokens_max", b.prompt_tokens_max},
                       {"ttft_ms", stats_json(b.ttft_ms)}});
  }
  j["ttft_by_context"] = std::move(buckets);
  json turns = json::object();
  for (const auto& [turn, stats] : s.ttft_by_turn) turns[std::to_string(turn)] = stats_json(stats);
  j["ttft_by_turn"] = std::move(turns);
  return j;
}

}  // namespace

std::string describe(const ServeBenchResult& r) {
  const workload::BenchSummary& s = r.summary;
  char head[512];
  std::snprintf(head, sizeof(head),
                "model %s: %llu requests, %llu succeeded, %llu failed in %.2f s\n"
                "  throughput %.2f req/s, %.1f output tok/s; goodput %llu (%.1f%%, %.2f/s)\n",
                r.model.c_str(), static_cast<unsigned long long>(s.requests_count),
                static_cast<unsigned long long>(s.succeeded_count),
                static_cast<unsigned long long>(s.failed_count), s.duration_ms / 1000.0,
                s.request_throughput_per_s, s.output_token_throughput_per_s,
                static_cast<unsigned long long>(s.goodput_count), s.goodput_fraction * 100,
                s.goodput_per_s);
  std::string out = head;
  out += "  ms               mean        p50        p90        p99        max\n";
  out += stats_row("TTFT", s.ttft_ms) + stats_row("TPOT", s.tpot_ms) +
         stats_row("ITL", s.itl_ms) + stats_row("E2E", s.e2e_ms);
  for (const auto& b : s.ttft_by_context) {
    if (b.ttft_ms.count == 0) continue;
    std::string name = "ctx<" + (b.prompt_tokens_max == UINT64_MAX
                                     ? std::string("inf")
                                     : std::to_string(b.prompt_tokens_max));
    out += stats_row(name.c_str(), b.ttft_ms);
  }
  for (const auto& [kind, count] : s.errors_by_kind) {
    auto ex = r.error_examples.find(kind);
    bool example = ex != r.error_examples.end() && !ex->second.empty();
    out += "  error " + kind + ": " + std::to_string(count) +
           (example ? " (e.g. " + ex->second + ")" : "") + "\n";
  }
  if (r.retries > 0) {
    out += "  sent again after a refusal: " + std::to_string(r.retries) + " (";
    bool first = true;
    for (const auto& [kind, count] : r.retried_by_kind) {
      out += (first ? "" : ", ") + kind + " " + std::to_string(count);
      first = false;
    }
    out += ")\n";
  }
  if (r.request_hit_rate >= 0) {
    char line[128];
    std::snprintf(line, sizeof(line),
                  "  prompt tokens cached (token-weighted, usage.cached_tokens): %.1f%%\n",
                  r.request_hit_rate * 100);
    out += line;
  }
  if (r.prefix_hit_rate >= 0) {
    char line[128];
    std::snprintf(line, sizeof(line), "  prefix hit rate (token-weighted, /metrics): %.1f%%\n",
                  r.prefix_hit_rate * 100);
    out += line;
  } else {
    out += "  prefix hit rate: unknown (no /metrics or no lookups)\n";
  }
  return out;
}

std::string to_json(const ServeBenchResult& r, const ServeBenchOptions& o) {
  RT_ASSERT(r.timelines.size() == r.request_indexes.size(), "one index per timeline");
  json j;
  j["model"] = r.model;
  j["options"] = {{"target", o.target.host + ":" + std::to_string(o.target.port)},
                  {"chat", o.chat},
                  {"concurrency", o.concurrency},
                  {"request_rate_per_s", o.request_rate_per_s},
                  {"duration_s", o.duration_s},
                  {"requests_max", o.requests_max},
                  {"chain_sessions", o.chain_sessions},
                  {"use_think_time", o.use_think_time}};
  j["summary"] = summary_json(r.summary);
  j["retries"] = {{"total", r.retries}, {"by_kind", r.retried_by_kind}};
  j["prefix_cache"] = {{"hits_tokens", r.prefix_after.hits_tokens - r.prefix_before.hits_tokens},
                       {"queries_tokens",
                        r.prefix_after.queries_tokens - r.prefix_before.queries_tokens},
                       {"hit_rate", r.prefix_hit_rate >= 0 ? json(r.prefix_hit_rate) : json()},
                       {"request_hit_rate",
                        r.request_hit_rate >= 0 ? json(r.request_hit_rate) : json()}};
  json requests = json::array();
  for (size_t i = 0; i < r.timelines.size(); ++i) {
    const auto& t = r.timelines[i];
    requests.push_back({{"index", r.request_indexes[i]},
                        {"turn", t.turn},
                        {"prompt_tokens", t.prompt_tokens},
                        {"cached_tokens", t.cached_tokens},
                        {"output_tokens", t.output_tokens},
                        {"send_ms", t.send_ms},
                        {"first_chunk_ms", t.chunk_ms.empty() ? json() : json(t.chunk_ms[0])},
                        {"end_ms", t.end_ms},
                        {"chunks_count", t.chunk_ms.size()},
                        {"error", t.error_kind}});
  }
  j["requests"] = std::move(requests);
  return j.dump(1);
}

std::string ttft_cdf_svg(const ServeBenchResult& r) {
  return plot::render_svg(ttft_cdf_chart(r.timelines, r.model));
}

}  // namespace tandem::bench
