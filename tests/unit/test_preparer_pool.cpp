// The gateway's preparer pool: each request goes to the least loaded preparer (by body
// bytes not yet prepared); equal loads take turns; done() takes the load off.
#include <doctest.h>

#include <set>

#include "actors/gateway/preparer_pool.hpp"

using tandem::gateway::PreparerPool;

TEST_CASE("preparer pool: idle preparers take turns; a loaded one is passed over") {
  PreparerPool pool(3);
  REQUIRE(pool.size() == 3);
  std::set<size_t> first_three;
  for (int i = 0; i < 3; ++i) {
    size_t slot = pool.pick(10);
    first_three.insert(slot);
    pool.done(slot, 10);
  }
  CHECK(first_three.size() == 3);  // idle: round robin, not always slot 0
  // A long prompt occupies one preparer: every short request meanwhile goes elsewhere.
  size_t busy = pool.pick(5'000'000);
  CHECK(pool.load(busy) == 5'000'000);
  for (int i = 0; i < 20; ++i) {
    size_t slot = pool.pick(100);
    CHECK(slot != busy);
    pool.done(slot, 100);
  }
  // Two loaded: the lighter one is picked.
  size_t second = pool.pick(1'000);
  CHECK(second != busy);
  size_t third = pool.pick(10);
  CHECK(third != busy);
  CHECK(third != second);
  size_t next = pool.pick(10);
  CHECK(next == third);  // 10 + 10 < 1,000 < 5,000,000
  pool.done(next, 10);
  pool.done(third, 10);
  pool.done(second, 1'000);
  pool.done(busy, 5'000'000);
  for (size_t s = 0; s < pool.size(); ++s) CHECK(pool.load(s) == 0);
}

TEST_CASE("preparer pool: one preparer takes everything") {
  PreparerPool pool(1);
  CHECK(pool.pick(7) == 0);
  CHECK(pool.pick(9) == 0);
  CHECK(pool.load(0) == 16);
  pool.done(0, 7);
  CHECK(pool.load(0) == 9);
}
