#include <doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kvstore/prefix_cache.hpp"

using tandem::ErrorKind;
using tandem::kv::BlockHash;
using tandem::kv::BlockIndex;
using tandem::kv::CommitOutcome;
using tandem::kv::PrefixCache;

namespace {

BlockHash h(uint32_t n) {
  BlockHash out;
  for (int i = 0; i < 4; ++i) out.bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  out.bytes[31] = 0xab;
  return out;
}

std::vector<BlockHash> chain(uint32_t first, uint32_t count) {
  std::vector<BlockHash> out;
  for (uint32_t i = 0; i < count; ++i) out.push_back(h(first + i));
  return out;
}

// Acquires all-fresh blocks for `hashes` and commits them, as a prefill of a new prompt does.
std::vector<BlockIndex> fill(PrefixCache& cache, const std::vector<BlockHash>& hashes) {
  auto a = cache.acquire({}, static_cast<uint32_t>(hashes.size()));
  REQUIRE(a.ok());
  for (size_t i = 0; i < hashes.size(); ++i) {
    CHECK(cache.commit(a->fresh[i], hashes[i]) == CommitOutcome::stored);
  }
  cache.check_invariants();
  return a->fresh;
}

}  // namespace

TEST_CASE("hits, misses and counters") {
  PrefixCache cache(8, 16);
  CHECK(cache.blocks_free_count() == 8);
  auto hashes = chain(1, 3);
  CHECK(cache.match(hashes) == 0);
  auto blocks = fill(cache, hashes);
  CHECK(cache.match(hashes) == 3);
  CHECK(cache.match(chain(1, 2)) == 2);
  auto diverging = chain(1, 2);
  diverging.push_back(h(99));
  diverging.push_back(h(3));  // cached, but after a miss: not a prefix hit
  CHECK(cache.match(diverging) == 2);
  CHECK(cache.match(chain(5, 2)) == 0);
  CHECK(cache.match(chain(2, 2)) == 2);        // h(2), h(3) are cached: any leading run matches
  CHECK(cache.counters().queries_count == 1);  // match() has no side effects

  auto again = cache.acquire(diverging, 2);
  REQUIRE(again.ok());
  CHECK(again->cached == std::vector<BlockIndex>{blocks[0], blocks[1]});
  CHECK(again->fresh.size() == 2);
  CHECK(cache.ref_count(blocks[0]) == 2);
  CHECK(cache.ref_count(blocks[2]) == 1);
  const auto& c = cache.counters();
  CHECK(c.queries_count == 2);
  CHECK(c.query_blocks_count == 4);
  CHECK(c.hit_blocks_count == 2);
  CHECK(c.hit_tokens_count == 32);
  CHECK(c.query_tokens_count == 64);
  CHECK(cache.blocks_used_count() == 5);
  CHECK(cache.blocks_free_count() == 3);
  cache.check_invariants();
}

TEST_CASE("reference counts: release keeps cached blocks, frees private ones") {
  PrefixCache cache(4, 16);
  auto blocks = fill(cache, chain(1, 2));
  auto extra = cache.acquire(chain(1, 2), 1);
  REQUIRE(extra.ok());
  BlockIndex priv = extra->fresh[0];
  cache.release(blocks);
  CHECK(cache.ref_count(blocks[0]) == 1);
  CHECK(cache.blocks_evictable_count() == 0);
  cache.release(extra->cached);
  cache.release(extra->fresh);
  CHECK(cache.ref_count(blocks[0]) == 0);
  CHECK(cache.blocks_evictable_count() == 2);
  CHECK(cache.blocks_used_count() == 0);
  CHECK(cache.blocks_free_count() == 2);
  CHECK_FALSE(cache.is_cached(priv));
  CHECK(cache.match(chain(1, 2)) == 2);  // still cached after release
  cache.check_invariants();
}

TEST_CASE("eviction is LRU, tail of a chain first, and never touches referenced blocks") {
  PrefixCache cache(6, 16);
  auto a = fill(cache, chain(10, 2));  // released first: oldest
  auto b = fill(cache, chain(20, 2));
  auto c = fill(cache, chain(30, 2));  // stays referenced
  cache.release(a);
  cache.release(b);
  CHECK(cache.blocks_free_count() == 0);
  CHECK(cache.blocks_available_count() == 4);
  auto one = cache.acquire({}, 1);
  REQUIRE(one.ok());
  // a was released last-to-first: its tail (h(11)) is the oldest evictable block.
  CHECK(one->fresh[0] == a[1]);
  CHECK(cache.match(chain(10, 2)) == 1);
  CHECK(cache.counters().evictions_count == 1);
  // Touching b (acquire + release) makes it newer than what is left of a.
  auto touch = cache.acquire(chain(20, 2), 0);
  REQUIRE(touch.ok());
  cache.release(touch->cached);
  auto two = cache.acquire({}, 2);
  REQUIRE(two.ok());
  CHECK(two->fresh[0] == a[0]);
  CHECK(two->fresh[1] == b[1]);
  CHECK(cache.match(chain(20, 2)) == 1);
  CHECK(cache.match(chain(30, 2)) == 2);  // referenced: never evicted
  auto none = cache.acquire({}, 2);
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().kind == ErrorKind::overloaded);
  CHECK(cache.match(chain(30, 2)) == 2);
  cache.check_invariants();
}

TEST_CASE("overloaded when full, with no side effects; matched evictable blocks do not count") {
  PrefixCache cache(3, 16);
  auto blocks = fill(cache, chain(1, 3));
  cache.release(blocks);
  CHECK(cache.blocks_available_count() == 3);
  // Reusing 2 cached blocks leaves only 1 evictable for fresh use.
  auto too_many = cache.acquire(chain(1, 2), 2);
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.error().kind == ErrorKind::overloaded);
  CHECK(too_many.error().message.find("2 fresh blocks needed") != std::string::npos);
  CHECK(cache.counters().overloaded_count == 1);
  CHECK(cache.counters().queries_count == 1);  // only fill()'s
  CHECK(cache.blocks_evictable_count() == 3);
  CHECK(cache.match(chain(1, 3)) == 3);
  auto fits = cache.acquire(chain(1, 2), 1);
  REQUIRE(fits.ok());
  CHECK(fits->fresh[0] == blocks[2]);
  CHECK(cache.match(chain(1, 3)) == 2);
  cache.check_invariants();
}

TEST_CASE("a repeated hash in a malformed list is handled, not asserted") {
  PrefixCache cache(2, 16);
  auto blocks = fill(cache, chain(1, 1));
  cache.release(blocks);
  std::vector<BlockHash> twice{h(1), h(1)};
  auto a = cache.acquire(twice, 1);
  REQUIRE(a.ok());
  CHECK(cache.ref_count(blocks[0]) == 2);
  cache.release(a->cached);
  cache.release(a->fresh);
  CHECK(cache.blocks_used_count() == 0);
  cache.check_invariants();
}

TEST_CASE("duplicate commits keep the first block; the duplicate is freed on release") {
  PrefixCache cache(4, 16);
  auto x = cache.acquire({}, 1);
  auto y = cache.acquire({}, 1);
  REQUIRE((x.ok() && y.ok()));
  CHECK(cache.commit(x->fresh[0], h(7)) == CommitOutcome::stored);
  CHECK(cache.commit(y->fresh[0], h(7)) == CommitOutcome::duplicate);
  CHECK_FALSE(cache.is_cached(y->fresh[0]));
  cache.release(y->fresh);
  CHECK(cache.blocks_free_count() == 3);
  cache.release(x->fresh);
  CHECK(cache.blocks_evictable_count() == 1);
  cache.check_invariants();
}

TEST_CASE("events report the net change since the last drain") {
  PrefixCache cache(2, 16);
  auto blocks = fill(cache, chain(1, 2));
  auto e1 = cache.drain_events();
  CHECK(std::set<BlockHash>(e1.stored.begin(), e1.stored.end()) == std::set<BlockHash>{h(1), h(2)});
  CHECK(e1.removed.empty());
  CHECK(cache.drain_events().stored.empty());
  cache.release(blocks);
  auto fresh = cache.acquire({}, 1);  // evicts h(2)
  REQUIRE(fresh.ok());
  CHECK(cache.commit(fresh->fresh[0], h(3)) == CommitOutcome::stored);
  auto e2 = cache.drain_events();
  CHECK(e2.stored == std::vector<BlockHash>{h(3)});
  CHECK(e2.removed == std::vector<BlockHash>{h(2)});
  // Stored and removed within one window cancel out.
  cache.release(fresh->fresh);
  auto f2 = cache.acquire({}, 2);  // evicts h(1) then h(3)
  REQUIRE(f2.ok());
  CHECK(cache.commit(f2->fresh[0], h(4)) == CommitOutcome::stored);
  cache.release(f2->fresh);
  auto f3 = cache.acquire({}, 2);  // evicts h(4)
  REQUIRE(f3.ok());
  auto e3 = cache.drain_events();
  CHECK(e3.stored.empty());
  CHECK(std::set<BlockHash>(e3.removed.begin(), e3.removed.end()) ==
        std::set<BlockHash>{h(1), h(3)});
}

TEST_CASE("randomized: invariants hold after every operation and usage returns to zero") {
  const uint32_t seed = 20240601;
  MESSAGE("seed " << seed);
  std::mt19937 rng(seed);
  PrefixCache cache(32, 16);
  std::vector<std::vector<BlockIndex>> held;  // per live request: all its blocks
  std::map<BlockHash, bool> model_cached;     // shadow of what events say is cached
  for (int op = 0; op < 20000; ++op) {
    uint32_t kind = rng() % 10;
    if (kind < 5) {
      // A request: a prompt of 0..8 blocks from one of 6 shared "documents".
      uint32_t doc = rng() % 6, blocks = rng() % 9, fresh_extra = rng() % 3;
      auto hashes = chain(doc * 100, blocks);
      uint32_t matched = cache.match(hashes);
      uint32_t free_before = cache.blocks_free_count();
      auto a = cache.acquire(hashes, blocks - matched + fresh_extra);
      if (!a.ok()) {
        CHECK(a.error().kind == ErrorKind::overloaded);
        CHECK(blocks - matched + fresh_extra > free_before);
        cache.check_invariants();
        continue;
      }
      REQUIRE(a->cached.size() == matched);
      for (uint32_t i = 0; i < blocks - matched; ++i) {
        (void)cache.commit(a->fresh[i], hashes[matched + i]);
      }
      std::vector<BlockIndex> all = a->cached;
      all.insert(all.end(), a->fresh.begin(), a->fresh.end());
      held.push_back(all);
    } else if (!held.empty()) {
      size_t pick = rng() % held.size();
      cache.release(held[pick]);
      held.erase(held.begin() + static_cast<long>(pick));
    }
    cache.check_invariants();
    if (op % 97 == 0) {
      auto ev = cache.drain_events();
      for (const auto& s : ev.stored) {
        CHECK_FALSE(model_cached[s]);
        model_cached[s] = true;
      }
      for (const auto& r : ev.removed) {
        CHECK(model_cached[r]);
        model_cached[r] = false;
      }
      uint32_t cached = 0;
      for (const auto& [hash, on] : model_cached) cached += on ? 1 : 0;
      CHECK(cached == cache.blocks_cached_count());
    }
  }
  for (const auto& blocks : held) cache.release(blocks);
  cache.check_invariants();
  CHECK(cache.blocks_used_count() == 0);
  CHECK(cache.blocks_free_count() + cache.blocks_evictable_count() == 32);
  CHECK(cache.counters().hit_blocks_count > 0);
  CHECK(cache.counters().evictions_count > 0);
  CHECK(cache.counters().overloaded_count > 0);
}
