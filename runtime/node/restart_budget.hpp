// The restart policy of a node's supervisor, as a pure core: how many restarts one actor may
// have within a window, and how long to wait before each. A crash loop therefore ends in an
// actor that stays down (and a node whose /health says so), not in silent restarts forever.
// No clock reads: the caller passes `now`.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>

#include "runtime/base/assert.hpp"

namespace tandem::runtime {

// From the manifest's [supervisor] section (config/manifest.hpp: SupervisorSection).
struct RestartPolicy {
  uint32_t restarts_max = 5;                    // per actor, within window_ms
  std::chrono::milliseconds window_ms{60'000};  // sliding window for restarts_max
  std::chrono::milliseconds delay_ms{500};      // from the crash to the replacement
};

// The restarts of one actor. Holds at most policy.restarts_max timestamps.
class RestartBudget {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RestartBudget(RestartPolicy policy) : policy_(policy) {
    RT_ASSERT(policy_.restarts_max >= 1, policy_.restarts_max);
    RT_ASSERT(policy_.window_ms.count() > 0, policy_.window_ms.count());
  }
  // True, and the restart is recorded, when fewer than restarts_max restarts happened in the
  // window ending at `now`; false when the budget is spent (the actor stays down).
  bool allow(Clock::time_point now) {
    while (!restarts_.empty() && now - restarts_.front() >= policy_.window_ms) {
      restarts_.pop_front();
    }
    if (restarts_.size() >= policy_.restarts_max) return false;
    RT_ASSERT(restarts_.empty() || restarts_.back() <= now, "time went backwards");
    restarts_.push_back(now);
    RT_ASSERT(restarts_.size() <= policy_.restarts_max, restarts_.size());
    return true;
  }
  size_t recent_count() const { return restarts_.size(); }
  const RestartPolicy& policy() const { return policy_; }

 private:
  RestartPolicy policy_;
  std::deque<Clock::time_point> restarts_;
};

}  // namespace tandem::runtime
