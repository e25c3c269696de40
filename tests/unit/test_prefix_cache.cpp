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

// ---- Sub-blocks (issue 13): 16-token blocks matched at 4-token sub-blocks (k = 4). ----
namespace {

// Prefix hashes of a token stream at 4-token sub-blocks: q_t names tokens [0, 4 (t + 1)).
std::vector<BlockHash> prefix_hashes(const std::vector<uint32_t>& tokens) {
  std::vector<BlockHash> out;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t t = 0; t + 4 <= tokens.size(); t += 4) {
    for (size_t i = t; i < t + 4; ++i) state = (state ^ tokens[i]) * 0x100000001b3ull + 17;
    BlockHash hash;
    for (int b = 0; b < 8; ++b) hash.bytes[b] = static_cast<uint8_t>(state >> (8 * b));
    hash.bytes[31] = 0x5b;
    out.push_back(hash);
  }
  return out;
}

std::vector<uint32_t> tokens_of(uint32_t doc, uint32_t count) {
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < count; ++i) out.push_back(doc * 1000 + i);
  return out;
}

// Serves `q` as a prefill does: match, acquire, copy the partial holder into the first fresh
// block (`content` models every block's KV: the prefix hash each slot holds), compute the
// rest, commit each block's slots, release the copy's source. Returns the request's blocks.
std::vector<BlockIndex> serve(PrefixCache& cache, const std::vector<BlockHash>& q,
                              std::map<BlockIndex, std::vector<BlockHash>>& content,
                              size_t commit_sub_blocks = SIZE_MAX) {
  const uint32_t k = cache.sub_blocks_per_block();
  uint32_t matched = cache.match(q);
  uint32_t full = matched / k;
  auto needed = static_cast<uint32_t>((q.size() + k - 1) / k);
  auto a = cache.acquire(std::span(q).first(matched), needed - full);
  if (!a.ok()) return {};  // overloaded (the randomized test's full pool)
  REQUIRE(a->cached.size() == full);
  // Whatever the cache hands out holds exactly the prompt's KV.
  for (uint32_t i = 0; i < full; ++i) {
    for (uint32_t s = 0; s < k; ++s) REQUIRE(content[a->cached[i]][s] == q[k * i + s]);
  }
  std::vector<BlockIndex> blocks = a->cached;
  blocks.insert(blocks.end(), a->fresh.begin(), a->fresh.end());
  for (BlockIndex f : a->fresh) content[f].assign(k, BlockHash{});  // garbage
  uint32_t from = full * k;
  if (a->partial_source) {
    REQUIRE(a->partial_sub_blocks == matched % k);
    for (uint32_t s = 0; s < a->partial_sub_blocks; ++s) {
      REQUIRE(content[*a->partial_source][s] == q[from + s]);
      content[a->fresh[0]][s] = content[*a->partial_source][s];  // the device's copy
    }
  } else {
    REQUIRE(matched % k == 0);
  }
  size_t done = std::min(q.size(), commit_sub_blocks);
  for (size_t t = from + matched % k; t < q.size(); ++t) content[blocks[t / k]][t % k] = q[t];
  tandem::kv::PrefixHashes ph{q, k};
  for (size_t i = full; i * k < done; ++i) {
    size_t n = std::min<size_t>(k, done - i * k);
    (void)cache.commit(blocks[i], ph.slots(i, n), ph.parent(i));
  }
  if (a->partial_source) cache.release(std::span(&*a->partial_source, 1));
  cache.check_invariants();
  return blocks;
}

}  // namespace

TEST_CASE("sub-blocks: a prompt's partial last block is cached and matched sub-block by sub-block") {
  PrefixCache cache(8, 16, 4);
  CHECK(cache.sub_blocks_per_block() == 4);
  std::map<BlockIndex, std::vector<BlockHash>> content;
  auto turn1 = tokens_of(1, 24);  // one full block + 2 sub-blocks
  auto q1 = prefix_hashes(turn1);
  REQUIRE(q1.size() == 6);
  auto a = serve(cache, q1, content);
  CHECK(cache.entries_count() == 6);
  CHECK(cache.blocks_cached_count() == 2);
  cache.release(a);
  // The next turn extends it: 6 sub-blocks reused, the tail block copied from its holder.
  auto turn2 = tokens_of(1, 40);
  auto q2 = prefix_hashes(turn2);
  CHECK(cache.match(q2) == 6);
  auto before = cache.counters();
  auto b = serve(cache, q2, content);
  CHECK(cache.counters().hit_tokens_count - before.hit_tokens_count == 24);
  CHECK(cache.counters().partial_hits_count == 1);
  // Its block 1 holds everything the old partial block held: it took it over.
  CHECK(cache.counters().merged_count == 1);
  CHECK(cache.entries_count() == 10);
  CHECK(cache.blocks_cached_count() == 3);
  CHECK_FALSE(cache.is_cached(a[1]));
  CHECK(cache.blocks_free_count() == 5);  // the dominated block went back to the free list
  // The merge is no event: the hashes stayed cached.
  auto ev = cache.drain_events();
  CHECK(ev.removed.empty());
  CHECK(ev.stored.size() == 10);
  cache.release(b);
  cache.check_invariants();
}

TEST_CASE("sub-blocks: a prompt diverging inside a block reuses the shared sub-blocks only") {
  PrefixCache cache(8, 16, 4);
  std::map<BlockIndex, std::vector<BlockHash>> content;
  auto x = tokens_of(1, 32);
  auto y = x;
  y[21] = 7;  // block 1, sub-block 1 differs
  auto qx = prefix_hashes(x), qy = prefix_hashes(y);
  auto a = serve(cache, qx, content);
  CHECK(cache.match(qy) == 5);
  auto b = serve(cache, qy, content);
  // Block 1 of y holds sub-block 0 (copied) and its own 1..3: a branch below x's block 1.
  CHECK(cache.counters().merged_count == 0);
  CHECK(cache.entries_count() == 8 + 3);
  cache.release(a);
  cache.release(b);  // LRU: x's block 1, y's block 1, block 0
  (void)cache.drain_events();
  // Evicting x's block 1 hands the shared sub-block 0 to y's branch (which holds its KV): it
  // loses only its own sub-blocks, and y's block stays.
  auto fresh = cache.acquire({}, 6);  // 5 free, then the oldest evictable
  REQUIRE(fresh.ok());
  auto ev = cache.drain_events();
  CHECK(cache.counters().handed_over_count == 1);
  CHECK(ev.removed.size() == 3);
  CHECK(cache.entries_count() == 8);
  CHECK(cache.match(qy) == 8);
  CHECK(cache.match(qx) == 5);
  CHECK(cache.counters().unreachable_count == 0);
  cache.release(fresh->fresh);
  // Evicting block 0 now takes y's block with it (its chain): the cache holds what match()
  // reaches, and the events say so.
  auto all = cache.acquire({}, 8);
  REQUIRE(all.ok());
  CHECK(cache.entries_count() == 0);
  CHECK(cache.drain_events().removed.size() == 8);
  cache.release(all->fresh);
  cache.check_invariants();
}

TEST_CASE("sub-blocks: a fully cached prompt and a hash at the wrong slot") {
  PrefixCache cache(4, 16, 4);
  std::map<BlockIndex, std::vector<BlockHash>> content;
  auto q = prefix_hashes(tokens_of(3, 32));
  cache.release(serve(cache, q, content));
  CHECK(cache.match(q) == 8);
  // A malformed list: a cached hash at a position whose slot differs matches nothing.
  std::vector<BlockHash> shifted(q.begin() + 1, q.end());
  CHECK(cache.match(shifted) == 0);
  auto a = cache.acquire(shifted, 0);
  REQUIRE(a.ok());
  CHECK(a->cached.empty());
  CHECK_FALSE(a->partial_source.has_value());
  // The whole-block overload is for k == 1 only; committing again is a duplicate.
  auto b = cache.acquire({}, 1);
  REQUIRE(b.ok());
  CHECK(cache.commit(b->fresh[0], std::span(q).first(4), std::nullopt) ==
        CommitOutcome::duplicate);
  CHECK_FALSE(cache.is_cached(b->fresh[0]));
  cache.release(b->fresh);
  cache.check_invariants();
}

TEST_CASE("sub-blocks randomized: no request is ever handed KV that is not its own, and events "
          "rebuild the cache's entries exactly") {
  for (uint32_t seed : {11u, 12u, 13u, 14u, 15u}) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    PrefixCache cache(20, 16, 4);
    std::map<BlockIndex, std::vector<BlockHash>> content;
    std::vector<std::vector<BlockIndex>> held;
    ShadowTree shadow;
    uint64_t partial_hits = 0;
    for (int op = 0; op < 5000; ++op) {
      uint32_t kind = rng() % 10;
      if (kind < 5) {
        // Six documents; a request takes a random-length prefix (whole sub-blocks) of one,
        // sometimes with a token changed at a random place (a branch inside a block).
        uint32_t doc = rng() % 6;
        auto tokens = tokens_of(doc / 2, 4 * (1 + rng() % 16));
        if (doc % 2 == 1) tokens[rng() % tokens.size()] += 500;
        auto q = prefix_hashes(tokens);
        uint32_t k = cache.sub_blocks_per_block();
        uint32_t matched = cache.match(q);
        size_t commit_to = rng() % 4 == 0 ? rng() % (q.size() + 1) : q.size();
        auto blocks = serve(cache, q, content, commit_to);
        if (blocks.empty()) continue;
        if (matched % k != 0) ++partial_hits;
        held.push_back(std::move(blocks));
      } else if (!held.empty()) {
        size_t pick = rng() % held.size();
        cache.release(held[pick]);
        held.erase(held.begin() + static_cast<long>(pick));
      }
      if (op % 11 == 0) {
        shadow.apply(cache.drain_events());
        REQUIRE(shadow.parent_of.size() == cache.entries_count());
        for (const auto& [hash, parent] : shadow.parent_of) CHECK(cache.holds(hash));
      }
    }
    for (const auto& blocks : held) cache.release(blocks);
    cache.check_invariants();
    CHECK(cache.blocks_used_count() == 0);
    CHECK(partial_hits > 50);
    CHECK(cache.counters().merged_count > 0);
    CHECK(cache.counters().handed_over_count > 0);
    CHECK(cache.counters().evictions_count > 0);
    // (LRU takes a chain's tail first and branches take shared slots over, so nothing is
    // uncached by cascade here; the directed cases above exercise it.)
  }
}
