#include "runtime/node/membership.hpp"

#include "runtime/base/assert.hpp"

namespace tandem::runtime {

std::string_view to_string(PeerState state) {
  switch (state) {
    case PeerState::unknown: return "unknown";
    case PeerState::up: return "up";
    case PeerState::down: return "down";
  }
  return "unknown";
}

Membership::Membership(std::vector<std::string> peers, std::chrono::milliseconds interval,
                       uint32_t miss_max)
    : interval_(interval), miss_max_(miss_max) {
  RT_ASSERT(interval.count() > 0, interval.count());
  RT_ASSERT(miss_max >= 1, miss_max);
  RT_ASSERT(peers.size() <= peers_max, peers.size());
  for (auto& node : peers) {
    RT_ASSERT(!peers_.count(node), "duplicate peer", node);
    PeerView view;
    view.node = node;
    peers_.emplace(std::move(node), std::move(view));
  }
}

std::optional<MembershipEvent> Membership::heard(const std::string& node, uint64_t incarnation,
                                                 std::chrono::milliseconds uptime,
                                                 Clock::time_point now) {
  auto it = peers_.find(node);
  if (it == peers_.end()) return std::nullopt;
  PeerView& view = it->second;
  PeerState before = view.state;
  uint64_t incarnation_before = view.incarnation;
  view.last_heard = now;
  view.uptime_at_last_heard = uptime;
  view.incarnation = incarnation;
  view.state = PeerState::up;
  RT_ASSERT(view.state == PeerState::up);
  if (before == PeerState::up && incarnation_before != incarnation) {
    return MembershipEvent{MembershipEvent::Kind::restarted, node};
  }
  if (before != PeerState::up) return MembershipEvent{MembershipEvent::Kind::up, node};
  return std::nullopt;
}

std::vector<MembershipEvent> Membership::tick(Clock::time_point now) {
  std::vector<MembershipEvent> events;
  for (auto& [node, view] : peers_) {
    if (view.state != PeerState::up) continue;
    RT_ASSERT(view.last_heard.has_value(), node);
    if (now - *view.last_heard >= down_after()) {
      view.state = PeerState::down;
      events.push_back({MembershipEvent::Kind::down, node});
    }
  }
  return events;
}

bool Membership::is_up(const std::string& node) const {
  auto it = peers_.find(node);
  return it != peers_.end() && it->second.state == PeerState::up;
}

size_t Membership::up_count() const {
  size_t count = 0;
  for (const auto& [node, view] : peers_) count += view.state == PeerState::up;
  return count;
}

std::vector<MembershipEvent> Membership::current() const {
  std::vector<MembershipEvent> events;
  for (const auto& [node, view] : peers_) {
    if (view.state == PeerState::up) events.push_back({MembershipEvent::Kind::up, node});
  }
  return events;
}

}  // namespace tandem::runtime
