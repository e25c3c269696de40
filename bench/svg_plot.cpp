#include "bench/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/base/assert.hpp"

namespace tandem::bench::plot {
namespace {

constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr size_t kColoursCount = sizeof(kColours) / sizeof(kColours[0]);

std::string fmt(const char* format, double a) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, a);
  return buf;
}

// A tick label: integers without decimals, thousands as "12k", small values with %g.
std::string tick_label(double v) {
  double a = std::fabs(v);
  if (a >= 1e6 && std::fmod(a, 1e5) == 0) return fmt("%gM", v / 1e6);
  if (a >= 1e4 && std::fmod(a, 100) == 0) return fmt("%gk", v / 1e3);
  return fmt("%.4g", v);
}

struct Range {
  double lo = 0, hi = 0;
  bool any = false;
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = any ? std::min(lo, v) : v;
    hi = any ? std::max(hi, v) : v;
    any = true;
  }
};

// The axis range and ticks for data range `r` and explicit bounds.
void fit_axis(Range r, std::optional<double> lo_fixed, std::optional<double> hi_fixed, double* lo,
              double* hi, std::vector<double>* ticks) {
  if (!r.any) r = Range{0, 1, true};
  r.lo = std::min(r.lo, 0.0);  // every metric plotted here is >= 0: show the origin
  if (lo_fixed) r.lo = *lo_fixed;
  if (hi_fixed) r.hi = *hi_fixed;
  if (!(r.hi > r.lo)) r.hi = r.lo + std::max(1.0, std::fabs(r.lo));
  std::vector<double> nice = nice_ticks(r.lo, r.hi, 6);
  *lo = lo_fixed ? *lo_fixed : nice.front();
  *hi = hi_fixed ? *hi_fixed : nice.back();
  ticks->clear();
  const double slack = (*hi - *lo) * 1e-9;
  for (double t : nice) {
    if (t >= *lo - slack && t <= *hi + slack) ticks->push_back(t);
  }
  RT_ASSERT(*hi > *lo, *lo, *hi);
}

void append_axes(const Chart& c, const Frame& f, std::string& svg) {
  const double x0 = f.left_px, x1 = f.width_px - f.right_px;
  const double y0 = f.height_px - f.bottom_px, y1 = f.top_px;
  char buf[512];
  for (double t : f.x_ticks) {
    double x = f.x_px(t);
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n"
                  "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n"
                  "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
                  x, y0, x, y1, x, y0, x, y0 + 5, x, y0 + 18, tick_label(t).c_str());
    svg += buf;
  }
  for (double t : f.y_ticks) {
    double y = f.y_px(t);
    std::snprintf(buf, sizeof(buf),
                  "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n"
                  "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n"
                  "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n",
                  x0, y, x1, y, x0 - 5, y, x0, y, x0 - 8, y + 4, tick_label(t).c_str());
    svg += buf;
  }
  std::snprintf(buf, sizeof(buf),
                "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n"
                "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n",
                x0, y0, x1, y0, x0, y0, x0, y1);
  svg += buf;
  svg += "<text x=\"" + fmt("%.2f", (x0 + x1) / 2) + "\" y=\"" + fmt("%.2f", f.height_px - 12) +
         "\" text-anchor=\"middle\">" + xml_escape(c.x_label) + "</text>\n";
  std::string ly = fmt("%.2f", (y0 + y1) / 2);
  svg += "<text x=\"18\" y=\"" + ly + "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + ly +
         ")\">" + xml_escape(c.y_label) + "</text>\n";
  svg += "<text x=\"" + fmt("%.2f", f.width_px / 2) +
         "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" +
         xml_escape(c.title) + "</text>\n";
}

void append_series(const Series& s, const Frame& f, const char* colour, std::string& svg) {
  char buf[160];
  if (s.mark != Mark::dots) {
    std::string points;
    for (const Point& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      std::snprintf(buf, sizeof(buf), "%.2f,%.2f ", f.x_px(p.x), f.y_px(p.y));
      points += buf;
    }
    if (!points.empty()) points.pop_back();
    svg += std::string("<polyline fill=\"none\" stroke=\"") + colour +
           "\" stroke-width=\"2\" points=\"" + points + "\"/>\n";
  }
  if (s.mark == Mark::line) return;
  svg += std::string("<g fill=\"") + colour + "\" fill-opacity=\"0.6\">\n";
  for (const Point& p : s.points) {
    if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
    std::snprintf(buf, sizeof(buf), "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\"/>\n", f.x_px(p.x),
                  f.y_px(p.y));
    svg += buf;
  }
  svg += "</g>\n";
}

void append_legend(const Chart& c, const Frame& f, std::string& svg) {
  if (c.series.size() < 2) return;
  size_t name_chars = 0;
  for (const Series& s : c.series) name_chars = std::max(name_chars, s.name.size());
  const double w = 40 + 7.0 * static_cast<double>(name_chars), row = 18;
  const double x = f.width_px - f.right_px - w - 8, y = f.top_px + 8;
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "<g class=\"legend\">\n<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n",
                x, y, w, row * static_cast<double>(c.series.size()) + 8);
  svg += buf;
  for (size_t i = 0; i < c.series.size(); ++i) {
    double ly = y + 4 + row * static_cast<double>(i) + row / 2;
    const char* colour = kColours[i % kColoursCount];
    if (c.series[i].mark == Mark::dots) {  // the key looks like the series
      std::snprintf(buf, sizeof(buf), "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"/>\n",
                    x + 17, ly, colour);
    } else {
      std::snprintf(buf, sizeof(buf),
                    "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                    "stroke-width=\"3\"/>\n",
                    x + 6, ly, x + 28, ly, colour);
    }
    svg += buf;
    std::snprintf(buf, sizeof(buf), "<text x=\"%.2f\" y=\"%.2f\">", x + 34, ly + 4);
    svg += buf;
    svg += xml_escape(c.series[i].name) + "</text>\n";
  }
  svg += "</g>\n";
}

}  // namespace

double Frame::x_px(double x) const {
  RT_ASSERT(x_max > x_min, x_min, x_max);
  RT_ASSERT(width_px > left_px + right_px, width_px);
  return left_px + (x - x_min) / (x_max - x_min) * (width_px - left_px - right_px);
}

double Frame::y_px(double y) const {
  RT_ASSERT(y_max > y_min, y_min, y_max);
  RT_ASSERT(height_px > top_px + bottom_px, height_px);
  return height_px - bottom_px - (y - y_min) / (y_max - y_min) * (height_px - top_px - bottom_px);
}

std::vector<double> nice_ticks(double lo, double hi, uint32_t count_target) {
  RT_ASSERT(std::isfinite(lo) && std::isfinite(hi), lo, hi);
  RT_ASSERT(lo < hi, lo, hi);
  RT_ASSERT(count_target >= 2, count_target);
  double raw = (hi - lo) / static_cast<double>(count_target - 1);
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude * 10;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  double first = std::floor(lo / step + 1e-9) * step;
  std::vector<double> ticks;
  for (double k = 0;; ++k) {
    double t = first + k * step;
    if (std::fabs(t) < step * 1e-9) t = 0;  // no "-0" or 1e-17 labels
    ticks.push_back(t);
    if (t >= hi - step * 1e-9) break;
  }
  RT_ASSERT(ticks.size() >= 2, ticks.size());
  return ticks;
}

Frame frame_for(const Chart& chart) {
  Range xs, ys;
  for (const Series& s : chart.series) {
    for (const Point& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      xs.add(p.x);
      ys.add(p.y);
    }
  }
  Frame f;
  fit_axis(xs, chart.x_min, chart.x_max, &f.x_min, &f.x_max, &f.x_ticks);
  fit_axis(ys, chart.y_min, chart.y_max, &f.y_min, &f.y_max, &f.y_ticks);
  return f;
}

std::string render_svg(const Chart& chart) {
  Frame f = frame_for(chart);
  char head[256];
  std::snprintf(head, sizeof(head),
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
                f.width_px, f.height_px, f.width_px, f.height_px);
  std::string svg = head;
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  append_axes(chart, f, svg);
  bool any = false;
  for (size_t i = 0; i < chart.series.size(); ++i) {
    any = any || !chart.series[i].points.empty();
    append_series(chart.series[i], f, kColours[i % kColoursCount], svg);
  }
  if (!any) {
    svg += "<text x=\"" + fmt("%.2f", f.width_px / 2) + "\" y=\"" + fmt("%.2f", f.height_px / 2) +
           "\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n";
  }
  append_legend(chart, f, svg);
  svg += "</svg>\n";
  return svg;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

}  // namespace tandem::bench::plot
