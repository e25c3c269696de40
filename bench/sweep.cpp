#include "bench/sweep.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/svg_plot.hpp"
#include "runtime/base/assert.hpp"

namespace tandem::bench {
namespace {

Error invalid(const std::string& what) {
  return make_error(ErrorKind::invalid, what);
}

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

std::string hit_rate_text(double hit_rate, const char* format) {
  if (hit_rate < 0) return "";
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, hit_rate);
  return buf;
}

}  // namespace

SweepRow row_from_summary(const std::string& config, uint32_t concurrency,
                          const workload::BenchSummary& s, double hit_rate) {
  RT_ASSERT(concurrency >= 1, concurrency);
  RT_ASSERT(hit_rate <= 1.0, hit_rate);
  SweepRow row;
  row.config = config;
  row.concurrency = concurrency;
  row.requests_count = s.requests_count;
  row.succeeded_count = s.succeeded_count;
  row.failed_count = s.failed_count;
  row.ttft_p50_ms = s.ttft_ms.p50;
  row.ttft_p90_ms = s.ttft_ms.p90;
  row.ttft_p99_ms = s.ttft_ms.p99;
  row.tpot_p50_ms = s.tpot_ms.p50;
  row.e2e_p50_ms = s.e2e_ms.p50;
  row.hit_rate = hit_rate < 0 ? -1 : hit_rate;
  row.output_tokens_per_s = s.output_token_throughput_per_s;
  row.requests_per_s = s.request_throughput_per_s;
  return row;
}

Result<std::vector<SweepRow>> run_sweep(SweepBackend& backend,
                                        const std::vector<SweepConfig>& configs,
                                        const std::vector<uint32_t>& concurrencies) {
  RT_ASSERT(!configs.empty());
  RT_ASSERT(!concurrencies.empty());
  std::vector<SweepRow> rows;
  for (const SweepConfig& config : configs) {
    if (Status begun = backend.begin_config(config); !begun) {
      return make_error(begun.error().kind, "config " + config.name + ": " + begun.error().message);
    }
    for (uint32_t c : concurrencies) {
      Result<SweepRow> row = backend.run_point(config, c);
      if (!row) {
        backend.end_config(config);
        return make_error(row.error().kind, "config " + config.name + ", concurrency " +
                                                std::to_string(c) + ": " + row.error().message);
      }
      row->config = config.name;
      row->concurrency = c;
      rows.push_back(std::move(row).value());
    }
    backend.end_config(config);
  }
  RT_ASSERT(rows.size() == configs.size() * concurrencies.size(), rows.size());
  return rows;
}

Result<std::vector<uint32_t>> parse_concurrency_list(std::string_view text) {
  std::vector<uint32_t> out;
  std::set<uint32_t> seen;
  if (text.empty()) return invalid("--concurrency: empty list");
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, comma - start);
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      return invalid("--concurrency: '" + std::string(item) + "' is not a positive integer");
    }
    if (value < 1 || value > 1000000) {
      return invalid("--concurrency: " + std::string(item) + " is outside 1..1000000");
    }
    if (!seen.insert(static_cast<uint32_t>(value)).second) {
      return invalid("--concurrency: " + std::string(item) + " is repeated");
    }
    out.push_back(static_cast<uint32_t>(value));
    start = comma + 1;
  }
  RT_ASSERT(!out.empty());
  return out;
}

Result<SweepConfig> parse_config_arg(std::string_view text) {
  size_t eq = text.find('=');
  if (eq == std::string_view::npos) {
    return invalid("--config '" + std::string(text) + "': expected NAME=SPEC");
  }
  SweepConfig c{std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
  if (!valid_name(c.name)) {
    return invalid("--config '" + std::string(text) +
                   "': the name must be non-empty and use only A-Z a-z 0-9 _ . -");
  }
  if (c.spec.empty()) return invalid("--config '" + std::string(text) + "': empty spec");
  return c;
}

std::string sweep_table(const std::vector<SweepRow>& rows) {
  size_t name_width = 6;
  for (const SweepRow& r : rows) name_width = std::max(name_width, r.config.size());
  char line[320];
  std::snprintf(line, sizeof(line), "%-*s %6s %8s %6s %11s %11s %11s %11s %8s %12s %8s\n",
                static_cast<int>(name_width), "config", "conc", "requests", "failed", "ttft_p50_ms",
                "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "hit_rate", "out_tok_per_s",
                "req_per_s");
  std::string out = line;
  for (const SweepRow& r : rows) {
    std::string hit = r.hit_rate < 0 ? "-" : hit_rate_text(r.hit_rate, "%.4f");
    std::snprintf(
        line, sizeof(line), "%-*s %6u %8llu %6llu %11.1f %11.1f %11.1f %11.2f %8s %12.1f %8.2f\n",
        static_cast<int>(name_width), r.config.c_str(), r.concurrency,
        static_cast<unsigned long long>(r.requests_count),
        static_cast<unsigned long long>(r.failed_count), r.ttft_p50_ms, r.ttft_p90_ms,
        r.ttft_p99_ms, r.tpot_p50_ms, hit.c_str(), r.output_tokens_per_s, r.requests_per_s);
    out += line;
  }
  return out;
}

std::string sweep_csv(const std::vector<SweepRow>& rows) {
  std::string out =
      "config,concurrency,requests,succeeded,failed,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,"
      "tpot_p50_ms,e2e_p50_ms,hit_rate,output_tokens_per_s,requests_per_s\n";
  for (const SweepRow& r : rows) {
    RT_ASSERT(valid_name(r.config), r.config);  // no comma or quote to escape
    char line[320];
    std::snprintf(
        line, sizeof(line), "%s,%u,%llu,%llu,%llu,%.6g,%.6g,%.6g,%.6g,%.6g,%s,%.6g,%.6g\n",
        r.config.c_str(), r.concurrency, static_cast<unsigned long long>(r.requests_count),
        static_cast<unsigned long long>(r.succeeded_count),
        static_cast<unsigned long long>(r.failed_count), r.ttft_p50_ms, r.ttft_p90_ms,
        r.ttft_p99_ms, r.tpot_p50_ms, r.e2e_p50_ms, hit_rate_text(r.hit_rate, "%.6g").c_str(),
        r.output_tokens_per_s, r.requests_per_s);
    out += line;
  }
  return out;
}

std::string sweep_json(const std::vector<SweepRow>& rows, const SweepMeta& meta) {
  nlohmann::ordered_json j;
  j["meta"] = {{"backend", meta.backend},
               {"workload", meta.workload},
               {"seed", meta.seed},
               {"duration_s", meta.duration_s}};
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const SweepRow& r : rows) {
    list.push_back({{"config", r.config},
                    {"concurrency", r.concurrency},
                    {"requests", r.requests_count},
                    {"succeeded", r.succeeded_count},
                    {"failed", r.failed_count},
                    {"ttft_p50_ms", r.ttft_p50_ms},
                    {"ttft_p90_ms", r.ttft_p90_ms},
                    {"ttft_p99_ms", r.ttft_p99_ms},
                    {"tpot_p50_ms", r.tpot_p50_ms},
                    {"e2e_p50_ms", r.e2e_p50_ms},
                    {"hit_rate", r.hit_rate < 0 ? nlohmann::ordered_json()
                                                : nlohmann::ordered_json(r.hit_rate)},
                    {"output_tokens_per_s", r.output_tokens_per_s},
                    {"requests_per_s", r.requests_per_s}});
  }
  j["rows"] = std::move(list);
  return j.dump(2) + "\n";
}

std::vector<std::pair<std::string, std::string>> sweep_plots(const std::vector<SweepRow>& rows,
                                                             const std::string& subtitle) {
  struct Metric {
    const char* file;
    const char* title;
    const char* y_label;
    double (*value)(const SweepRow&);
  };
  static constexpr Metric metrics[] = {
      {"ttft_p50.svg", "TTFT p50", "TTFT p50 (ms)",
       [](const SweepRow& r) { return r.ttft_p50_ms; }},
      {"ttft_p90.svg", "TTFT p90", "TTFT p90 (ms)",
       [](const SweepRow& r) { return r.ttft_p90_ms; }},
      {"hit_rate.svg", "Prefix cache token hit rate", "token hit rate (fraction)",
       [](const SweepRow& r) { return r.hit_rate; }},
      {"output_throughput.svg", "Output throughput", "output throughput (tokens/s)",
       [](const SweepRow& r) { return r.output_tokens_per_s; }},
  };
  std::vector<std::string> names;
  for (const SweepRow& r : rows) {
    if (std::find(names.begin(), names.end(), r.config) == names.end()) names.push_back(r.config);
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const Metric& m : metrics) {
    plot::Chart chart;
    chart.title = subtitle.empty() ? m.title : std::string(m.title) + " - " + subtitle;
    chart.x_label = "concurrency (requests or sessions in flight)";
    chart.y_label = m.y_label;
    if (std::string_view(m.file) == "hit_rate.svg") chart.y_max = 1;
    for (const std::string& name : names) {
      plot::Series s{name, {}, plot::Mark::line_dots};
      for (const SweepRow& r : rows) {
        if (r.config != name || m.value(r) < 0) continue;
        s.points.push_back({static_cast<double>(r.concurrency), m.value(r)});
      }
      std::sort(s.points.begin(), s.points.end(),
                [](const plot::Point& a, const plot::Point& b) { return a.x < b.x; });
      chart.series.push_back(std::move(s));
    }
    out.emplace_back(m.file, plot::render_svg(chart));
  }
  RT_ASSERT(out.size() == 4, out.size());
  return out;
}

}  // namespace tandem::bench
