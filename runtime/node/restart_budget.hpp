// The restart policy of a supervisor, as a pure core: how many restarts one child (an actor in
// a node's supervisor, a node process under `tandem up`) may have within a window, and how long
// to wait before each. A crash loop therefore ends in a child that stays down (and a /health or
// a launcher message that says so), not in silent restarts forever.
// No clock reads: the caller passes `now`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

#include "runtime/base/assert.hpp"

namespace tandem::runtime {

// A node process's exit status after one of its executors' devices was lost for good and
// [supervisor] device_lost = "restart-node" (run_node): EX_TEMPFAIL, "start me again". `tandem up`
// names it in its message; systemd's Restart=on-failure restarts it like any failure.
inline constexpr int kExitDeviceLost = 75;

// From the manifest's [supervisor] section (config/manifest.hpp: SupervisorSection) for actors;
// from `tandem up`'s flags for node processes.
struct RestartPolicy {
  uint32_t restarts_max = 5;                    // per child, within window_ms; 0: never restart
  std::chrono::milliseconds window_ms{60'000};  // sliding window for restarts_max
  std::chrono::milliseconds delay_ms{500};      // from the crash to the replacement (the first)
  // Above delay_ms: each further restart doubles the delay up to this (next_delay); a child
  // that ran a whole window before it failed starts over at delay_ms. 0: the delay is constant.
  std::chrono::milliseconds delay_max_ms{0};
};

// The restarts of one child. Holds at most policy.restarts_max timestamps.
class RestartBudget {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RestartBudget(RestartPolicy policy) : policy_(policy), delay_(policy.delay_ms) {
    RT_ASSERT(policy_.window_ms.count() > 0, policy_.window_ms.count());
    RT_ASSERT(policy_.delay_ms.count() >= 0, policy_.delay_ms.count());
    RT_ASSERT(policy_.delay_max_ms.count() == 0 || policy_.delay_max_ms >= policy_.delay_ms,
              policy_.delay_max_ms.count(), policy_.delay_ms.count());
  }
  // True, and the restart is recorded, when fewer than restarts_max restarts happened in the
  // window ending at `now`; false when the budget is spent (the child stays down).
  bool allow(Clock::time_point now) {
    forget_before(now);
    if (restarts_.size() >= policy_.restarts_max) return false;
    RT_ASSERT(restarts_.empty() || restarts_.back() <= now, "time went backwards");
    restarts_.push_back(now);
    RT_ASSERT(restarts_.size() <= policy_.restarts_max, restarts_.size());
    return true;
  }
  // The child failed at `now` after running `ran_for`: the delay before its replacement (the
  // restart is recorded at now + delay), or nothing when the budget is spent. With
  // delay_max_ms set the delay doubles per restart up to it.
  std::optional<std::chrono::milliseconds> next_delay(Clock::time_point now,
                                                      std::chrono::milliseconds ran_for) {
    forget_before(now);
    if (restarts_.size() >= policy_.restarts_max) return std::nullopt;
    if (ran_for >= policy_.window_ms) delay_ = policy_.delay_ms;  // it had settled
    std::chrono::milliseconds delay = delay_;
    if (policy_.delay_max_ms > policy_.delay_ms) {
      delay_ = std::min(policy_.delay_max_ms, std::max(delay_ * 2, std::chrono::milliseconds(1)));
    }
    restarts_.push_back(now + delay);
    RT_ASSERT(restarts_.size() <= policy_.restarts_max, restarts_.size());
    RT_ASSERT(delay >= policy_.delay_ms, delay.count());
    return delay;
  }
  // Restarts recorded in the window ending at `now`.
  uint32_t restarts_in_window(Clock::time_point now) const {
    uint32_t n = 0;
    for (auto at : restarts_) n += now - at < policy_.window_ms ? 1 : 0;
    return n;
  }
  size_t recent_count() const { return restarts_.size(); }
  const RestartPolicy& policy() const { return policy_; }

 private:
  void forget_before(Clock::time_point now) {
    while (!restarts_.empty() && now - restarts_.front() >= policy_.window_ms) {
      restarts_.pop_front();
    }
  }

  RestartPolicy policy_;
  std::deque<Clock::time_point> restarts_;
  std::chrono::milliseconds delay_;  // the next restart's delay (next_delay)
};

}  // namespace tandem::runtime
