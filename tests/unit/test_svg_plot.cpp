// bench/svg_plot and bench/request_plots: well-formed XML, points on the right pixels,
// empty and one-point series, nice ticks, escaping.
#include <doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "bench/request_plots.hpp"
#include "bench/svg_plot.hpp"

using namespace tandem;
using namespace tandem::bench;

namespace {

// Checks that every element is closed in order, attribute values are quoted and '&' only
// starts an entity. Returns "" when well-formed, else what is wrong.
std::string xml_problem(const std::string& doc) {
  std::vector<std::string> open;
  size_t i = 0;
  while (i < doc.size()) {
    if (doc[i] == '&') {
      size_t semi = doc.find(';', i);
      std::string ent = semi == std::string::npos ? "" : doc.substr(i, semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;") {
        return "bad entity at " + std::to_string(i);
      }
      i = semi + 1;
      continue;
    }
    if (doc[i] != '<') {
      if (doc[i] == '>') return "stray '>' at " + std::to_string(i);
      ++i;
      continue;
    }
    bool in_quote = false;
    size_t end = i + 1;
    for (; end < doc.size(); ++end) {
      if (doc[end] == '"') in_quote = !in_quote;
      if (doc[end] == '<' && !in_quote) return "'<' inside a tag at " + std::to_string(end);
      if (doc[end] == '>' && !in_quote) break;
    }
    if (end >= doc.size()) return "unterminated tag at " + std::to_string(i);
    std::string tag = doc.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.starts_with("?")) continue;
    if (tag.starts_with("/")) {
      std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "unbalanced </" + name + ">";
      open.pop_back();
      continue;
    }
    std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (!tag.ends_with("/")) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return "";
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The (cx, cy) of every <circle> in order.
std::vector<std::pair<double, double>> circles(const std::string& svg) {
  std::vector<std::pair<double, double>> out;
  for (size_t at = svg.find("<circle cx=\""); at != std::string::npos;
       at = svg.find("<circle cx=\"", at + 1)) {
    double cx = std::stod(svg.substr(at + 12));
    size_t cy_at = svg.find("cy=\"", at);
    out.emplace_back(cx, std::stod(svg.substr(cy_at + 4)));
  }
  return out;
}

}  // namespace

TEST_CASE("the checker itself rejects broken XML") {
  CHECK(xml_problem("<svg><g></svg>") != "");
  CHECK(xml_problem("<svg><text>a & b</text></svg>") != "");
  CHECK(xml_problem("<svg><text>a &amp; b</text><rect x=\"1\"/></svg>") == "");
}

TEST_CASE("points map to the right pixels") {
  plot::Chart c;
  c.title = "t";
  c.x_label = "x (s)";
  c.y_label = "y (ms)";
  c.x_min = 0, c.x_max = 10, c.y_min = 0, c.y_max = 100;
  c.series.push_back({"s", {{0, 0}, {5, 50}, {10, 100}}, plot::Mark::dots});
  plot::Frame f = plot::frame_for(c);
  // Default frame: 720 x 440, margins left 80, right 24, top 40, bottom 56.
  CHECK(f.x_px(0) == doctest::Approx(80));
  CHECK(f.x_px(10) == doctest::Approx(696));
  CHECK(f.y_px(0) == doctest::Approx(384));
  CHECK(f.y_px(100) == doctest::Approx(40));
  std::string svg = plot::render_svg(c);
  CHECK(xml_problem(svg) == "");
  auto got = circles(svg);
  REQUIRE(got.size() == 3);
  CHECK(got[0].first == doctest::Approx(80));
  CHECK(got[0].second == doctest::Approx(384));
  CHECK(got[1].first == doctest::Approx(388));
  CHECK(got[1].second == doctest::Approx(212));
  CHECK(got[2].first == doctest::Approx(696));
  CHECK(got[2].second == doctest::Approx(40));
  CHECK(svg.find(">x (s)</text>") != std::string::npos);
  CHECK(svg.find(">y (ms)</text>") != std::string::npos);
  CHECK(svg.find("class=\"legend\"") == std::string::npos);  // one series: no legend
}

TEST_CASE("a line series is one polyline with a vertex per point") {
  plot::Chart c;
  c.x_min = 0, c.x_max = 4, c.y_min = 0, c.y_max = 4;
  c.series.push_back({"a", {{1, 1}, {2, 2}, {3, 3}}, plot::Mark::line});
  c.series.push_back({"b", {{1, 3}}, plot::Mark::line});
  std::string svg = plot::render_svg(c);
  CHECK(xml_problem(svg) == "");
  CHECK(count_of(svg, "<polyline") == 2);
  plot::Frame f = plot::frame_for(c);
  char want[64];
  std::snprintf(want, sizeof(want), "points=\"%.2f,%.2f %.2f,%.2f %.2f,%.2f\"", f.x_px(1),
                f.y_px(1), f.x_px(2), f.y_px(2), f.x_px(3), f.y_px(3));
  CHECK(svg.find(want) != std::string::npos);
  CHECK(svg.find("class=\"legend\"") != std::string::npos);  // two series
  CHECK(svg.find(">a</text>") != std::string::npos);
  CHECK(svg.find(">b</text>") != std::string::npos);
}

TEST_CASE("ranges from data are widened to nice ticks that cover every point") {
  plot::Chart c;
  c.series.push_back({"s", {{3, 17}, {97, 412}}, plot::Mark::dots});
  plot::Frame f = plot::frame_for(c);
  CHECK(f.x_min == 0);
  CHECK(f.y_min == 0);
  CHECK(f.x_max >= 97);
  CHECK(f.y_max >= 412);
  CHECK(f.x_max <= 120);
  CHECK(f.y_max <= 500);
  REQUIRE(f.x_ticks.size() >= 3);
  CHECK(f.x_ticks.front() == 0);
  CHECK(f.x_ticks.back() == f.x_max);
  for (auto [x, y] : circles(plot::render_svg(c))) {
    CHECK(x >= f.left_px);
    CHECK(x <= f.width_px - f.right_px);
    CHECK(y >= f.top_px);
    CHECK(y <= f.height_px - f.bottom_px);
  }
}

TEST_CASE("nice ticks") {
  auto t = plot::nice_ticks(0, 1, 6);
  REQUIRE(t.size() == 6);
  CHECK(t[1] == doctest::Approx(0.2));
  CHECK(t.back() == doctest::Approx(1.0));
  t = plot::nice_ticks(0, 1234, 6);
  CHECK(t.front() == 0);
  CHECK(t.back() >= 1234);
  CHECK(t[1] - t[0] == doctest::Approx(250));
  t = plot::nice_ticks(-3, 7, 5);
  CHECK(t.front() <= -3);
  CHECK(t.back() >= 7);
}

TEST_CASE("an empty chart and a one-point series render inside the frame") {
  plot::Chart empty;
  empty.title = "nothing";
  empty.series.push_back({"s", {}, plot::Mark::line});
  std::string svg = plot::render_svg(empty);
  CHECK(xml_problem(svg) == "");
  CHECK(svg.find("no data") != std::string::npos);
  plot::Chart none;  // no series at all
  CHECK(xml_problem(plot::render_svg(none)) == "");

  plot::Chart one;
  one.series.push_back({"s", {{5, 5}}, plot::Mark::dots});
  plot::Frame f = plot::frame_for(one);
  CHECK(f.x_max > f.x_min);
  CHECK(f.y_max > f.y_min);
  auto got = circles(plot::render_svg(one));
  REQUIRE(got.size() == 1);
  CHECK(got[0].first > f.left_px);
  CHECK(got[0].first <= f.width_px - f.right_px);
  plot::Chart zero;  // a single point at the origin
  zero.series.push_back({"s", {{0, 0}}, plot::Mark::dots});
  f = plot::frame_for(zero);
  CHECK(f.x_max > f.x_min);
  CHECK(xml_problem(plot::render_svg(zero)) == "");
  plot::Chart nan;  // non-finite points are skipped
  nan.series.push_back({"s", {{NAN, 1}, {1, INFINITY}, {2, 2}}, plot::Mark::line_dots});
  CHECK(circles(plot::render_svg(nan)).size() == 1);
}

TEST_CASE("text is escaped") {
  plot::Chart c;
  c.title = "a<b & \"c\"";
  c.x_label = "x";
  c.series.push_back({"<s1>", {{1, 1}}, plot::Mark::line});
  c.series.push_back({"s&2", {{2, 2}}, plot::Mark::line});
  std::string svg = plot::render_svg(c);
  CHECK(xml_problem(svg) == "");
  CHECK(svg.find("a&lt;b &amp; &quot;c&quot;") != std::string::npos);
  CHECK(svg.find("&lt;s1&gt;") != std::string::npos);
}

namespace {

workload::RequestTimeline timeline(double send_ms, double ttft_ms, uint64_t prompt_tokens) {
  workload::RequestTimeline t;
  t.send_ms = send_ms;
  t.chunk_ms = {send_ms + ttft_ms};
  t.end_ms = send_ms + ttft_ms + 1;
  t.output_tokens = 1;
  t.prompt_tokens = prompt_tokens;
  return t;
}

}  // namespace

TEST_CASE("request plots: CDF steps, rolling p50, p50 per context bucket") {
  std::vector<workload::RequestTimeline> tl;
  for (int i = 0; i < 10; ++i) tl.push_back(timeline(1000 + 1000.0 * i, 10.0 * (i + 1), 100));
  tl.push_back(timeline(500, 7, 20000));
  tl.back().error_kind = "http_503";  // failed: left out
  plot::Chart cdf = ttft_cdf_chart(tl, "");
  REQUIRE(cdf.series.size() == 1);
  REQUIRE(cdf.series[0].points.size() == 20);
  CHECK(cdf.series[0].points.front().x == 10);
  CHECK(cdf.series[0].points.front().y == 0);
  CHECK(cdf.series[0].points.back().x == 100);
  CHECK(cdf.series[0].points.back().y == 1);

  plot::Chart over = ttft_over_time_chart(tl, "run");
  REQUIRE(over.series.size() == 2);
  REQUIRE(over.series[0].points.size() == 10);
  // Offsets from the earliest send (the failed request's, 500 ms).
  CHECK(over.series[0].points[0].x == doctest::Approx(0.5));
  CHECK(over.series[0].points[9].x == doctest::Approx(9.5));
  // Window 5: medians of 10..50, 20..60, ... at the middle request.
  REQUIRE(over.series[1].points.size() == 6);
  CHECK(over.series[1].points[0].y == 30);
  CHECK(over.series[1].points[0].x == doctest::Approx(2.5));
  CHECK(over.series[1].points[5].y == 80);

  tl.push_back(timeline(0, 500, 9000));
  tl.push_back(timeline(0, 700, 9000));
  plot::Chart ctx = ttft_vs_context_chart(tl, {8192, 16384}, "");
  REQUIRE(ctx.series.size() == 2);
  CHECK(ctx.series[0].points.size() == 12);
  REQUIRE(ctx.series[1].points.size() == 2);
  CHECK(ctx.series[1].points[0].x == 100);
  CHECK(ctx.series[1].points[0].y == 55);
  CHECK(ctx.series[1].points[1].x == 9000);
  CHECK(ctx.series[1].points[1].y == 600);

  auto files = request_plots(tl, "x");
  REQUIRE(files.size() == 3);
  for (const auto& file : files) {
    const auto& name = file.first;  // clang 14: no structured binding in doctest's INFO lambda
    const auto& svg = file.second;
    INFO(name);
    CHECK(xml_problem(svg) == "");
  }
  for (const auto& file : request_plots({}, "")) {
    const auto& name = file.first;  // clang 14: as above
    const auto& svg = file.second;
    INFO(name);
    CHECK(xml_problem(svg) == "");
    CHECK(svg.find("no data") != std::string::npos);
  }
}
