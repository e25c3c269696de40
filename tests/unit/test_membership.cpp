// The membership core under a virtual clock.
#include <doctest.h>

#include "runtime/node/membership.hpp"

using namespace tandem::runtime;
using namespace std::chrono_literals;
using Kind = MembershipEvent::Kind;

TEST_CASE("a peer is up when heard, down after the configured misses, up again when back") {
  Membership m({"b", "c"}, 100ms, 5);
  Clock::time_point t0{};
  CHECK(m.up_count() == 0);
  CHECK(m.peers().at("b").state == PeerState::unknown);
  auto up = m.heard("b", 1, 0ms, t0);
  REQUIRE(up);
  CHECK(*up == MembershipEvent{Kind::up, "b"});
  CHECK_FALSE(m.heard("b", 1, 100ms, t0 + 100ms));  // still up: no event
  CHECK(m.tick(t0 + 599ms).empty());                 // 499 ms of silence < 500 ms
  auto down = m.tick(t0 + 600ms);
  REQUIRE(down.size() == 1);
  CHECK(down[0] == MembershipEvent{Kind::down, "b"});
  CHECK(m.tick(t0 + 700ms).empty());  // reported once
  CHECK_FALSE(m.is_up("b"));
  auto back = m.heard("b", 2, 0ms, t0 + 900ms);
  REQUIRE(back);
  CHECK(back->kind == Kind::up);
  CHECK(m.is_up("b"));
}

TEST_CASE("a new incarnation while up is a restart; unknown nodes are ignored") {
  Membership m({"b"}, 50ms, 2);
  Clock::time_point t0{};
  (void)m.heard("b", 7, 0ms, t0);
  auto restarted = m.heard("b", 8, 0ms, t0 + 10ms);
  REQUIRE(restarted);
  CHECK(restarted->kind == Kind::restarted);
  CHECK_FALSE(m.heard("stranger", 1, 0ms, t0));
  CHECK(m.peers().size() == 1);
  CHECK(m.down_after() == 100ms);
}

TEST_CASE("current(): an up event per up peer, for a subscriber that arrives late") {
  Membership m({"b", "c", "d"}, 100ms, 5);
  Clock::time_point t0{};
  CHECK(m.current().empty());
  (void)m.heard("d", 1, 0ms, t0);
  (void)m.heard("b", 1, 0ms, t0);
  CHECK(m.current() == std::vector<MembershipEvent>{{Kind::up, "b"}, {Kind::up, "d"}});
  (void)m.heard("d", 1, 0ms, t0 + 600ms);  // d keeps talking; b falls silent
  (void)m.tick(t0 + 600ms);
  CHECK(m.current() == std::vector<MembershipEvent>{{Kind::up, "d"}});
}
