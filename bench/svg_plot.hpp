// A small SVG chart renderer shared by `tandem bench serve`, `tandem sim` and
// `tandem bench sweep` (issue 5). Pure: data in, an SVG document (string) out; no I/O.
//
// A chart is a set of named series of (x, y) points drawn as lines, dots or both, in a frame
// with labelled axes (the labels carry the unit, e.g. "TTFT (ms)"), tick marks with values,
// light grid lines, a title, and a legend when there is more than one series.
//
// Axis ranges: an explicit Chart::x_min/x_max/y_min/y_max wins; otherwise the range covers
// the data and 0, widened to "nice" tick values (1, 2, 2.5, 5 x 10^k). An empty chart (no
// points) gets [0, 1] on both axes and a "no data" note; a single point or equal values
// widen the range so the point sits inside the frame. Non-finite values are skipped.
// Cost: O(points); every number is printed with at most 2 decimals.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::bench::plot {

struct Point {
  double x = 0;
  double y = 0;
};

enum class Mark : uint8_t { line, dots, line_dots };

struct Series {
  std::string name;  // legend entry
  std::vector<Point> points;
  Mark mark = Mark::line;
};

struct Chart {
  std::string title;
  std::string x_label;  // with the unit
  std::string y_label;  // with the unit
  std::vector<Series> series;
  std::optional<double> x_min, x_max, y_min, y_max;  // data units; nullopt = from the data
};

// Pixel geometry and the data ranges it maps; the plot area is the frame minus the margins.
struct Frame {
  double width_px = 720, height_px = 440;
  double left_px = 80, right_px = 24, top_px = 40, bottom_px = 56;
  double x_min = 0, x_max = 1, y_min = 0, y_max = 1;  // x_min < x_max, y_min < y_max
  std::vector<double> x_ticks, y_ticks;               // values inside [min, max]

  // Data -> pixel (y grows downwards in SVG). Precondition: ranges non-empty (asserted).
  double x_px(double x) const;
  double y_px(double y) const;
};

// Ascending "nice" values (step 1, 2, 2.5 or 5 x 10^k) from <= lo to >= hi, about
// count_target of them (>= 2). Preconditions: lo < hi, both finite, count_target >= 2.
std::vector<double> nice_ticks(double lo, double hi, uint32_t count_target);

// The frame (ranges and ticks) render_svg() uses for `chart`.
Frame frame_for(const Chart& chart);

// The whole SVG document. Text is XML-escaped.
std::string render_svg(const Chart& chart);

// &, <, >, " and ' as entities.
std::string xml_escape(std::string_view text);

}  // namespace tandem::bench::plot
