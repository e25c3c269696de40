#include "runtime/obs/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

namespace tandem::obs {

std::string_view to_string(MetricType type) {
  switch (type) {
    case MetricType::counter:
      return "counter";
    case MetricType::gauge:
      return "gauge";
    case MetricType::histogram:
      return "histogram";
  }
  RT_ASSERT(false, "unknown MetricType", static_cast<int>(type));
}

void CounterDouble::add(double delta) {
  RT_ASSERT(std::isfinite(delta), "counter increment must be finite:", delta);
  RT_ASSERT(delta >= 0.0, "counter increment must not be negative:", delta);
  value_.fetch_add(delta, std::memory_order_relaxed);
}

namespace {

bool valid_bounds(const std::vector<double>& bounds) {
  if (bounds.empty()) return false;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) return false;
    if (i > 0 && !(bounds[i - 1] < bounds[i])) return false;
  }
  return true;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  RT_ASSERT(valid_bounds(bounds_), "histogram bounds must be finite and strictly increasing");
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double value) {
  RT_ASSERT(!std::isnan(value), "histogram observation is NaN");
  // First bound >= value: "le" semantics. Values above every bound land in +Inf.
  auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  size_t index = static_cast<size_t>(it - bounds_.begin());
  RT_ASSERT(index <= bounds_.size(), index, bounds_.size());
  buckets_[index].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t Histogram::count() const {
  uint64_t total = 0;
  for (uint64_t c : bucket_counts()) total += c;
  return total;
}

std::vector<double> exponential_buckets(double start, double factor, size_t count) {
  RT_ASSERT(count >= 1, count);
  RT_ASSERT(start > 0.0, start);
  RT_ASSERT(factor > 1.0, factor);
  std::vector<double> out;
  out.reserve(count);
  for (double v = start; out.size() < count; v *= factor) out.push_back(v);
  return out;
}

std::vector<double> linear_buckets(double start, double width, size_t count) {
  RT_ASSERT(count >= 1, count);
  RT_ASSERT(width > 0.0, width);
  std::vector<double> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) out.push_back(start + width * static_cast<double>(i));
  return out;
}

// ---- exposition helpers ----

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  RT_ASSERT(ec == std::errc(), "to_chars failed for", value);
  return std::string(buf, end);
}

namespace {

bool is_alpha_or_underscore(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

bool valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = is_alpha_or_underscore(c) || c == ':' || (i > 0 && is_digit(c));
    if (!ok) return false;
  }
  return true;
}

bool valid_label_name(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (!(is_alpha_or_underscore(c) || (i > 0 && is_digit(c)))) return false;
  }
  return true;
}

// ---- registry ----

struct Registry::Series {
  Labels labels;  // sorted by name
  std::unique_ptr<Counter> counter;
  std::unique_ptr<CounterDouble> counter_double;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

struct Registry::Family {
  std::string name;
  std::string help;
  MetricType type = MetricType::counter;
  bool is_double = false;                       // counters only: CounterDouble rather than Counter
  std::vector<double> bounds;                   // histograms only
  std::vector<std::unique_ptr<Series>> series;  // creation order
  std::map<std::string, Series*> by_labels;     // key: encoded sorted labels
};

namespace {

std::string describe_series(std::string_view name, const Labels& labels) {
  std::string out(name);
  if (labels.empty()) return out;
  out += '{';
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
  }
  return out + '}';
}

// Sorts labels and checks their names. Returns an empty string when fine, else the problem.
std::string normalize_labels(Labels& labels, MetricType type) {
  std::sort(labels.begin(), labels.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& key = labels[i].first;
    if (!valid_label_name(key)) return "invalid label name '" + key + "'";
    if (type == MetricType::histogram && key == "le") return "label 'le' is reserved";
    if (i > 0 && labels[i - 1].first == key) return "duplicate label name '" + key + "'";
  }
  return {};
}

std::string encode_labels(const Labels& labels) {
  std::string key;
  for (const auto& [k, v] : labels) {
    key += k;
    key += '\0';
    key += v;
    key += '\0';
  }
  return key;
}

// Validates a request and sorts its labels. Returns "" when fine, else the problem.
std::string check_request(std::string_view name, Labels& labels, MetricType type,
                          const std::vector<double>* bounds) {
  if (!valid_metric_name(name)) return "invalid metric name '" + std::string(name) + "'";
  if (std::string problem = normalize_labels(labels, type); !problem.empty()) {
    return "metric '" + std::string(name) + "': " + problem;
  }
  if (bounds && !valid_bounds(*bounds)) {
    return "histogram '" + std::string(name) +
           "': bounds must be non-empty, finite and strictly increasing";
  }
  return {};
}

}  // namespace

Registry::Registry(size_t series_max) : series_max_(series_max) {
  RT_ASSERT(series_max_ >= 1, "series_max must be at least 1");
}

Registry::~Registry() = default;

size_t Registry::series_count() const {
  std::lock_guard lock(mutex_);
  return series_count_;
}

Result<Registry::Series*> Registry::find_or_create(std::string_view name, std::string_view help,
                                                   MetricType type, bool is_double,
                                                   const std::vector<double>* bounds,
                                                   Labels labels) {
  RT_ASSERT((type == MetricType::histogram) == (bounds != nullptr), to_string(type));
  if (std::string problem = check_request(name, labels, type, bounds); !problem.empty()) {
    return make_error(ErrorKind::invalid, problem);
  }
  std::lock_guard lock(mutex_);
  Family* family = nullptr;
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    family = it->second;
    if (family->type != type || family->is_double != is_double) {
      return make_error(ErrorKind::invalid, "metric '" + std::string(name) +
                                                "' already exists as a " +
                                                std::string(to_string(family->type)) +
                                                (family->is_double ? " (double)" : ""));
    }
    if (bounds && family->bounds != *bounds) {
      return make_error(ErrorKind::invalid, "histogram '" + std::string(name) +
                                                "' already exists with other bucket bounds");
    }
  }
  std::string key = encode_labels(labels);
  if (family) {
    if (auto it = family->by_labels.find(key); it != family->by_labels.end()) return it->second;
  }
  if (series_count_ >= series_max_) {
    return make_error(ErrorKind::overloaded, "metric series limit (" + std::to_string(series_max_) +
                                                 ") reached; refusing " +
                                                 describe_series(name, labels));
  }
  if (!family) {
    auto owned = std::make_unique<Family>();
    owned->name = std::string(name);
    owned->help = std::string(help);
    owned->type = type;
    owned->is_double = is_double;
    if (bounds) owned->bounds = *bounds;
    family = owned.get();
    families_.push_back(std::move(owned));
    by_name_.emplace(family->name, family);
  }
  auto series = std::make_unique<Series>();
  series->labels = std::move(labels);
  // The metric object is made under the lock, so concurrent first calls share one object.
  if (type == MetricType::histogram) {
    series->histogram = std::make_unique<Histogram>(*bounds);
  } else if (type == MetricType::gauge) {
    series->gauge = std::make_unique<Gauge>();
  } else if (is_double) {
    series->counter_double = std::make_unique<CounterDouble>();
  } else {
    series->counter = std::make_unique<Counter>();
  }
  Series* raw = series.get();
  family->series.push_back(std::move(series));
  family->by_labels.emplace(std::move(key), raw);
  ++series_count_;
  RT_ASSERT(series_count_ <= series_max_, series_count_, series_max_);
  return raw;
}

Result<Counter*> Registry::counter(std::string_view name, std::string_view help, Labels labels) {
  auto series = find_or_create(name, help, MetricType::counter, false, nullptr, std::move(labels));
  if (!series) return series.error();
  RT_ASSERT((*series)->counter != nullptr, name);
  return (*series)->counter.get();
}

Result<CounterDouble*> Registry::counter_double(std::string_view name, std::string_view help,
                                                Labels labels) {
  auto series = find_or_create(name, help, MetricType::counter, true, nullptr, std::move(labels));
  if (!series) return series.error();
  RT_ASSERT((*series)->counter_double != nullptr, name);
  return (*series)->counter_double.get();
}

Result<Gauge*> Registry::gauge(std::string_view name, std::string_view help, Labels labels) {
  auto series = find_or_create(name, help, MetricType::gauge, false, nullptr, std::move(labels));
  if (!series) return series.error();
  RT_ASSERT((*series)->gauge != nullptr, name);
  return (*series)->gauge.get();
}

Result<Histogram*> Registry::histogram(std::string_view name, std::string_view help,
                                       std::vector<double> bounds, Labels labels) {
  auto series =
      find_or_create(name, help, MetricType::histogram, false, &bounds, std::move(labels));
  if (!series) return series.error();
  RT_ASSERT((*series)->histogram != nullptr, name);
  return (*series)->histogram.get();
}

namespace {

// `{a="x",b="y"}` or "" when there are no labels; `extra` (e.g. le="0.5") goes last.
std::string render_labels(const Labels& labels, std::string_view extra = {}) {
  if (labels.empty() && extra.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
  }
  if (!extra.empty()) {
    if (!labels.empty()) out += ',';
    out += extra;
  }
  return out + '}';
}

void render_histogram(std::string& out, const std::string& name, const Labels& labels,
                      const Histogram& histogram) {
  std::vector<uint64_t> counts = histogram.bucket_counts();
  const std::vector<double>& bounds = histogram.bounds();
  RT_ASSERT(counts.size() == bounds.size() + 1, counts.size(), bounds.size());
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    std::string le = i < bounds.size() ? format_value(bounds[i]) : "+Inf";
    out += name + "_bucket" + render_labels(labels, "le=\"" + le + '"') + ' ' +
           std::to_string(cumulative) + '\n';
  }
  out += name + "_sum" + render_labels(labels) + ' ' + format_value(histogram.sum()) + '\n';
  out += name + "_count" + render_labels(labels) + ' ' + std::to_string(cumulative) + '\n';
}

}  // namespace

std::string Registry::render_prometheus() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& family : families_) {
    out += "# HELP " + family->name + ' ' + escape_help(family->help) + '\n';
    out += "# TYPE " + family->name + ' ' + std::string(to_string(family->type)) + '\n';
    for (const auto& series : family->series) {
      std::string head = family->name + render_labels(series->labels) + ' ';
      if (series->counter) {
        out += head + std::to_string(series->counter->value()) + '\n';
      } else if (series->counter_double) {
        out += head + format_value(series->counter_double->value()) + '\n';
      } else if (series->gauge) {
        out += head + format_value(series->gauge->value()) + '\n';
      } else {
        RT_ASSERT(series->histogram != nullptr, family->name);
        render_histogram(out, family->name, series->labels, *series->histogram);
      }
    }
  }
  return out;
}

}  // namespace tandem::obs
