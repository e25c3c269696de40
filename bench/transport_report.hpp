// `tandem bench transport`, the pure part: parsing fi_pingpong's output, latency percentiles,
// and rendering the comparison table and its JSON. No I/O, threads or clocks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::bench {

// One result line of fi_pingpong (libfabric util/pingpong.c, show_perf):
//   bytes  #sent  #ack  total  time  MB/sec  usec/xfer  Mxfers/sec
// fi_pingpong calls show_perf with xfers_per_iter = 2: one iteration is a full round trip
// (send + receive), so `usec_per_xfer` is elapsed / (iterations * 2) = HALF a round trip,
// and `mb_per_s` counts the bytes of both directions (iterations * size * 2 / elapsed_us).
struct PingpongRow {
  uint64_t size_bytes = 0;
  uint64_t iterations_count = 0;
  double mb_per_s = 0;       // 10^6 bytes per second, both directions
  double usec_per_xfer = 0;  // one-way: half a round trip
  double round_trip_us() const { return 2 * usec_per_xfer; }
};

// Finds the result line in fi_pingpong's client output (header line first, then one row).
// Errors (invalid): no header, no row, or a row whose numbers do not parse; the message
// quotes the offending text.
Result<PingpongRow> parse_pingpong_output(std::string_view text);

// fi_pingpong's size_str: "64", "4k", "1.5m", "16m", "1g" with binary suffixes (k = 1024).
// Errors (invalid): anything else.
Result<uint64_t> parse_pingpong_size(std::string_view text);
// fi_pingpong's cnt_str (the #sent column): "500", "1k", "2m", "1b" with decimal suffixes
// (k = 1000, m = 10^6, b = 10^9). Errors (invalid): anything else.
Result<uint64_t> parse_pingpong_count(std::string_view text);

// The q-quantile (0 <= q <= 1) by nearest rank of `samples` (sorted inside a copy).
// Precondition: samples not empty.
double percentile(std::vector<double> samples, double q);

// One table row: a metric measured by up to three sides. Absent = not measured (shown "-").
struct ReportRow {
  std::string metric;  // e.g. "round trip 64 B p50"
  std::string unit;    // "us", "msg/s", "MB/s"
  std::optional<double> tandem, raw, pingpong;
};

// Renders the fixed-width table: metric, unit, tandem, raw, fi_pingpong, tandem/raw,
// tandem/fi_pingpong. Ratios are tandem / other for every row (for latency rows a ratio
// above 1 means Tandem is slower).
std::string render_table(const std::vector<ReportRow>& rows);

// {"machine": ..., "rows": [{"metric":..,"unit":..,"tandem":..,"raw":..,"fi_pingpong":..}]}
// with null for absent values. `notes` become a "notes" array of strings.
std::string render_json(const std::vector<ReportRow>& rows, const std::string& machine,
                        const std::vector<std::string>& notes);

}  // namespace tandem::bench
