#include <doctest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "runtime/obs/metrics.hpp"
#include "runtime/obs/recent.hpp"

using tandem::ErrorKind;
using tandem::obs::Registry;

TEST_CASE("counter renders HELP, TYPE and its value; same name+labels is the same series") {
  Registry registry(16);
  auto* requests =
      registry.counter("tandem:requests_total", "Requests served.", {{"instance", "decode-0"}})
          .value();
  requests->inc();
  requests->inc(4);
  auto* again =
      registry.counter("tandem:requests_total", "ignored", {{"instance", "decode-0"}}).value();
  CHECK(again == requests);
  auto* other = registry.counter("tandem:requests_total", "", {{"instance", "decode-1"}}).value();
  CHECK(other != requests);
  CHECK(registry.series_count() == 2);
  CHECK(registry.render_prometheus() ==
        "# HELP tandem:requests_total Requests served.\n"
        "# TYPE tandem:requests_total counter\n"
        "tandem:requests_total{instance=\"decode-0\"} 5\n"
        "tandem:requests_total{instance=\"decode-1\"} 0\n");
}

TEST_CASE("double counter and gauge render shortest values; labels are sorted by name") {
  Registry registry;
  auto* busy = registry.counter_double("busy_seconds_total", "Busy time.").value();
  busy->add(1.5);
  busy->add(0.25);
  auto* queue =
      registry.gauge("queue_length", "Queued requests.", {{"role", "prefill"}, {"instance", "p0"}})
          .value();
  queue->set(7);
  queue->add(-2.5);
  auto same = registry.gauge("queue_length", "", {{"instance", "p0"}, {"role", "prefill"}});
  CHECK(same.value() == queue);
  auto* inf = registry.gauge("inf_gauge", "Infinite.").value();
  inf->set(std::numeric_limits<double>::infinity());
  CHECK(registry.render_prometheus() ==
        "# HELP busy_seconds_total Busy time.\n"
        "# TYPE busy_seconds_total counter\n"
        "busy_seconds_total 1.75\n"
        "# HELP queue_length Queued requests.\n"
        "# TYPE queue_length gauge\n"
        "queue_length{instance=\"p0\",role=\"prefill\"} 4.5\n"
        "# HELP inf_gauge Infinite.\n"
        "# TYPE inf_gauge gauge\n"
        "inf_gauge +Inf\n");
}

TEST_CASE("histogram renders cumulative buckets incl. +Inf, _sum and _count") {
  Registry registry;
  auto* ttft = registry
                   .histogram("tandem:time_to_first_token_seconds", "TTFT.", {0.125, 0.5, 2.5},
                              {{"model", "m"}})
                   .value();
  for (double v : {0.0625, 0.125, 0.25, 3.0, 10.0}) ttft->observe(v);
  CHECK(ttft->count() == 5);
  CHECK(ttft->bucket_counts() == std::vector<uint64_t>{2, 1, 0, 2});
  CHECK(registry.render_prometheus() ==
        "# HELP tandem:time_to_first_token_seconds TTFT.\n"
        "# TYPE tandem:time_to_first_token_seconds histogram\n"
        "tandem:time_to_first_token_seconds_bucket{model=\"m\",le=\"0.125\"} 2\n"
        "tandem:time_to_first_token_seconds_bucket{model=\"m\",le=\"0.5\"} 3\n"
        "tandem:time_to_first_token_seconds_bucket{model=\"m\",le=\"2.5\"} 3\n"
        "tandem:time_to_first_token_seconds_bucket{model=\"m\",le=\"+Inf\"} 5\n"
        "tandem:time_to_first_token_seconds_sum{model=\"m\"} 13.4375\n"
        "tandem:time_to_first_token_seconds_count{model=\"m\"} 5\n");
}

TEST_CASE("histogram without labels and the bucket helpers") {
  Registry registry;
  auto* h = registry.histogram("step_ms", "Step.", tandem::obs::linear_buckets(1, 1, 2)).value();
  h->observe(1);
  CHECK(registry.render_prometheus() ==
        "# HELP step_ms Step.\n"
        "# TYPE step_ms histogram\n"
        "step_ms_bucket{le=\"1\"} 1\n"
        "step_ms_bucket{le=\"2\"} 1\n"
        "step_ms_bucket{le=\"+Inf\"} 1\n"
        "step_ms_sum 1\n"
        "step_ms_count 1\n");
  CHECK(tandem::obs::exponential_buckets(0.001, 10, 3) ==
        std::vector<double>{0.001, 0.001 * 10, 0.001 * 10 * 10});
}

TEST_CASE("label values and help text are escaped") {
  Registry registry;
  auto* c =
      registry
          .counter("escapes_total", "Line one\\two\nthree \"quoted\"", {{"path", "C:\\dir\n\"x\""}})
          .value();
  c->inc(2);
  CHECK(registry.render_prometheus() ==
        "# HELP escapes_total Line one\\\\two\\nthree \"quoted\"\n"
        "# TYPE escapes_total counter\n"
        "escapes_total{path=\"C:\\\\dir\\n\\\"x\\\"\"} 2\n");
}

TEST_CASE("bad names, labels, types and bounds are refused with invalid errors") {
  Registry registry;
  CHECK(registry.counter("9starts_with_digit", "").error().kind == ErrorKind::invalid);
  CHECK(registry.counter("has-dash", "").error().kind == ErrorKind::invalid);
  CHECK(registry.counter("", "").error().kind == ErrorKind::invalid);
  CHECK(registry.counter("ok", "", {{"bad-label", "x"}}).error().kind == ErrorKind::invalid);
  CHECK(registry.counter("ok", "", {{"__reserved", "x"}}).error().kind == ErrorKind::invalid);
  auto dup = registry.counter("ok", "", {{"a", "1"}, {"a", "2"}});
  REQUIRE_FALSE(dup.ok());
  CHECK(dup.error().message.find("duplicate label name 'a'") != std::string::npos);
  CHECK(registry.histogram("h", "", {1.0}, {{"le", "x"}}).error().kind == ErrorKind::invalid);
  CHECK(registry.histogram("h", "", {}).error().kind == ErrorKind::invalid);
  CHECK(registry.histogram("h", "", {2.0, 1.0}).error().kind == ErrorKind::invalid);
  CHECK(registry.histogram("h", "", {1.0, 1.0}).error().kind == ErrorKind::invalid);
  CHECK(registry.histogram("h", "", {1.0, std::nan("")}).error().kind == ErrorKind::invalid);
  REQUIRE(registry.gauge("shared_name", "").ok());
  auto clash = registry.counter("shared_name", "");
  REQUIRE_FALSE(clash.ok());
  CHECK(clash.error().message == "metric 'shared_name' already exists as a gauge");
  CHECK(registry.counter_double("shared_name", "").error().kind == ErrorKind::invalid);
  REQUIRE(registry.histogram("h2", "", {1.0, 2.0}).ok());
  CHECK(registry.histogram("h2", "", {1.0, 3.0}).error().kind == ErrorKind::invalid);
  CHECK(registry.series_count() == 2);  // failures created nothing
}

TEST_CASE("series bound refuses new series with overloaded but still returns existing ones") {
  Registry registry(3);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(registry.counter("hits_total", "", {{"user", std::to_string(i)}}).ok());
  }
  auto refused = registry.counter("hits_total", "", {{"user", "3"}});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().kind == ErrorKind::overloaded);
  CHECK(refused.error().message ==
        "metric series limit (3) reached; refusing hits_total{user=\"3\"}");
  CHECK(registry.gauge("other", "").error().kind == ErrorKind::overloaded);
  CHECK(registry.counter("hits_total", "", {{"user", "1"}}).ok());
  CHECK(registry.series_count() == 3);
}

TEST_CASE("concurrent updates from two threads sum exactly") {
  Registry registry;
  auto* counter = registry.counter("events_total", "").value();
  auto* gauge = registry.gauge("level", "").value();
  auto* histogram = registry.histogram("latency", "", {0.5}).value();
  constexpr int per_thread_count = 200000;
  auto work = [counter, gauge, histogram]() {
    for (int i = 0; i < per_thread_count; ++i) {
      counter->inc();
      gauge->add(1.0);
      histogram->observe(i % 2 == 0 ? 0.25 : 1.0);
    }
  };
  std::thread a(work), b(work);
  // Rendering concurrently with updates must be safe (values may be mid-way).
  for (int i = 0; i < 20; ++i) CHECK_FALSE(registry.render_prometheus().empty());
  a.join();
  b.join();
  CHECK(counter->value() == 2u * per_thread_count);
  CHECK(gauge->value() == 2.0 * per_thread_count);
  CHECK(histogram->count() == 2u * per_thread_count);
  CHECK(histogram->bucket_counts() == std::vector<uint64_t>{per_thread_count, per_thread_count});
  CHECK(histogram->sum() == 0.25 * per_thread_count + 1.0 * per_thread_count);
}

TEST_CASE("concurrent creation of the same series yields one object") {
  Registry registry;
  tandem::obs::Counter* seen[2] = {nullptr, nullptr};
  auto make = [&registry, &seen](int slot) {
    for (int i = 0; i < 1000; ++i) {
      auto* c = registry.counter("race_total", "", {{"i", std::to_string(i)}}).value();
      c->inc();
      if (i == 999) seen[slot] = c;
    }
  };
  std::thread a(make, 0), b(make, 1);
  a.join();
  b.join();
  CHECK(seen[0] == seen[1]);
  CHECK(seen[0]->value() == 2);
  CHECK(registry.series_count() == 1000);
}

TEST_CASE("format_value and name validators") {
  using tandem::obs::format_value;
  CHECK(format_value(0.005) == "0.005");
  CHECK(format_value(42) == "42");
  CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_value(std::nan("")) == "NaN");
  CHECK(tandem::obs::valid_metric_name("tandem:ttft_seconds"));
  CHECK(tandem::obs::valid_metric_name("_x9"));
  CHECK_FALSE(tandem::obs::valid_metric_name("a b"));
  CHECK(tandem::obs::valid_label_name("instance"));
  CHECK_FALSE(tandem::obs::valid_label_name("in:stance"));
}

TEST_CASE("RecentHistogram: quantiles over the last window only, interpolated in the bucket") {
  using namespace std::chrono_literals;
  using tandem::obs::RecentHistogram;
  RecentHistogram recent({1.0, 2.0, 4.0}, 60s, 5s);
  auto t = RecentHistogram::Clock::time_point{} + 1000s;
  CHECK_FALSE(recent.quantile(0.5).has_value());
  recent.record(t, {0, 0, 0, 0});
  CHECK(recent.count() == 0);
  // 10 observations in (1, 2]: the median interpolates to the middle of that bucket.
  recent.record(t + 10s, {0, 10, 0, 0});
  CHECK(recent.count() == 10);
  CHECK(*recent.quantile(0.5) == doctest::Approx(1.5));
  CHECK(*recent.quantile(1.0) == doctest::Approx(2.0));
  // 10 more in (2, 4] later: p90 lands in the upper bucket, p25 in the lower.
  recent.record(t + 40s, {0, 10, 10, 0});
  CHECK(*recent.quantile(0.25) == doctest::Approx(1.5));
  CHECK(*recent.quantile(0.9) == doctest::Approx(2.0 + 2.0 * 0.8));
  // 75 s on: the first ten left the window (base = the snapshot at 10 s).
  recent.record(t + 75s, {0, 10, 10, 0});
  CHECK(recent.count() == 10);
  CHECK(*recent.quantile(0.5) == doctest::Approx(3.0));
  // Past the last bound: the +Inf bucket answers the last finite bound.
  recent.record(t + 80s, {0, 10, 10, 30});
  CHECK(*recent.quantile(0.9) == doctest::Approx(4.0));
  // Nothing new for a whole window: no observations, no quantile.
  recent.record(t + 200s, {0, 10, 10, 30});
  recent.record(t + 270s, {0, 10, 10, 30});
  CHECK(recent.count() == 0);
  CHECK_FALSE(recent.quantile(0.5).has_value());
}
