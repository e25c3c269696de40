#include <doctest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <span>
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

// ---- Chains (issue 13, precise events): a cached block's parent is always cached. ----

namespace {

// Acquires what `hashes` lacks and commits it in chain order, as the schedulers do.
std::vector<BlockIndex> fill_chain(PrefixCache& cache, const std::vector<BlockHash>& hashes) {
  uint32_t matched = cache.match(hashes);
  auto a = cache.acquire(std::span(hashes).first(matched),
                         static_cast<uint32_t>(hashes.size()) - matched);
  REQUIRE(a.ok());
  for (size_t i = matched; i < hashes.size(); ++i) {
    (void)cache.commit(a->fresh[i - matched], hashes[i], tandem::kv::chain_parent(hashes, i));
  }
  std::vector<BlockIndex> all = a->cached;
  all.insert(all.end(), a->fresh.begin(), a->fresh.end());
  cache.check_invariants();
  return all;
}

// What a receiver of the events rebuilds (the router's semantics): a removed hash drops its
// subtree; a stored hash is kept when its parent is kept (or it is a first block).
struct ShadowTree {
  std::map<BlockHash, std::optional<BlockHash>> parent_of;
  void apply(const tandem::kv::CacheEvents& ev) {
    for (const auto& r : ev.removed) drop(r);
    REQUIRE(ev.stored.size() == ev.stored_parents.size());
    for (size_t i = 0; i < ev.stored.size(); ++i) {
      const auto& parent = ev.stored_parents[i];
      CHECK_FALSE(parent_of.contains(ev.stored[i]));
      if (parent && !parent_of.contains(*parent)) {
        FAIL_CHECK("a stored block listed before its parent");
        continue;
      }
      parent_of[ev.stored[i]] = parent;
    }
  }
  // (`removed` lists an evicted block's descendants too: the first drop took them.)
  void drop(const BlockHash& hash) {
    if (parent_of.erase(hash) == 0) return;
    std::vector<BlockHash> children;
    for (const auto& [child, parent] : parent_of) {
      if (parent == hash) children.push_back(child);
    }
    for (const auto& c : children) drop(c);
  }
};

}  // namespace

TEST_CASE("a commit under a parent hash that is not cached is an orphan and stays private") {
  PrefixCache cache(4, 16);
  auto a = cache.acquire({}, 2);
  REQUIRE(a.ok());
  CHECK(cache.commit(a->fresh[1], h(2), h(1)) == CommitOutcome::orphan);
  CHECK_FALSE(cache.is_cached(a->fresh[1]));
  CHECK(cache.commit(a->fresh[0], h(1)) == CommitOutcome::stored);
  CHECK(cache.drain_events().stored == std::vector<BlockHash>{h(1)});
  cache.release(a->fresh);
  CHECK(cache.blocks_free_count() == 3);  // the orphan went back to the free list
  cache.check_invariants();
}

TEST_CASE("evicting a block uncaches its cached descendants: none is left unreachable") {
  // Two prompts race on the same chain [1, 2]: y commits block 1 first, x's block 1 is a
  // duplicate, x's block 2 is cached under y's block 1. y releases first, so its block 1 is
  // older in the LRU than x's block 2.
  PrefixCache cache(3, 16);
  auto x = cache.acquire({}, 2);
  auto y = cache.acquire({}, 1);
  REQUIRE((x.ok() && y.ok()));
  CHECK(cache.commit(y->fresh[0], h(1)) == CommitOutcome::stored);
  CHECK(cache.commit(x->fresh[0], h(1)) == CommitOutcome::duplicate);
  CHECK(cache.commit(x->fresh[1], h(2), h(1)) == CommitOutcome::stored);
  (void)cache.drain_events();
  cache.release(y->fresh);
  cache.release(x->fresh);  // x's block 1 (a duplicate) is free; block 2 evictable
  CHECK(cache.blocks_evictable_count() == 2);
  auto z = cache.acquire({}, 2);  // the free block, then the LRU head (block 1)
  REQUIRE(z.ok());
  cache.check_invariants();
  CHECK(cache.match(chain(1, 2)) == 0);
  CHECK_FALSE(cache.holds(h(2)));  // not left cached without its parent
  CHECK(cache.blocks_cached_count() == 0);
  CHECK(cache.blocks_free_count() == 1);  // block 2 went back to the free list
  CHECK(cache.counters().unreachable_count == 1);
  auto ev = cache.drain_events();
  CHECK(std::set<BlockHash>(ev.removed.begin(), ev.removed.end()) ==
        std::set<BlockHash>{h(1), h(2)});
}

TEST_CASE("a referenced descendant of an evicted block turns private and is freed on release") {
  PrefixCache cache(3, 16);
  auto x = cache.acquire({}, 2);
  auto y = cache.acquire({}, 1);
  REQUIRE((x.ok() && y.ok()));
  CHECK(cache.commit(y->fresh[0], h(1)) == CommitOutcome::stored);
  CHECK(cache.commit(x->fresh[0], h(1)) == CommitOutcome::duplicate);
  CHECK(cache.commit(x->fresh[1], h(2), h(1)) == CommitOutcome::stored);
  cache.release(y->fresh);         // y's block 1: evictable; x still holds its block 2
  auto z = cache.acquire({}, 1);  // nothing free: evicts y's block 1, under which x's 2 hangs
  REQUIRE(z.ok());
  CHECK_FALSE(cache.is_cached(x->fresh[1]));
  CHECK(cache.ref_count(x->fresh[1]) == 1);
  cache.check_invariants();
  cache.release(x->fresh);
  CHECK(cache.blocks_free_count() == 2);
  cache.check_invariants();
}

TEST_CASE("events list stored blocks in chain order with their parents; snapshot lists all") {
  PrefixCache cache(8, 16);
  auto a = fill_chain(cache, chain(1, 3));
  auto b = fill_chain(cache, {h(1), h(2), h(9)});  // shares [1, 2], adds 9 under 2
  auto ev = cache.drain_events();
  ShadowTree shadow;
  shadow.apply(ev);
  REQUIRE(ev.stored.size() == 4);
  CHECK(ev.stored[0] == h(1));
  CHECK_FALSE(ev.stored_parents[0].has_value());
  CHECK(ev.stored[1] == h(2));
  CHECK(ev.stored_parents[1] == h(1));
  CHECK(ev.stored_parents[2] == h(2));
  CHECK(ev.stored_parents[3] == h(2));
  auto snap = cache.snapshot();
  CHECK(snap.removed.empty());
  ShadowTree rebuilt;
  rebuilt.apply(snap);
  CHECK(rebuilt.parent_of == shadow.parent_of);
  CHECK_FALSE(cache.has_events());
  cache.release(a);
  cache.release(b);
}

TEST_CASE("randomized chains: events applied with subtree removal rebuild the cache exactly") {
  for (uint32_t seed : {7u, 8u, 9u, 10u}) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    PrefixCache cache(24, 16);
    std::vector<std::vector<BlockIndex>> held;
    ShadowTree shadow;
    for (int op = 0; op < 6000; ++op) {
      uint32_t kind = rng() % 10;
      if (kind < 5) {
        // Documents share heads: doc d's chain is [d/3 * 100 .., then d's own blocks] (a
        // hash names its whole chain, as chained hashes do: d's head length is fixed).
        uint32_t doc = rng() % 9, blocks = 1 + rng() % 7;
        std::vector<BlockHash> hashes = chain((doc / 3) * 100, 1 + doc % 2);
        for (uint32_t i = 0; i < blocks; ++i) hashes.push_back(h(1000 + doc * 50 + i));
        uint32_t matched = cache.match(hashes);
        auto a = cache.acquire(std::span(hashes).first(matched),
                               static_cast<uint32_t>(hashes.size()) - matched);
        if (!a.ok()) continue;
        // Commit a random-length prefix of the fresh blocks, sometimes out of a race's order.
        size_t commit_to = matched + rng() % (hashes.size() - matched + 1);
        for (size_t i = matched; i < commit_to; ++i) {
          (void)cache.commit(a->fresh[i - matched], hashes[i],
                             tandem::kv::chain_parent(hashes, i));
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
      if (op % 13 == 0) {
        shadow.apply(cache.drain_events());
        REQUIRE(shadow.parent_of.size() == cache.blocks_cached_count());
        for (const auto& [hash, parent] : shadow.parent_of) CHECK(cache.holds(hash));
      }
    }
    for (const auto& blocks : held) cache.release(blocks);
    CHECK(cache.counters().evictions_count > 0);
  }
}
