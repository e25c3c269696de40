// tandem/obs: a metrics registry that renders the Prometheus text exposition format 0.0.4.
//
// A metric is one series: a family name, help text, a type and a label set. The registry
// hands out a stable pointer per series; asking again for the same name and labels returns
// the same object. Creation takes a mutex; updates after that are single relaxed atomic
// operations (no lock, no allocation), so they are cheap on any hot path and safe from any
// thread. The number of series is bounded by `series_max`: a label explosion is refused
// with an Error instead of eating memory.
//
// Names follow Prometheus rules: metric names match [a-zA-Z_:][a-zA-Z0-9_:]* (a colon is
// valid, as in `tandem:time_to_first_token_seconds`); label names match
// [a-zA-Z_][a-zA-Z0-9_]* and must not start with "__". Histograms reserve the label "le".
//
// The Registry is constructed by main (or a node) and passed by reference: there is no global.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::obs {

// Label name -> value. Order given by the caller does not matter: series identity and
// rendering use the labels sorted by name.
using Labels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { counter, gauge, histogram };
std::string_view to_string(MetricType type);  // "counter", "gauge", "histogram"

// Monotonic integer counter (events, tokens, bytes). Thread-safe; inc() is one atomic add.
class Counter {
 public:
  void inc(uint64_t delta = 1) { value_.fetch_add(delta, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Monotonic real-valued counter (e.g. total seconds spent). add() asserts delta >= 0 and
// finite: a negative increment is a bug in the caller. Thread-safe; one atomic add.
class CounterDouble {
 public:
  void add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue length, KV blocks free). Thread-safe.
class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Fixed-bucket histogram. Bounds are upper bounds (inclusive, "le"), strictly increasing and
// finite; an implicit +Inf bucket follows. observe() asserts the value is not NaN, then does
// one binary search over the bounds and two atomic adds. Thread-safe.
class Histogram {
 public:
  // Precondition (asserted): bounds valid as above (the Registry checks before constructing).
  explicit Histogram(std::vector<double> bounds);

  void observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket counts, NOT cumulative; size bounds().size() + 1 (the last is +Inf).
  std::vector<uint64_t> bucket_counts() const;
  uint64_t count() const;  // sum of bucket_counts()
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 entries
  std::atomic<double> sum_{0.0};
};

// Bucket bounds helpers. Preconditions (asserted): count >= 1, start > 0 (exponential),
// factor > 1, width > 0.
std::vector<double> exponential_buckets(double start, double factor, size_t count);
std::vector<double> linear_buckets(double start, double width, size_t count);

class Registry {
 public:
  // series_max: how many series (name + label set) may exist in total; >= 1 (asserted).
  explicit Registry(size_t series_max = 10000);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Each returns the series for (name, labels), creating it on first use. The pointer stays
  // valid for the Registry's lifetime. Errors (never asserted: names may come from config):
  //   invalid     bad metric or label name, duplicate label name, reserved label, the name
  //               already exists with another type (or, for histograms, other bounds),
  //               bad histogram bounds (empty, not strictly increasing, not finite)
  //   overloaded  creating it would exceed series_max
  // `help` is taken from the first call for a family; later calls may pass anything.
  // Thread-safe (takes the registry mutex).
  Result<Counter*> counter(std::string_view name, std::string_view help, Labels labels = {});
  Result<CounterDouble*> counter_double(std::string_view name, std::string_view help,
                                        Labels labels = {});
  Result<Gauge*> gauge(std::string_view name, std::string_view help, Labels labels = {});
  Result<Histogram*> histogram(std::string_view name, std::string_view help,
                               std::vector<double> bounds, Labels labels = {});

  // Prometheus text format 0.0.4 of every family, in creation order; series in creation
  // order within a family. Thread-safe (takes the mutex; reads values with relaxed loads, so
  // a concurrent update may or may not be included). Content type:
  // "text/plain; version=0.0.4; charset=utf-8" (see prometheus_content_type).
  std::string render_prometheus() const;

  size_t series_count() const;
  size_t series_max() const { return series_max_; }

 private:
  struct Series;
  struct Family;
  Result<Series*> find_or_create(std::string_view name, std::string_view help, MetricType type,
                                 bool is_double, const std::vector<double>* bounds, Labels labels);

  size_t series_max_;
  size_t series_count_ = 0;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_;  // creation order
  std::map<std::string, Family*, std::less<>> by_name_;
};

inline constexpr std::string_view prometheus_content_type =
    "text/plain; version=0.0.4; charset=utf-8";

// Exposition helpers, exposed for tests and other renderers.
std::string escape_label_value(std::string_view value);  // \ -> \\, " -> \", newline -> \n
std::string escape_help(std::string_view help);          // \ -> \\, newline -> \n
std::string format_value(double value);                  // shortest round-trip; +Inf, -Inf, NaN
bool valid_metric_name(std::string_view name);
bool valid_label_name(std::string_view name);

}  // namespace tandem::obs
