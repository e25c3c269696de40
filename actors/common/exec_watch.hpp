// Watches the executor request a prefill or decode shell has in flight, so that a device step
// that hangs ends with an error instead of holding its requests forever. No CAF timer per
// request (each would cost the clock thread two wakeups per token): the shell's periodic tick
// asks expired(). Pure: no clocks or threads; the caller passes `now`.
//
// A request that timed out is abandoned: its answer, whenever it comes, is late (answered()
// says so) and clears the stall; until then the shell plans no step and reports itself not
// ready, so routers and /health see it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::actors {

class ExecWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ExecWatch(std::chrono::milliseconds timeout) : timeout_(timeout) {
    RT_ASSERT(timeout_.count() > 0, timeout_.count());
  }
  // A request goes out; its generation, to hand to answered().
  uint64_t start(Clock::time_point now) {
    RT_ASSERT(!since_, "one executor request in flight at a time");
    since_ = now;
    return ++generation_;
  }
  // Its answer arrived: true when it is the request in flight (handle it), false when it is
  // late (it was abandoned: ignore it; the executor answers again, so the stall ends).
  bool answered(uint64_t generation, Clock::time_point now) {
    RT_ASSERT(generation <= generation_, generation, generation_);
    if (generation == generation_ && since_) {
      since_.reset();
      return true;
    }
    if (stalled_since_) {
      late_by_ = now - *stalled_since_;
      stalled_since_.reset();
    }
    return false;
  }
  // True once, when the request in flight has waited past the timeout: it is abandoned.
  bool expired(Clock::time_point now) {
    if (!since_ || now - *since_ < timeout_) return false;
    since_.reset();
    ++generation_;  // its answer will not match
    stalled_since_ = now;
    ++timeouts_;
    return true;
  }
  // The executor's device takes no more work (an answer said so: ExecResult::device_lost):
  // for good, the shell plans no step and reports not ready with `reason`. The first reason
  // stays. Returns true the first time (to log it once).
  bool lose(const std::string& reason) {
    if (!lost_.empty() || reason.empty()) return false;
    lost_ = reason;
    return true;
  }
  bool lost() const { return !lost_.empty(); }
  bool in_flight() const { return since_.has_value(); }
  bool stalled() const { return stalled_since_.has_value() || lost(); }
  std::string stall_reason() const {
    if (lost()) return "executor device lost: " + lost_;
    return "executor step timed out after " + std::to_string(timeout_.count()) +
           " ms and has not answered since";
  }
  // How long after the abandonment the last late answer came, and that said for the log.
  Clock::duration late_by() const { return late_by_; }
  std::string late_text() const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(late_by_).count();
    return "the executor answered " + std::to_string(ms) +
           " ms after its step timed out; serving again";
  }
  uint64_t timeouts_count() const { return timeouts_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
  uint64_t generation_ = 0;
  std::optional<Clock::time_point> since_;          // the request in flight went out then
  std::optional<Clock::time_point> stalled_since_;  // abandoned then; not answered since
  Clock::duration late_by_{};
  uint64_t timeouts_ = 0;
  std::string lost_;
};

}  // namespace tandem::actors
