// Membership: which peer nodes are up. A pure core: no clocks, threads or I/O; the node
// actor passes `now` in and turns the returned events into messages.
//
// A peer is up from the first hello/heartbeat heard from it. It is declared down when
// nothing was heard for heartbeat_interval * heartbeat_miss_max. It is up again (event
// `up`, or `restarted` when its incarnation changed) as soon as it is heard from again.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::runtime {

using Clock = std::chrono::steady_clock;

enum class PeerState { unknown, up, down };
std::string_view to_string(PeerState state);

struct MembershipEvent {
  enum class Kind { up, down, restarted } kind;
  std::string node;
  friend bool operator==(const MembershipEvent&, const MembershipEvent&) = default;
};

struct PeerView {
  std::string node;
  PeerState state = PeerState::unknown;
  uint64_t incarnation = 0;
  std::optional<Clock::time_point> last_heard;
  std::chrono::milliseconds uptime_at_last_heard{0};
};

class Membership {
 public:
  // peers: every other node of the cluster (not this one). Preconditions (asserted):
  // interval > 0, miss_max >= 1, no duplicates, not more than peers_max.
  Membership(std::vector<std::string> peers, std::chrono::milliseconds interval,
             uint32_t miss_max);

  static constexpr size_t peers_max = 100000;

  // A hello or heartbeat from `node`. Unknown nodes are ignored (returns nullopt): only
  // manifest members are tracked. Returns the event this causes, if any.
  std::optional<MembershipEvent> heard(const std::string& node, uint64_t incarnation,
                                       std::chrono::milliseconds uptime, Clock::time_point now);

  // Declares down every up peer not heard within the window. Call every interval.
  std::vector<MembershipEvent> tick(Clock::time_point now);

  // What a subscriber that arrives now must be told so that its view equals ours: an `up`
  // for every peer that is up (it starts with every peer down), in name order.
  std::vector<MembershipEvent> current() const;

  const std::map<std::string, PeerView>& peers() const { return peers_; }
  bool is_up(const std::string& node) const;
  size_t up_count() const;
  std::chrono::milliseconds down_after() const { return interval_ * miss_max_; }

 private:
  std::map<std::string, PeerView> peers_;
  std::chrono::milliseconds interval_;
  uint32_t miss_max_;
};

}  // namespace tandem::runtime
