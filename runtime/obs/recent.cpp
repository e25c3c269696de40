#include "runtime/obs/recent.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "runtime/base/assert.hpp"

namespace tandem::obs {

RecentHistogram::RecentHistogram(std::vector<double> bounds, std::chrono::milliseconds window,
                                 std::chrono::milliseconds step)
    : bounds_(std::move(bounds)), window_(window), step_(step) {
  RT_ASSERT(step_.count() > 0 && window_ >= step_, step_.count(), window_.count());
  RT_ASSERT(!bounds_.empty(), "a histogram has bounds");
  for (size_t i = 1; i < bounds_.size(); ++i) RT_ASSERT(bounds_[i - 1] < bounds_[i], i);
  latest_.assign(bounds_.size() + 1, 0);
}

void RecentHistogram::record(Clock::time_point now, const std::vector<uint64_t>& counts) {
  RT_ASSERT(counts.size() == bounds_.size() + 1, counts.size(), bounds_.size());
  for (size_t i = 0; i < counts.size(); ++i) RT_ASSERT(counts[i] >= latest_[i], i);
  latest_ = counts;
  if (snapshots_.empty() || now - snapshots_.back().at >= step_) {
    snapshots_.push_back({now, counts});
  }
  // Keep the newest snapshot at or before now - window (the window's base) and what follows.
  while (snapshots_.size() >= 2 && now - snapshots_[1].at >= window_) snapshots_.pop_front();
  RT_ASSERT(snapshots_.size() <= static_cast<size_t>(window_ / step_) + 2, snapshots_.size());
}

std::vector<uint64_t> RecentHistogram::delta() const {
  std::vector<uint64_t> out = latest_;
  if (snapshots_.empty()) return out;
  const std::vector<uint64_t>& base = snapshots_.front().counts;
  // Only a full window's base is subtracted; before the first window has passed, the counts
  // since the first record are what there is (the first snapshot is that base).
  for (size_t i = 0; i < out.size(); ++i) out[i] -= base[i];
  return out;
}

uint64_t RecentHistogram::count() const {
  uint64_t n = 0;
  for (uint64_t c : delta()) n += c;
  return n;
}

std::optional<double> RecentHistogram::quantile(double q) const {
  RT_ASSERT(q >= 0.0 && q <= 1.0, q);
  std::vector<uint64_t> d = delta();
  uint64_t total = 0;
  for (uint64_t c : d) total += c;
  if (total == 0) return std::nullopt;
  double rank = q * static_cast<double>(total);
  uint64_t below = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    if (static_cast<double>(below + d[i]) < rank || d[i] == 0) {
      below += d[i];
      continue;
    }
    if (i == bounds_.size()) return bounds_.back();  // the +Inf bucket
    double lower = i == 0 ? 0.0 : bounds_[i - 1];
    double fraction = (rank - static_cast<double>(below)) / static_cast<double>(d[i]);
    double value = lower + (bounds_[i] - lower) * std::clamp(fraction, 0.0, 1.0);
    RT_ASSERT(value >= lower && value <= bounds_[i], value);
    return value;
  }
  return bounds_.back();
}

}  // namespace tandem::obs
