// Quantiles of a histogram over the recent past (the admin shell's `status` and the status
// page: TTFT and ITL p50/p90 over the last minute). Prometheus histograms are cumulative since
// the process started; this keeps snapshots of their bucket counts every `step` and answers
// from the difference between now and the snapshot a window ago, interpolating inside the
// bucket as Prometheus' histogram_quantile does.
//
// Pure: no clocks, no threads; the caller passes `now` and the current counts. Bounded: at most
// window / step + 1 snapshots. One owner (the gateway actor calls it from its tick).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace tandem::obs {

class RecentHistogram {
 public:
  using Clock = std::chrono::steady_clock;
  // bounds: the histogram's bucket upper bounds (strictly increasing, finite; asserted);
  // window >= step > 0 (asserted).
  RecentHistogram(std::vector<double> bounds, std::chrono::milliseconds window,
                  std::chrono::milliseconds step);

  // `counts`: per-bucket counts (not cumulative), bounds.size() + 1 of them (asserted), never
  // below an earlier call's (the histogram only grows). Snapshots at most once per step.
  void record(Clock::time_point now, const std::vector<uint64_t>& counts);

  // Observations in the window ending at the last record(), and their q-quantile (q in [0, 1],
  // asserted); nullopt when none. A quantile in the +Inf bucket answers the last finite bound.
  uint64_t count() const;
  std::optional<double> quantile(double q) const;

 private:
  struct Snapshot {
    Clock::time_point at;
    std::vector<uint64_t> counts;
  };
  std::vector<double> bounds_;
  std::chrono::milliseconds window_, step_;
  std::deque<Snapshot> snapshots_;  // oldest first; at most window_ / step_ + 2
  std::vector<uint64_t> latest_;    // the last counts recorded
  std::vector<uint64_t> delta() const;
};

}  // namespace tandem::obs
