#include "bench/transport_report.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tandem::bench {
namespace {

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

std::optional<double> parse_double(std::string_view text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

std::string json_number(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", *v);
  return buf;
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string cell(const std::optional<double>& v) {
  if (!v) return "-";
  char buf[32];
  if (*v >= 100) {
    std::snprintf(buf, sizeof(buf), "%.0f", *v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f", *v);
  }
  return buf;
}

std::string ratio(const std::optional<double>& a, const std::optional<double>& b) {
  if (!a || !b || *b <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", *a / *b);
  return buf;
}

// A number with an optional one-letter suffix from `suffixes` (letter, scale).
Result<uint64_t> parse_scaled(std::string_view text,
                              std::initializer_list<std::pair<char, uint64_t>> suffixes) {
  if (text.empty()) return make_error(ErrorKind::invalid, "empty fi_pingpong number");
  uint64_t scale = 1;
  std::string_view digits = text;
  for (auto [letter, value] : suffixes) {
    if (text.back() == letter) scale = value;
  }
  if (scale != 1) digits.remove_suffix(1);
  RT_ASSERT(digits.size() + (scale != 1 ? 1 : 0) == text.size());
  auto value = parse_double(digits);
  if (!value || *value < 0) {
    return make_error(ErrorKind::invalid, "fi_pingpong number '" + std::string(text) + "'");
  }
  RT_ASSERT(scale >= 1);
  return static_cast<uint64_t>(std::llround(*value * double(scale)));
}

}  // namespace

Result<uint64_t> parse_pingpong_size(std::string_view text) {
  return parse_scaled(text, {{'k', 1ull << 10}, {'m', 1ull << 20}, {'g', 1ull << 30}});
}

Result<uint64_t> parse_pingpong_count(std::string_view text) {
  return parse_scaled(text, {{'k', 1000}, {'m', 1000000}, {'b', 1000000000}});
}

Result<PingpongRow> parse_pingpong_output(std::string_view text) {
  bool header_seen = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    auto words = split_words(line);
    if (words.size() == 8 && words[0] == "bytes" && words[6] == "usec/xfer") {
      header_seen = true;
      continue;
    }
    if (!header_seen || words.size() != 8) continue;
    // The #ack column is "=N" (all acked), "+N" or "-N"; time ends in "s".
    auto size = parse_pingpong_size(words[0]);
    auto sent = parse_pingpong_count(words[1]);
    auto mb = parse_double(words[5]);
    auto usec = parse_double(words[6]);
    if (!size.ok() || !sent.ok() || !mb || !usec || *usec <= 0) {
      return make_error(ErrorKind::invalid,
                        "fi_pingpong row does not parse: '" + std::string(line) + "'");
    }
    RT_ASSERT(*usec > 0);
    RT_ASSERT(header_seen);
    return PingpongRow{*size, *sent, *mb, *usec};
  }
  return make_error(ErrorKind::invalid, header_seen ? "fi_pingpong printed a header but no row"
                                                    : "no fi_pingpong result header in output");
}

double percentile(std::vector<double> samples, double q) {
  RT_ASSERT(!samples.empty());
  RT_ASSERT(q >= 0 && q <= 1, q);
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<size_t>(std::ceil(q * double(samples.size())));
  size_t index = rank == 0 ? 0 : rank - 1;
  RT_ASSERT(index < samples.size(), index);
  return samples[index];
}

std::string render_table(const std::vector<ReportRow>& rows) {
  RT_ASSERT(!rows.empty());
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-34s %-6s %10s %10s %12s %10s %12s\n", "metric", "unit",
                "tandem", "raw", "fi_pingpong", "tandem/raw", "tandem/fi_pp");
  out += line;
  for (const auto& r : rows) {
    RT_ASSERT(!r.metric.empty());
    std::snprintf(line, sizeof(line), "%-34s %-6s %10s %10s %12s %10s %12s\n", r.metric.c_str(),
                  r.unit.c_str(), cell(r.tandem).c_str(), cell(r.raw).c_str(),
                  cell(r.pingpong).c_str(), ratio(r.tandem, r.raw).c_str(),
                  ratio(r.tandem, r.pingpong).c_str());
    out += line;
  }
  return out;
}

std::string render_json(const std::vector<ReportRow>& rows, const std::string& machine,
                        const std::vector<std::string>& notes) {
  std::ostringstream out;
  out << "{\n  \"machine\": " << json_string(machine) << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << "    {\"metric\": " << json_string(r.metric) << ", \"unit\": " << json_string(r.unit)
        << ", \"tandem\": " << json_number(r.tandem) << ", \"raw\": " << json_number(r.raw)
        << ", \"fi_pingpong\": " << json_number(r.pingpong) << "}"
        << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "  ],\n  \"notes\": [";
  for (size_t i = 0; i < notes.size(); ++i) out << (i ? ", " : "") << json_string(notes[i]);
  out << "]\n}\n";
  return out.str();
}

}  // namespace tandem::bench
