#include <doctest.h>

#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <vector>

#include "actors/router/router_core.hpp"

using tandem::ErrorKind;
using tandem::kv::BlockHash;
using tandem::router::InstanceId;
using tandem::router::InstanceLoad;
using tandem::router::InstanceRole;
using tandem::router::Pick;
using tandem::router::PickRequest;
using tandem::router::Policy;
using tandem::router::RouterConfig;
using tandem::router::RouterCore;

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A chained test hash: block i of a chain depends on block i-1 and the chain's salt.
// The first `shared` blocks are copied from `base` (a shared prefix).
std::vector<BlockHash> chain(uint64_t salt, size_t blocks,
                             const std::vector<BlockHash>* base = nullptr, size_t shared = 0) {
  std::vector<BlockHash> out;
  uint64_t previous = 0;
  for (size_t i = 0; i < blocks; ++i) {
    BlockHash h;
    if (base != nullptr && i < shared) {
      h = (*base)[i];
    } else {
      uint64_t v = mix(previous ^ mix(salt * 1000003 + i));
      for (size_t b = 0; b < 4; ++b) {
        uint64_t part = mix(v + b);
        std::memcpy(h.bytes.data() + 8 * b, &part, 8);
      }
    }
    std::memcpy(&previous, h.bytes.data(), 8);
    out.push_back(h);
  }
  return out;
}

PickRequest request_for(const std::vector<BlockHash>& hashes, uint32_t block_tokens = 16,
                        uint64_t extra_tokens = 5) {
  return PickRequest{hashes, hashes.size() * block_tokens + extra_tokens};
}

constexpr InstanceId d0{10}, d1{11}, d2{12}, d3{13}, p0{20}, p1{21};

RouterCore make_core(RouterConfig config, std::vector<InstanceId> decodes,
                     std::vector<InstanceId> prefills = {}) {
  RouterCore core(config);
  for (InstanceId id : decodes) REQUIRE(core.add_instance(id, InstanceRole::decode).ok());
  for (InstanceId id : prefills) REQUIRE(core.add_instance(id, InstanceRole::prefill).ok());
  return core;
}

// Decode d0 on node 0, prefill p0 on node 1 and p1 on node 2 (each node its own tier 2).
RouterCore tier2_core(const RouterConfig& config) {
  RouterCore core(config);
  REQUIRE(core.add_instance(d0, InstanceRole::decode, 0).ok());
  REQUIRE(core.add_instance(p0, InstanceRole::prefill, 1).ok());
  REQUIRE(core.add_instance(p1, InstanceRole::prefill, 2).ok());
  return core;
}

}  // namespace

TEST_CASE("router: scoring math per scorer and weighted sum") {
  RouterConfig config;
  config.weight_prefix = 2.0;
  config.weight_queue = 0.5;
  config.weight_kv_usage = 0.25;
  RouterCore core = make_core(config, {d0, d1});
  auto prompt = chain(1, 8);
  REQUIRE(core.kv_stored(d0, std::nullopt, std::span(prompt).first(6)).ok());
  REQUIRE(core.update_load(d0, InstanceLoad{3, 2, 25, 100}).ok());
  REQUIRE(core.update_load(d1, InstanceLoad{0, 0, 0, 0}).ok());
  auto scores = core.scores(request_for(prompt), InstanceRole::decode);
  REQUIRE(scores.ok());
  REQUIRE(scores->size() == 2);
  const auto& a = (*scores)[0];
  CHECK(a.id == d0);
  CHECK(a.cached_blocks == 6);
  CHECK(a.prefix == doctest::Approx(0.75));
  // Load 3 waiting + 2 running = 5; the role's mean is 2.5: queue = 3.5 / (3.5 + 5).
  CHECK(a.load_count == 5);
  CHECK(a.queue == doctest::Approx(3.5 / 8.5));
  CHECK(a.over_bound);  // 5 >= 1.5 * (5 + 1) / 2
  CHECK(a.kv_usage == doctest::Approx(0.75));
  CHECK(a.total == doctest::Approx(2.0 * 0.75 + 0.5 * 3.5 / 8.5 + 0.25 * 0.75));
  const auto& b = (*scores)[1];
  CHECK(b.cached_blocks == 0);
  CHECK(b.prefix == 0.0);
  CHECK(b.load_count == 0);
  CHECK_FALSE(b.over_bound);
  CHECK(b.queue == 1.0);
  CHECK(b.kv_usage == 1.0);  // no report yet: treated as empty
  CHECK(b.total == doctest::Approx(0.5 + 0.25));
  // Used above total is clamped; an empty prompt scores prefix 0.
  REQUIRE(core.update_load(d1, InstanceLoad{0, 0, 500, 100}).ok());
  std::vector<BlockHash> none;
  auto empty = core.scores(PickRequest{none, 3}, InstanceRole::decode);
  REQUIRE(empty.ok());
  CHECK((*empty)[0].prefix == 0.0);
  CHECK((*empty)[1].kv_usage == 0.0);
}

TEST_CASE("router: the same prompt returns to the instance that has its prefix") {
  RouterCore core = make_core(RouterConfig{}, {d0, d1, d2, d3});
  auto prompt = chain(7, 40);
  auto first = core.pick(request_for(prompt));
  REQUIRE(first.ok());
  CHECK(first->decode_cached_blocks == 0);
  for (InstanceId id : {d0, d1, d2, d3}) REQUIRE(core.update_load(id, InstanceLoad{}).ok());
  auto again = core.pick(request_for(prompt));
  REQUIRE(again.ok());
  CHECK(again->decode == first->decode);
  CHECK(again->decode_cached_blocks == 40);
  CHECK(again->uncached_tokens == 5);
  // A prompt sharing 30 leading blocks also goes there, with 30 cached.
  auto sibling = chain(8, 50, &prompt, 30);
  for (InstanceId id : {d0, d1, d2, d3}) REQUIRE(core.update_load(id, InstanceLoad{}).ok());
  auto third = core.pick(request_for(sibling));
  REQUIRE(third.ok());
  CHECK(third->decode == first->decode);
  CHECK(third->decode_cached_blocks == 30);
}

TEST_CASE("router: weights change the pick") {
  auto prompt = chain(3, 10);
  auto setup = [&](double weight_prefix) {
    RouterConfig config;
    config.weight_prefix = weight_prefix;
    config.load_imbalance_max = std::numeric_limits<double>::infinity();  // weights only
    RouterCore core = make_core(config, {d0, d1});
    REQUIRE(core.kv_stored(d0, std::nullopt, prompt).ok());
    // d0 has the prefix but is busy; d1 is idle.
    REQUIRE(core.update_load(d0, InstanceLoad{4, 8, 80, 100}).ok());
    REQUIRE(core.update_load(d1, InstanceLoad{0, 0, 10, 100}).ok());
    return core;
  };
  RouterCore prefix_heavy = setup(10.0);
  CHECK(prefix_heavy.pick(request_for(prompt))->decode == d0);
  RouterCore prefix_blind = setup(0.0);
  CHECK(prefix_blind.pick(request_for(prompt))->decode == d1);
  RouterCore balanced = setup(1.0);  // d0: 1 + 7 / 19 + 0.2 = 1.57; d1: 0 + 1 + 0.9 = 1.9
  CHECK(balanced.pick(request_for(prompt))->decode == d1);
}

TEST_CASE("router: P/D decider threshold both ways") {
  RouterConfig config;
  config.disaggregate_tokens_min = 64;  // 4 blocks of 16
  RouterCore core = make_core(config, {d0}, {p0});
  auto prompt = chain(5, 10);
  // Nothing cached: 165 uncached tokens >= 64: disaggregate.
  auto cold = core.pick(PickRequest{prompt, 165});
  REQUIRE(cold.ok());
  REQUIRE(cold->prefill.has_value());
  CHECK(*cold->prefill == p0);
  CHECK(cold->uncached_tokens == 165);
  CHECK(core.index_blocks_count(p0) == 10);  // prefill's index learned the blocks
  // Now decode holds all 10 blocks: 5 uncached < 64: decode prefills locally.
  auto warm = core.pick(PickRequest{prompt, 165});
  REQUIRE(warm.ok());
  CHECK_FALSE(warm->prefill.has_value());
  CHECK(warm->uncached_tokens == 5);
  // Exactly at the threshold: disaggregate (>=); one below: local.
  auto longer = chain(5, 14, &prompt, 10);
  auto at = core.pick(PickRequest{longer, 10 * 16 + 64});
  REQUIRE(at.ok());
  CHECK(at->uncached_tokens == 64);
  CHECK(at->prefill.has_value());
  auto below = core.pick(PickRequest{longer, 14 * 16 + 63});  // decode now holds all 14
  REQUIRE(below.ok());
  CHECK(below->decode_cached_blocks == 14);
  CHECK(below->uncached_tokens == 63);
  CHECK_FALSE(below->prefill.has_value());
  // No prefill instance up: decode prefills locally even when long.
  REQUIRE(core.set_up(p0, false).ok());
  auto fresh = chain(6, 20);
  auto alone = core.pick(request_for(fresh));
  REQUIRE(alone.ok());
  CHECK_FALSE(alone->prefill.has_value());
}

TEST_CASE("router: prefill is picked by its own prefix affinity") {
  RouterConfig config;
  config.disaggregate_tokens_min = 1;
  RouterCore core = make_core(config, {d0}, {p0, p1});
  auto prompt = chain(9, 12);
  REQUIRE(core.kv_stored(p1, std::nullopt, prompt).ok());
  auto pick = core.pick(request_for(prompt));
  REQUIRE(pick.ok());
  REQUIRE(pick->prefill.has_value());
  CHECK(*pick->prefill == p1);
}

TEST_CASE("router: round-robin cycles evenly over up decode instances") {
  RouterConfig config;
  config.policy = Policy::round_robin;
  RouterCore core = make_core(config, {d0, d1, d2});
  auto prompt = chain(1, 4);
  std::vector<InstanceId> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(core.pick(request_for(prompt))->decode);
  CHECK(seen == std::vector<InstanceId>{d0, d1, d2, d0, d1, d2});
  REQUIRE(core.set_up(d1, false).ok());
  seen.clear();
  for (int i = 0; i < 4; ++i) seen.push_back(core.pick(request_for(prompt))->decode);
  CHECK(seen == std::vector<InstanceId>{d0, d2, d0, d2});
}

TEST_CASE("router: random is uniform, seeded and deterministic") {
  auto run = [](uint64_t seed) {
    RouterConfig config;
    config.policy = Policy::random;
    config.seed = seed;
    RouterCore core = make_core(config, {d0, d1, d2, d3});
    auto prompt = chain(2, 3);
    std::vector<InstanceId> picks;
    for (int i = 0; i < 8000; ++i) picks.push_back(core.pick(request_for(prompt))->decode);
    return picks;
  };
  auto a = run(42);
  std::map<uint32_t, int> counts;
  for (InstanceId id : a) counts[id.value]++;
  REQUIRE(counts.size() == 4);
  for (auto [id, count] : counts) {
    CHECK(count > 1800);  // expected 2000 each; sd ~39
    CHECK(count < 2200);
  }
  CHECK(run(42) == a);
  CHECK(run(43) != a);
}

TEST_CASE("router: down instances are never picked, returning ones are") {
  RouterCore core = make_core(RouterConfig{}, {d0, d1});
  auto prompt = chain(4, 8);
  REQUIRE(core.kv_stored(d0, std::nullopt, prompt).ok());
  CHECK(core.pick(request_for(prompt))->decode == d0);
  REQUIRE(core.set_up(d0, false).ok());
  CHECK(core.index_blocks_count(d0) == 0);  // down forgets the index
  REQUIRE(core.kv_stored(d0, std::nullopt, prompt).ok());
  CHECK(core.index_blocks_count(d0) == 0);  // and ignores KV events until it returns
  for (int i = 0; i < 5; ++i) CHECK(core.pick(request_for(prompt))->decode == d1);
  REQUIRE(core.set_up(d1, false).ok());
  auto none = core.pick(request_for(prompt));
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().kind == ErrorKind::overloaded);
  REQUIRE(core.set_up(d0, true).ok());
  CHECK(core.pick(request_for(prompt))->decode == d0);
  RouterCore empty(RouterConfig{});
  auto nobody = empty.pick(request_for(prompt));
  REQUIRE_FALSE(nobody.ok());
  CHECK(nobody.error().kind == ErrorKind::not_found);
}

TEST_CASE("router: draining instances are not picked but keep their index; undrain resumes") {
  RouterCore core = make_core(RouterConfig{}, {d0, d1}, {p0, p1});
  auto prompt = chain(5, 40);
  REQUIRE(core.kv_stored(d0, std::nullopt, prompt).ok());
  REQUIRE(core.kv_stored(p0, std::nullopt, prompt).ok());
  Pick first = *core.pick(request_for(prompt));
  CHECK(first.decode == d0);
  REQUIRE(core.set_draining(d0, true).ok());
  REQUIRE(core.set_draining(p0, true).ok());
  CHECK(core.draining(d0));
  CHECK_FALSE(core.draining(d1));
  CHECK(core.index_blocks_count(d0) == prompt.size());  // kept, unlike going down
  for (int i = 0; i < 5; ++i) {
    Pick p = *core.pick(request_for(prompt));
    CHECK(p.decode == d1);
    if (p.prefill) CHECK(*p.prefill == p1);
  }
  // KV events still reach a draining instance's index.
  auto other = chain(6, 4);
  REQUIRE(core.kv_stored(d0, std::nullopt, other).ok());
  CHECK(core.index_blocks_count(d0) == prompt.size() + other.size());
  // Every decode instance draining: an overloaded error that says so.
  REQUIRE(core.set_draining(d1, true).ok());
  auto none = core.pick(request_for(prompt));
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().kind == ErrorKind::overloaded);
  CHECK(none.error().message.find("draining") != std::string::npos);
  // Undrained: picked again at once, by its cache.
  REQUIRE(core.set_draining(d0, false).ok());
  CHECK(core.pick(request_for(prompt))->decode == d0);
  CHECK(core.set_draining(d3, true).error().kind == ErrorKind::not_found);
  CHECK_FALSE(core.draining(d3));
  // A re-added instance starts undrained.
  REQUIRE(core.remove_instance(d1).ok());
  REQUIRE(core.add_instance(d1, InstanceRole::decode).ok());
  CHECK_FALSE(core.draining(d1));
}

TEST_CASE("router: set_config changes the policy and weights live; capacities are fixed") {
  RouterCore core = make_core(RouterConfig{}, {d0, d1});
  auto prompt = chain(7, 8);
  REQUIRE(core.kv_stored(d0, std::nullopt, prompt).ok());
  for (int i = 0; i < 4; ++i) {
    CHECK(core.pick(request_for(prompt))->decode == d0);
    REQUIRE(core.update_load(d0, InstanceLoad{}).ok());  // a heartbeat: no load
  }
  RouterConfig rr = core.config();
  rr.policy = Policy::round_robin;
  REQUIRE(core.set_config(rr).ok());
  CHECK(core.config().policy == Policy::round_robin);
  std::map<uint32_t, int> count;
  for (int i = 0; i < 4; ++i) ++count[core.pick(request_for(prompt))->decode.value];
  CHECK(count[d0.value] == 2);
  CHECK(count[d1.value] == 2);
  RouterConfig bad = core.config();
  bad.weight_queue = -1;
  CHECK(core.set_config(bad).error().kind == ErrorKind::invalid);
  RouterConfig bigger = core.config();
  bigger.prefix_index_blocks_max += 1;
  auto fixed = core.set_config(bigger);
  REQUIRE_FALSE(fixed.ok());
  CHECK(fixed.error().message.find("fixed at start") != std::string::npos);
  CHECK(core.config().policy == Policy::round_robin);  // unchanged by the refusals
  CHECK(core.config().weight_queue == 1.0);
}

TEST_CASE("router: KV events correct the index") {
  RouterCore core = make_core(RouterConfig{}, {d0});
  auto prompt = chain(11, 10);
  REQUIRE(core.kv_stored(d0, std::nullopt, std::span(prompt).first(4)).ok());
  CHECK(core.cached_blocks(d0, prompt) == 4);
  // Continuation with a parent it holds.
  REQUIRE(core.kv_stored(d0, prompt[3], std::span(prompt).subspan(4, 3)).ok());
  CHECK(core.cached_blocks(d0, prompt) == 7);
  // A parent it does not hold: ignored (cannot be a leading hit).
  auto other = chain(12, 5);
  REQUIRE(core.kv_stored(d0, other[2], std::span(other).subspan(3)).ok());
  CHECK(core.index_blocks_count(d0) == 7);
  // Removing block 5 drops it and every deeper block of its chain.
  REQUIRE(core.kv_removed(d0, std::span(prompt).subspan(5, 1)).ok());
  CHECK(core.cached_blocks(d0, prompt) == 5);
  CHECK(core.index_blocks_count(d0) == 5);
  // Removing an unknown hash is a no-op; an unknown instance is not_found.
  REQUIRE(core.kv_removed(d0, std::span(other).first(1)).ok());
  auto unknown = core.kv_removed(InstanceId{99}, prompt);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().kind == ErrorKind::not_found);
  REQUIRE(core.kv_removed(d0, std::span(prompt).first(1)).ok());
  CHECK(core.index_blocks_count(d0) == 0);
  CHECK(core.index_nodes_count() == 0);
}

TEST_CASE("router: LRU evicts the least recently used chain, deepest blocks first") {
  RouterConfig config;
  config.prefix_index_blocks_max = 10;
  RouterCore core = make_core(config, {d0});
  auto a = chain(21, 6);
  auto b = chain(22, 6);
  REQUIRE(core.kv_stored(d0, std::nullopt, a).ok());
  REQUIRE(core.kv_stored(d0, std::nullopt, b).ok());
  CHECK(core.index_blocks_count(d0) == 10);
  CHECK(core.cached_blocks(d0, a) == 4);  // a's two deepest blocks went first
  CHECK(core.cached_blocks(d0, b) == 6);
  // Use a again (a pick touches it), then add c: b is now the oldest and loses blocks.
  REQUIRE(core.pick(request_for(a)).ok());
  CHECK(core.cached_blocks(d0, a) == 6);  // re-learned its tail, evicting b's
  CHECK(core.cached_blocks(d0, b) == 4);
  auto c = chain(23, 3);
  REQUIRE(core.kv_stored(d0, std::nullopt, c).ok());
  CHECK(core.cached_blocks(d0, b) == 1);
  CHECK(core.cached_blocks(d0, a) == 6);
  CHECK(core.cached_blocks(d0, c) == 3);
  CHECK(core.index_blocks_count(d0) == 10);
  // A shared prefix counts as used by every chain below it.
  auto shared = chain(24, 8, &a, 6);
  REQUIRE(core.kv_stored(d0, std::nullopt, shared).ok());
  CHECK(core.index_blocks_count(d0) == 10);
  CHECK(core.cached_blocks(d0, shared) == 8);
  CHECK(core.cached_blocks(d0, a) == 6);
}

TEST_CASE("router: bisection agrees with brute force over many instances") {
  RouterConfig config;
  config.instances_max = 130;  // three bitset words
  RouterCore core(config);
  auto prompt = chain(31, 300);
  std::vector<uint32_t> expected;
  for (uint32_t i = 0; i < 130; ++i) {
    REQUIRE(core.add_instance(InstanceId{i}, InstanceRole::decode).ok());
    uint32_t length = static_cast<uint32_t>(mix(i) % 301);
    if (i % 7 == 0) length = 300;
    if (i % 11 == 0) length = 0;
    expected.push_back(length);
    if (length > 0) {
      REQUIRE(core.kv_stored(InstanceId{i}, std::nullopt, std::span(prompt).first(length)).ok());
    }
  }
  auto scores = core.scores(request_for(prompt), InstanceRole::decode);
  REQUIRE(scores.ok());
  REQUIRE(scores->size() == 130);
  for (uint32_t i = 0; i < 130; ++i) CHECK((*scores)[i].cached_blocks == expected[i]);
  // Cut every instance at block 100 with one removed event each.
  for (uint32_t i = 0; i < 130; ++i) {
    REQUIRE(core.kv_removed(InstanceId{i}, std::span(prompt).subspan(100, 1)).ok());
  }
  for (uint32_t i = 0; i < 130; ++i) {
    CHECK(core.cached_blocks(InstanceId{i}, prompt) == std::min<uint32_t>(expected[i], 100));
  }
}

TEST_CASE("router: a burst between heartbeats spreads over equal instances") {
  RouterCore core = make_core(RouterConfig{}, {d0, d1, d2});
  std::map<uint32_t, int> counts;
  for (uint64_t i = 0; i < 9; ++i) {
    counts[core.pick(request_for(chain(100 + i, 2)))->decode.value]++;
  }
  CHECK(counts[d0.value] == 3);
  CHECK(counts[d1.value] == 3);
  CHECK(counts[d2.value] == 3);
  auto scores = core.scores(request_for(chain(1, 1)), InstanceRole::decode);
  // 3 picks since the last heartbeat on each: load 3, mean 3 -> queue 4 / 7.
  CHECK((*scores)[0].load_count == 3);
  CHECK((*scores)[0].queue == doctest::Approx(4.0 / 7.0));
}

TEST_CASE("router: identical inputs give identical picks") {
  auto run = [] {
    RouterConfig config;
    config.prefix_index_blocks_max = 50;
    config.disaggregate_tokens_min = 100;
    RouterCore core = make_core(config, {d0, d1, d2, d3}, {p0, p1});
    std::vector<std::pair<uint32_t, uint32_t>> out;
    auto system = chain(1, 10);
    for (uint64_t i = 0; i < 200; ++i) {
      auto prompt = chain(500 + i % 13, 10 + i % 17, &system, 10);
      Pick pick = core.pick(request_for(prompt)).value();
      out.emplace_back(pick.decode.value, pick.prefill ? pick.prefill->value : 0);
      if (i % 10 == 0)
        REQUIRE(core.update_load(d1, InstanceLoad{static_cast<uint32_t>(i % 3), 0, i, 300}).ok());
    }
    return out;
  };
  CHECK(run() == run());
}

TEST_CASE("router: bad input and bad config are errors, not crashes") {
  RouterCore core = make_core(RouterConfig{}, {d0});
  auto prompt = chain(1, 4);
  auto short_prompt = core.pick(PickRequest{prompt, 63});
  REQUIRE_FALSE(short_prompt.ok());
  CHECK(short_prompt.error().kind == ErrorKind::invalid);
  CHECK(short_prompt.error().message.find("prompt_tokens 63") != std::string::npos);
  CHECK(core.add_instance(d0, InstanceRole::prefill).error().kind == ErrorKind::invalid);
  CHECK(core.set_up(d1, true).error().kind == ErrorKind::not_found);
  CHECK(core.update_load(d1, {}).error().kind == ErrorKind::not_found);
  CHECK(core.remove_instance(d1).error().kind == ErrorKind::not_found);
  // The same hash repeated (an inconsistent chain) does not break the index.
  std::vector<BlockHash> repeated{prompt[0], prompt[1], prompt[0], prompt[1]};
  REQUIRE(core.pick(request_for(repeated)).ok());
  CHECK(core.cached_blocks(d0, repeated) == 2);
  RouterConfig small;
  small.instances_max = 1;
  RouterCore one = make_core(small, {d0});
  CHECK(one.add_instance(d1, InstanceRole::decode).error().kind == ErrorKind::overloaded);
  REQUIRE(one.remove_instance(d0).ok());
  CHECK(one.add_instance(d1, InstanceRole::decode).ok());
  RouterConfig bad;
  bad.weight_prefix = bad.weight_queue = bad.weight_kv_usage = 0.0;
  CHECK(validate(bad).error().message.find("all zero") != std::string::npos);
  bad = RouterConfig{};
  bad.weight_queue = -1;
  CHECK(validate(bad).error().message.find("weight_queue") != std::string::npos);
  bad = RouterConfig{};
  bad.load_imbalance_max = -0.5;
  CHECK(validate(bad).error().message.find("load_imbalance_max") != std::string::npos);
  bad.load_imbalance_max = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(validate(bad).ok());
  bad.load_imbalance_max = std::numeric_limits<double>::infinity();  // no bound: valid
  CHECK(validate(bad).ok());
  bad.prefill_load_imbalance_max = -1;
  CHECK(validate(bad).error().message.find("prefill_load_imbalance_max") != std::string::npos);
  bad = RouterConfig{};
  bad.block_tokens = 0;
  CHECK_THROWS_AS(RouterCore{bad}, std::invalid_argument);
}

TEST_CASE("router: a prompt longer than the index capacity keeps its leading blocks") {
  RouterConfig config;
  config.prefix_index_blocks_max = 5;
  RouterCore core = make_core(config, {d0});
  auto prompt = chain(41, 12);
  REQUIRE(core.pick(request_for(prompt)).ok());
  CHECK(core.index_blocks_count(d0) == 5);
  CHECK(core.cached_blocks(d0, prompt) == 5);
  CHECK(core.holds(d0, prompt[4]));
  CHECK_FALSE(core.holds(d0, prompt[5]));
}

TEST_CASE("router: random operations keep the index prefix-closed (bisection == scan)") {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    RouterConfig config;
    config.prefix_index_blocks_max = 40;
    config.disaggregate_tokens_min = 32;
    config.instances_max = 8;
    RouterCore core = make_core(config, {d0, d1, d2}, {p0, p1});
    std::vector<InstanceId> all{d0, d1, d2, p0, p1};
    // A small family of chains sharing prefixes, so blocks are shared and evicted a lot.
    std::vector<std::vector<BlockHash>> chains{chain(seed * 100, 30)};
    for (uint64_t c = 1; c < 8; ++c) {
      const auto& base = chains[mix(seed + c) % chains.size()];
      chains.push_back(chain(seed * 100 + c, 10 + mix(c) % 30, &base, mix(c * 7) % 12));
    }
    uint64_t state = seed;
    for (int step = 0; step < 600; ++step) {
      state = mix(state);
      const auto& hashes = chains[state % chains.size()];
      InstanceId who = all[(state >> 8) % all.size()];
      size_t cut = (state >> 16) % hashes.size();
      switch ((state >> 32) % 6) {
        case 0:
        case 1:
          REQUIRE(core.pick(request_for(hashes)).ok());
          break;
        case 2:
          REQUIRE(core.kv_stored(who, std::nullopt, std::span(hashes).first(cut)).ok());
          break;
        case 3:
          REQUIRE(core.kv_removed(who, std::span(hashes).subspan(cut, 1)).ok());
          break;
        case 4:
          REQUIRE(core.update_load(who, InstanceLoad{uint32_t(state % 4), 0, 1, 4}).ok());
          break;
        case 5:
          if (who != d0) REQUIRE(core.set_up(who, !((state >> 40) % 2)).ok());
          break;
      }
      core.check_invariants();  // LRU list order, leaves listed, counts, closure
      for (InstanceId id : all) {
        CHECK(core.index_blocks_count(id) <= 40);
        for (const auto& probe : chains) {
          uint32_t scan = 0;
          while (scan < probe.size() && core.holds(id, probe[scan])) ++scan;
          REQUIRE(core.cached_blocks(id, probe) == scan);
          for (size_t i = scan; i < probe.size(); ++i) {
            REQUIRE_FALSE(core.holds(id, probe[i]));  // closed: nothing held past a gap
          }
        }
      }
    }
  }
}

TEST_CASE("router: the load counts waiting, running and picks since the heartbeat") {
  RouterCore core = make_core(RouterConfig{}, {d0, d1});
  auto prompt = chain(3, 4);
  REQUIRE(core.update_load(d0, InstanceLoad{1, 6, 0, 0}).ok());
  REQUIRE(core.update_load(d1, InstanceLoad{0, 1, 0, 0}).ok());
  auto scores = core.scores(request_for(prompt), InstanceRole::decode);
  REQUIRE(scores.ok());
  CHECK((*scores)[0].load_count == 7);  // a big running batch counts, not only the queue
  CHECK((*scores)[1].load_count == 1);
  CHECK((*scores)[0].queue < (*scores)[1].queue);
  CHECK((*scores)[0].queue == doctest::Approx(5.0 / 12.0));  // mean 4
  CHECK((*scores)[1].queue == doctest::Approx(5.0 / 6.0));
  // Queue scores are relative: doubling every load keeps them within the same band.
  REQUIRE(core.update_load(d0, InstanceLoad{2, 12, 0, 0}).ok());
  REQUIRE(core.update_load(d1, InstanceLoad{0, 2, 0, 0}).ok());
  auto doubled = core.scores(request_for(prompt), InstanceRole::decode);
  CHECK((*doubled)[1].queue == doctest::Approx(9.0 / 11.0));
  // A pick counts on the picked instance until its next heartbeat replaces the load.
  Pick pick = core.decide(request_for(prompt)).value();
  CHECK(pick.decode == d1);
  auto after = core.scores(request_for(prompt), InstanceRole::decode);
  CHECK((*after)[1].load_count == 3);
  REQUIRE(core.update_load(d1, InstanceLoad{0, 3, 0, 0}).ok());
  CHECK((*core.scores(request_for(prompt), InstanceRole::decode))[1].load_count == 3);
  // Going down forgets the load and the in-flight picks.
  REQUIRE(core.set_up(d1, false).ok());
  REQUIRE(core.set_up(d1, true).ok());
  CHECK((*core.scores(request_for(prompt), InstanceRole::decode))[1].load_count == 0);
}

// Sessions that share a long prefix held by one instance: without a bound they all pile
// onto it; with the bound the load stays within (1 + e) x the mean, and equal loads still
// go to the instance holding the prefix.
TEST_CASE("router: bounded load avoids hot spots and keeps affinity") {
  auto run = [](double imbalance_max) {
    RouterConfig config;
    config.load_imbalance_max = imbalance_max;
    RouterCore core = make_core(config, {d0, d1, d2, d3});
    auto repo = chain(50, 64);
    REQUIRE(core.kv_stored(d0, std::nullopt, repo).ok());
    std::map<uint32_t, uint32_t> running;  // the instances' batches (nothing finishes)
    for (uint64_t session = 0; session < 40; ++session) {
      auto prompt = chain(600 + session, 66, &repo, 64);
      Pick pick = core.pick(request_for(prompt)).value();
      running[pick.decode.value] += 1;
      InstanceLoad load{0, running[pick.decode.value], 0, 0};
      REQUIRE(core.update_load(pick.decode, load).ok());  // the heartbeat shows the batch
    }
    return running;
  };
  auto unbounded = run(std::numeric_limits<double>::infinity());
  CHECK(unbounded[d0.value] == 40);  // prefix affinity alone: every session on d0
  auto bounded = run(0.5);
  for (InstanceId id : {d0, d1, d2, d3}) CHECK(bounded[id.value] <= 15);  // < 1.5 x 40 / 4 + 1
  CHECK(bounded.size() >= 3);  // spread, but only as far as needed: the repo moved to
  // the instances that took its overflow, and they keep getting its sessions
  CHECK(bounded[d0.value] >= 10);  // the prefix holder still gets at least its share
  auto even = run(0.0);  // e = 0: the least loaded always wins, so loads differ by <= 1
  for (InstanceId id : {d0, d1, d2, d3}) CHECK(even[id.value] == 10);
  // Equal loads: affinity decides.
  RouterCore core = make_core(RouterConfig{}, {d0, d1, d2, d3});
  auto repo = chain(51, 64);
  REQUIRE(core.kv_stored(d2, std::nullopt, repo).ok());
  for (InstanceId id : {d0, d1, d2, d3}) REQUIRE(core.update_load(id, {0, 4, 0, 0}).ok());
  CHECK(core.decide(request_for(chain(700, 66, &repo, 64))).value().decode == d2);
}

TEST_CASE("router: prefill instances have their own bound (none by default)") {
  auto setup = [](double prefill_imbalance_max) {
    RouterConfig config;
    config.disaggregate_tokens_min = 16;
    config.prefill_by_work = false;  // the weighted score, as for decode
    config.prefill_load_imbalance_max = prefill_imbalance_max;
    RouterCore core = make_core(config, {d0}, {p0, p1});
    REQUIRE(core.kv_stored(p0, std::nullopt, chain(52, 32)).ok());
    REQUIRE(core.update_load(p0, InstanceLoad{6, 2, 0, 0}).ok());
    REQUIRE(core.update_load(p1, InstanceLoad{0, 1, 0, 0}).ok());
    return core;
  };
  auto repo = chain(52, 32);
  RouterCore unbounded = setup(std::numeric_limits<double>::infinity());
  Pick cached = unbounded.decide(request_for(chain(53, 40, &repo, 32))).value();
  REQUIRE(cached.prefill);
  CHECK(*cached.prefill == p0);  // 0.8 + 5.5 / 13.5 + 1 beats 0 + 5.5 / 6.5 + 1
  RouterCore core = setup(0.5);
  Pick pick = core.decide(request_for(chain(53, 40, &repo, 32))).value();
  REQUIRE(pick.prefill);
  CHECK(*pick.prefill == p1);  // p0 holds the prefix but is at 8 >= 1.5 x (9 + 1) / 2
  REQUIRE(core.update_load(p0, InstanceLoad{2, 2, 0, 0}).ok());
  REQUIRE(core.update_load(p1, InstanceLoad{0, 2, 0, 0}).ok());
  pick = core.decide(request_for(chain(54, 40, &repo, 32))).value();
  CHECK(*pick.prefill == p0);
  CHECK(pick.prefill_cached_blocks == 32);
}

// decide() + record() must give exactly what pick() gives, step for step.
TEST_CASE("router: decide then record equals pick") {
  auto make = [] {
    RouterConfig config;
    config.prefix_index_blocks_max = 60;
    config.disaggregate_tokens_min = 64;
    config.instances_max = 8;
    return make_core(config, {d0, d1, d2, d3}, {p0, p1});
  };
  RouterCore whole = make();
  RouterCore split = make();
  auto system = chain(2, 12);
  std::vector<std::vector<BlockHash>> sessions;
  for (uint64_t i = 0; i < 6; ++i) sessions.push_back(chain(300 + i, 14, &system, 12));
  uint64_t state = 9;
  for (int step = 0; step < 400; ++step) {
    state = mix(state);
    auto& session = sessions[state % sessions.size()];
    if ((state >> 8) % 3 == 0) session = chain(state, session.size() + 3, &session, session.size());
    if (session.size() > 80) session = chain(state, 14, &system, 12);
    Pick a = whole.pick(request_for(session)).value();
    Pick b = split.decide(request_for(session)).value();
    split.record(request_for(session), b);
    REQUIRE(a.decode == b.decode);
    REQUIRE(a.prefill == b.prefill);
    REQUIRE(a.decode_cached_blocks == b.decode_cached_blocks);
    REQUIRE(a.prefill_cached_blocks == b.prefill_cached_blocks);
    REQUIRE(a.decode_score == b.decode_score);
    if (step % 7 == 0) {
      InstanceLoad load{uint32_t(state % 5), uint32_t((state >> 4) % 9), 10, 100};
      InstanceId who = std::vector<InstanceId>{d0, d1, d2, d3, p0, p1}[(state >> 12) % 6];
      REQUIRE(whole.update_load(who, load).ok());
      REQUIRE(split.update_load(who, load).ok());
    }
  }
  for (InstanceId id : {d0, d1, d2, d3, p0, p1}) {
    CHECK(whole.index_blocks_count(id) == split.index_blocks_count(id));
    for (const auto& session : sessions) {
      CHECK(whole.cached_blocks(id, session) == split.cached_blocks(id, session));
    }
  }
  whole.check_invariants();
  split.check_invariants();
}

TEST_CASE("router: record after the index changed re-measures, never corrupts") {
  RouterCore core = make_core(RouterConfig{}, {d0});
  auto prompt = chain(60, 20);
  REQUIRE(core.kv_stored(d0, std::nullopt, std::span(prompt).first(10)).ok());
  Pick pick = core.decide(request_for(prompt)).value();
  CHECK(pick.decode_cached_blocks == 10);
  // Between decide and record the instance dropped block 5 (and everything below it).
  REQUIRE(core.kv_removed(d0, std::span(prompt).subspan(5, 1)).ok());
  core.record(request_for(prompt), pick);
  CHECK(core.cached_blocks(d0, prompt) == 20);
  // Or learned more than decide saw.
  auto other = chain(61, 20);
  Pick second = core.decide(request_for(other)).value();
  REQUIRE(core.kv_stored(d0, std::nullopt, std::span(other).first(15)).ok());
  core.record(request_for(other), second);
  CHECK(core.cached_blocks(d0, other) == 20);
  CHECK(core.index_blocks_count(d0) == 40);
  // An instance that went down meanwhile is skipped.
  auto third = chain(62, 8);
  Pick down = core.decide(request_for(third)).value();
  REQUIRE(core.set_up(d0, false).ok());
  core.record(request_for(third), down);
  CHECK(core.index_blocks_count(d0) == 0);
  core.check_invariants();
}

// Touching a prefix makes its inner blocks newer than the chain's leaf: eviction must still
// take the least recently used leaf first (inner blocks inherit a dropped child's stamp).
TEST_CASE("router: LRU order with touched inner blocks") {
  RouterConfig config;
  config.prefix_index_blocks_max = 10;
  RouterCore core = make_core(config, {d0});
  auto a = chain(70, 6);
  REQUIRE(core.kv_stored(d0, std::nullopt, a).ok());                   // a0..a5
  REQUIRE(core.kv_stored(d0, std::nullopt, std::span(a).first(3)).ok());  // a0..a2 used again
  auto b = chain(71, 6);
  REQUIRE(core.kv_stored(d0, std::nullopt, b).ok());  // 12 held: a5 and a4 go
  CHECK(core.cached_blocks(d0, a) == 4);
  CHECK(core.cached_blocks(d0, b) == 6);
  core.check_invariants();
  REQUIRE(core.kv_stored(d0, std::nullopt, chain(72, 1)).ok());  // a3 (stamp of a5) goes
  CHECK(core.cached_blocks(d0, a) == 3);
  REQUIRE(core.kv_stored(d0, std::nullopt, chain(73, 1)).ok());  // then a2, the oldest leaf
  CHECK(core.cached_blocks(d0, a) == 2);
  REQUIRE(core.kv_stored(d0, std::nullopt, chain(74, 1)).ok());
  CHECK(core.cached_blocks(d0, a) == 1);
  CHECK(core.cached_blocks(d0, b) == 6);  // b is newer than every block of a
  CHECK(core.index_blocks_count(d0) == 10);
  core.check_invariants();
  // A long chain into a full index keeps its leading blocks and evicts the rest of a first.
  auto c = chain(75, 30);
  REQUIRE(core.kv_stored(d0, std::nullopt, c).ok());
  CHECK(core.cached_blocks(d0, c) == 10);
  CHECK(core.cached_blocks(d0, a) == 0);
  core.check_invariants();
}

// Prefill by work: estimated tokens ahead of the first token = load x mean uncached tokens
// of recent P/D picks + this prompt's uncached tokens there.
TEST_CASE("router: prefill by work weighs the cache against the queue in tokens") {
  RouterConfig config;
  config.disaggregate_tokens_min = 16;
  REQUIRE(config.prefill_by_work);  // the default
  RouterCore core = make_core(config, {d0}, {p0, p1});
  auto session = chain(80, 64);  // 64 blocks of 16 + 5 tokens = 1029 tokens
  REQUIRE(core.kv_stored(p0, std::nullopt, std::span(session).first(60)).ok());
  for (InstanceId id : {p0, p1}) REQUIRE(core.update_load(id, {0, 1, 0, 0}).ok());
  Pick first = core.decide(request_for(session)).value();
  REQUIRE(first.prefill);
  CHECK(*first.prefill == p0);  // 1 x 1029 + 69 < 1 x 1029 + 1029
  CHECK(first.prefill_cached_blocks == 60);
  // Mean uncached tokens is now 69: three queued requests on p0 cost less than a miss.
  REQUIRE(core.update_load(p0, {1, 2, 0, 0}).ok());
  REQUIRE(core.update_load(p1, {0, 0, 0, 0}).ok());
  CHECK(*core.decide(request_for(session)).value().prefill == p0);  // 3 x 69 + 69 < 1029
  // Twenty do not: 20 x 69 + 69 > 0 + 1029.
  REQUIRE(core.update_load(p0, {10, 10, 0, 0}).ok());
  REQUIRE(core.update_load(p1, {0, 0, 0, 0}).ok());
  CHECK(*core.decide(request_for(session)).value().prefill == p1);
  // Equal work: more free KV wins.
  RouterCore tie = make_core(config, {d0}, {p0, p1});
  REQUIRE(tie.update_load(p0, {0, 0, 90, 100}).ok());
  REQUIRE(tie.update_load(p1, {0, 0, 10, 100}).ok());
  CHECK(*tie.decide(request_for(chain(81, 8))).value().prefill == p1);
  // The weighted score instead (prefill_by_work = false) compares fractions, not tokens:
  // p0 (3 running) scores 60/64 + 2.5/5.5 + 1 against p1's 0 + 1 + 1.
  config.prefill_by_work = false;
  RouterCore weighted = make_core(config, {d0}, {p0, p1});
  REQUIRE(weighted.kv_stored(p0, std::nullopt, std::span(session).first(60)).ok());
  REQUIRE(weighted.update_load(p0, {0, 3, 0, 0}).ok());
  auto scores = weighted.scores(request_for(session), InstanceRole::prefill);
  REQUIRE(scores.ok());
  CHECK((*scores)[0].total > (*scores)[1].total);
  CHECK(*weighted.decide(request_for(session)).value().prefill == p0);
}

TEST_CASE("router: prefill by work counts the tokens an instance reports pending, and room") {
  RouterConfig config;
  config.disaggregate_tokens_min = 16;
  RouterCore core = make_core(config, {d0}, {p0, p1});
  auto session = chain(90, 64);  // 1029 tokens, 60 blocks cached on p0: 69 uncached there
  REQUIRE(core.kv_stored(p0, std::nullopt, std::span(session).first(60)).ok());
  auto load = [](uint32_t waiting, uint64_t pending) {
    InstanceLoad l{waiting, 0, 0, 0};
    l.pending_tokens = pending;
    return l;
  };
  // Twenty queued requests, but only 500 tokens left to compute: the cache wins (500 + 69 <
  // 1029), where load x mean would have moved the session.
  REQUIRE(core.update_load(p0, load(20, 500)).ok());
  REQUIRE(core.update_load(p1, load(0, 0)).ok());
  CHECK(*core.decide(request_for(session)).value().prefill == p0);
  // The pick's own uncached tokens count until the next report: 500 + 69 + 69 < 1029 ...
  CHECK(*core.decide(request_for(session)).value().prefill == p0);
  // ... and a long queue in tokens moves it: 2000 + 69 > 1029.
  REQUIRE(core.update_load(p0, load(1, 2000)).ok());
  CHECK(*core.decide(request_for(session)).value().prefill == p1);
  // Room: a cold prompt (1029 tokens = 65 blocks of 16) on a full pool evicts cached blocks:
  // those tokens count twice, so the instance with free blocks takes it.
  RouterCore cold = make_core(config, {d0}, {p0, p1});
  auto with_room = [](uint64_t pending, uint64_t free_blocks) {
    InstanceLoad l{0, 0, 100, 200};
    l.pending_tokens = pending;
    l.kv_blocks_free = free_blocks;
    return l;
  };
  REQUIRE(cold.update_load(p0, with_room(0, 0)).ok());
  REQUIRE(cold.update_load(p1, with_room(800, 100)).ok());
  CHECK(*cold.decide(request_for(chain(91, 64))).value().prefill == p1);  // 1829 < 2058
  REQUIRE(cold.update_load(p1, with_room(1100, 100)).ok());
  CHECK(*cold.decide(request_for(chain(92, 64))).value().prefill == p0);  // 2058 < 2129
}

TEST_CASE("router: sub-blocks: matches count sub-blocks, tier 2 is credited by whole blocks") {
  RouterConfig config;
  config.block_tokens = 4;          // tokens per prefix hash
  config.sub_blocks_per_block = 4;  // 16-token blocks
  config.disaggregate_tokens_min = 4;
  RouterCore core = tier2_core(config);
  auto q = chain(93, 40);  // 40 sub-blocks = 10 blocks
  REQUIRE(core.kv_stored(p0, std::nullopt, std::span(q).first(22)).ok());  // 5.5 blocks
  // Tier 2 on p1's node holds blocks 0..7 (every 4th prefix hash).
  std::vector<BlockHash> blocks;
  for (size_t i = 3; i < 32; i += 4) blocks.push_back(q[i]);
  REQUIRE(core.tier2_stored(2, blocks) == 0);
  auto request = request_for(q, 4);
  auto scores = core.scores(request, InstanceRole::prefill);
  REQUIRE(scores.ok());
  REQUIRE(scores->size() == 2);
  CHECK((*scores)[0].cached_blocks == 22);
  // p0: tier 2 (remote) from block 5, the one holding sub-block 22: blocks 5..7 = sub-blocks
  // 22..31, 10 past the device's 22.
  CHECK((*scores)[0].tier2_blocks == 10);
  CHECK((*scores)[0].tier2_remote);
  CHECK((*scores)[1].cached_blocks == 0);
  CHECK((*scores)[1].tier2_blocks == 32);  // its own node's, blocks 0..7
  CHECK_FALSE((*scores)[1].tier2_remote);
}

TEST_CASE("router: sub-blocks: a tier-2 partial block is credited after the whole ones") {
  RouterConfig config;
  config.block_tokens = 4;
  config.sub_blocks_per_block = 4;
  config.disaggregate_tokens_min = 4;
  RouterCore core = tier2_core(config);
  auto q = chain(94, 39);  // 9 full blocks and 3 sub-blocks of a tenth
  // p1's node holds blocks 0..3 and block 4's first 2 sub-blocks (a turn that ended there),
  // and block 5 whole (unreachable past the partial).
  std::vector<BlockHash> held{q[3], q[7], q[11], q[15], q[17], q[23]};
  REQUIRE(core.tier2_stored(2, held) == 0);
  auto scores = core.scores(request_for(q, 4), InstanceRole::prefill);
  REQUIRE(scores.ok());
  CHECK((*scores)[1].tier2_blocks == 18);  // 16 whole sub-blocks + 2 of block 4
  CHECK(core.tier2().reach(2, q, 4, 0) == 18);
  CHECK(core.tier2().reach(2, q, 4, 4) == 2);   // from block 4: its partial only
  CHECK(core.tier2().reach(2, q, 4, 5) == 4);   // block 5 whole, then block 6 has nothing
  // p0's device holds 17 sub-blocks (one of block 4): the partial adds one past it.
  REQUIRE(core.kv_stored(p0, std::nullopt, std::span(q).first(17)).ok());
  auto with_device = core.scores(request_for(q, 4), InstanceRole::prefill).value();
  CHECK(with_device[0].cached_blocks == 17);
  CHECK(with_device[0].tier2_blocks == 1);
  CHECK(with_device[0].tier2_remote);
  // The prompt's trailing partial block: held as its 3-sub-block prefix.
  std::vector<BlockHash> rest{q[19], q[23], q[27], q[31], q[35], q[38]};
  REQUIRE(core.tier2_stored(2, rest) == 0);
  CHECK(core.tier2().reach(2, q, 4, 0) == 39);  // every sub-block of the prompt
  CHECK(core.tier2().reach(2, q, 4, 8) == 7);   // block 8, then the partial rides along
  // A device that holds every whole block: prefill does not ask for the trailing partial
  // alone (prefill::tier2_lack), so it is not credited.
  CHECK(core.tier2().reach(2, q, 4, 9) == 0);
  // k == 1: consecutive whole blocks.
  CHECK(core.tier2().reach(2, std::span(q).first(4), 1, 0) == 0);     // q[0] is not held
  CHECK(core.tier2().reach(2, std::span(q).subspan(3, 5), 1, 0) == 1);  // q[3], not q[4]
}

TEST_CASE("router: a tier-2 copy on the prefill instance's node is credited below a device hit") {
  RouterConfig config;
  config.disaggregate_tokens_min = 16;
  RouterCore core = tier2_core(config);
  auto session = chain(90, 64);  // 64 blocks of 16 + 5 tokens = 1029 tokens
  // Nothing anywhere: equal work, the rotation decides; no tier-2 blocks reported.
  Pick cold = core.decide(request_for(session)).value();
  REQUIRE(cold.prefill);
  CHECK(cold.prefill_tier2_blocks == 0);
  // Node 2's tier 2 holds the first 48 blocks: p1 is picked whatever the rotation says, and
  // the pick says how many blocks its tier 2 adds.
  REQUIRE(core.tier2_stored(2, std::span(session).first(48)) == 0);
  CHECK(core.tier2().blocks_count(2) == 48);
  for (int i = 0; i < 4; ++i) {
    Pick p = core.decide(request_for(session)).value();
    REQUIRE(p.prefill);
    CHECK(*p.prefill == p1);
    CHECK(p.prefill_cached_blocks == 0);
    CHECK(p.prefill_tier2_blocks == 48);
    for (InstanceId id : {p0, p1}) REQUIRE(core.update_load(id, {}).ok());
  }
  // A device hit on p0 of 40 blocks beats a tier-2 hit of 48 at weight 0.8 (38.4 blocks)...
  // (p0 reads blocks 40..47 from node 2's tier 2, a remote copy: 40 + 0.5 x 8 = 44)
  REQUIRE(core.kv_stored(p0, std::nullopt, std::span(session).first(40)).ok());
  Pick device = core.decide(request_for(session)).value();
  CHECK(*device.prefill == p0);
  CHECK(device.prefill_cached_blocks == 40);
  CHECK(device.prefill_tier2_blocks == 8);  // node 1 holds nothing in tier 2; node 2 does
  CHECK(device.prefill_tier2_site == std::optional<uint32_t>(2));
  for (InstanceId id : {p0, p1}) REQUIRE(core.update_load(id, {}).ok());
  // ... and tier 2 continues a device hit: node 1's tier 2 holding blocks 40..59 makes p0's
  // credit 40 + 0.8 x 20.
  REQUIRE(core.tier2_stored(1, std::span(session).subspan(40, 20)) == 0);
  auto scores = core.scores(request_for(session), InstanceRole::prefill).value();
  REQUIRE(scores.size() == 2);
  CHECK(scores[0].id == p0);
  CHECK(scores[0].cached_blocks == 40);
  CHECK(scores[0].tier2_blocks == 20);
  CHECK(scores[0].prefix == doctest::Approx((40 + 0.8 * 20) / 64.0));
  CHECK(scores[1].tier2_blocks == 48);
  // Removed blocks stop counting; a cleared node counts nothing.
  core.tier2_removed(2, std::span(session).subspan(10, 1));
  CHECK(core.scores(request_for(session), InstanceRole::prefill).value()[1].tier2_blocks == 10);
  core.tier2_clear(2);
  CHECK(core.tier2().blocks_count(2) == 0);
  CHECK(core.scores(request_for(session), InstanceRole::prefill).value()[1].tier2_blocks == 0);
  // Weight 0 ignores tier 2; a weight outside [0, 1] is a config error.
  config.tier2_weight = 0.0;
  config.tier2_remote_weight = 0.0;
  RouterCore off(config);
  REQUIRE(off.add_instance(d0, InstanceRole::decode, 0).ok());
  REQUIRE(off.add_instance(p0, InstanceRole::prefill, 1).ok());
  REQUIRE(off.tier2_stored(1, std::span(session).first(48)) == 0);
  CHECK(off.decide(request_for(session)).value().prefill_tier2_blocks == 0);
  config.tier2_weight = 1.5;
  CHECK_THROWS_AS(RouterCore{config}, std::invalid_argument);
  config.tier2_weight = std::numeric_limits<double>::quiet_NaN();
  CHECK(!tandem::router::validate(config).ok());
}

TEST_CASE("router: another node's tier-2 copy is credited at tier2_remote_weight and named") {
  RouterConfig config;
  config.disaggregate_tokens_min = 16;
  RouterCore core = tier2_core(config);
  auto session = chain(93, 64);
  // Only node 3 (a kv-offload without prefill) holds the prompt: either prefill instance
  // reads it from there; the pick names the site, and the score says remote.
  REQUIRE(core.tier2_stored(3, std::span(session).first(48)) == 0);
  Pick remote = core.decide(request_for(session)).value();
  REQUIRE(remote.prefill);
  CHECK(remote.prefill_tier2_blocks == 48);
  CHECK(remote.prefill_tier2_site == std::optional<uint32_t>(3));
  for (InstanceId id : {p0, p1}) REQUIRE(core.update_load(id, {}).ok());
  auto scores = core.scores(request_for(session), InstanceRole::prefill).value();
  REQUIRE(scores.size() == 2);
  for (const auto& score : scores) {
    CHECK(score.tier2_blocks == 48);
    CHECK(score.tier2_remote);
    CHECK(score.prefix == doctest::Approx(0.5 * 48 / 64.0));
  }
  // The same 48 blocks on node 1: p0 reads its own node's (0.8 beats 0.5), no site named.
  REQUIRE(core.tier2_stored(1, std::span(session).first(48)) == 0);
  for (int i = 0; i < 3; ++i) {
    Pick local = core.decide(request_for(session)).value();
    CHECK(*local.prefill == p0);
    CHECK(local.prefill_tier2_blocks == 48);
    CHECK(!local.prefill_tier2_site);
    for (InstanceId id : {p0, p1}) REQUIRE(core.update_load(id, {}).ok());
  }
  // A longer remote run is worth more than a short local one: node 1 keeps 10 (8 credited),
  // node 3 holds 48 (24 credited).
  core.tier2_removed(1, std::span(session).subspan(10, 1));
  auto after = core.scores(request_for(session), InstanceRole::prefill).value();
  CHECK(after[0].id == p0);
  CHECK(after[0].tier2_blocks == 48);
  CHECK(after[0].tier2_remote);
  // tier2_remote_weight 0: a remote copy is worth nothing; above tier2_weight: a config error.
  config.tier2_remote_weight = 0.0;
  RouterCore local_only(config);
  REQUIRE(local_only.add_instance(d0, InstanceRole::decode, 0).ok());
  REQUIRE(local_only.add_instance(p0, InstanceRole::prefill, 1).ok());
  REQUIRE(local_only.tier2_stored(3, std::span(session).first(48)) == 0);
  Pick none = local_only.decide(request_for(session)).value();
  CHECK(none.prefill_tier2_blocks == 0);
  CHECK(!none.prefill_tier2_site);
  config.tier2_remote_weight = 0.9;  // > tier2_weight 0.8
  CHECK_THROWS_AS(RouterCore{config}, std::invalid_argument);
}

TEST_CASE("router: no tier-2 credit where the prefill instance's cost rule would not read it") {
  RouterConfig config;
  config.disaggregate_tokens_min = 16;
  RouterCore core = tier2_core(config);
  auto session = chain(94, 64);
  REQUIRE(core.tier2_stored(1, std::span(session).first(40)) == 0);  // p0's node
  REQUIRE(core.tier2_stored(3, std::span(session).first(48)) == 0);  // a third node
  auto load = [](bool local, bool remote) {
    InstanceLoad l;
    l.tier2_local_reads = local;
    l.tier2_remote_reads = remote;
    return l;
  };
  // Both read: p0 its own node's 40 blocks (32 credited beat node 3's 24), p1 node 3's 48.
  auto scores = core.scores(request_for(session), InstanceRole::prefill).value();
  CHECK(scores[0].tier2_blocks == 40);
  CHECK(!scores[0].tier2_remote);
  CHECK(scores[1].tier2_blocks == 48);
  CHECK(scores[1].tier2_remote);
  // p0's local disk is slower than its compute: it still reads remote copies; p1 reads none.
  REQUIRE(core.update_load(p0, load(false, true)).ok());
  REQUIRE(core.update_load(p1, load(true, false)).ok());
  scores = core.scores(request_for(session), InstanceRole::prefill).value();
  CHECK(scores[0].tier2_blocks == 48);
  CHECK(scores[0].tier2_remote);
  CHECK(scores[1].tier2_blocks == 0);
  CHECK(scores[1].prefix == 0.0);
  // Neither reads: no credit, no site named, whatever tier 2 holds.
  REQUIRE(core.update_load(p0, load(false, false)).ok());
  REQUIRE(core.update_load(p1, load(false, false)).ok());
  Pick pick = core.decide(request_for(session)).value();
  REQUIRE(pick.prefill);
  CHECK(pick.prefill_tier2_blocks == 0);
  CHECK(!pick.prefill_tier2_site);
}

TEST_CASE("router: the tier-2 index is bounded per node and refuses past it") {
  RouterConfig config;
  config.tier2_index_blocks_max = 10;
  RouterCore core(config);
  auto a = chain(91, 8), b = chain(92, 8);
  CHECK(core.tier2_stored(3, a) == 0);
  CHECK(core.tier2_stored(3, a) == 0);  // already held: not counted twice
  CHECK(core.tier2().blocks_count(3) == 8);
  CHECK(core.tier2_stored(3, b) == 6);  // two fit
  CHECK(core.tier2().blocks_count(3) == 10);
  CHECK(core.tier2().refused_count() == 6);
  CHECK(core.tier2_stored(4, b) == 0);  // another node has its own bound
  core.tier2_removed(3, std::span(a).first(4));
  CHECK(core.tier2().blocks_count(3) == 6);
  CHECK(core.tier2().reach(3, a, 1, 0) == 0);
  CHECK(core.tier2().reach(3, a, 1, 4) == 4);
  CHECK(core.tier2().reach(4, b, 1, 0) == 8);
  core.tier2_removed(9, a);  // an unknown node: nothing to do
  CHECK(core.tier2().blocks_count(9) == 0);
}

// ---- Precise device-tier events (issue 13): the index rebuilt from a cache's events. ----

#include <memory>
#include <random>
#include <set>

#include "actors/router/kv_sequence.hpp"
#include "kvstore/prefix_cache.hpp"

namespace {

// One numbered frame as the shells send it (actors/common/shell KvEventReporter::flush).
struct DeviceFrame {
  uint64_t incarnation = 0;
  uint64_t sequence = 0;
  bool all_cleared = false;
  bool keepalive = false;
  tandem::kv::CacheEvents events;
};

// The router's side of a precise device stream (router_actor on_device_events), on the core.
void apply_frame(RouterCore& core, InstanceId id, tandem::router::KvSequence& seq,
                 const DeviceFrame& f) {
  using V = tandem::router::KvSequence::Verdict;
  V verdict = seq.on_frame(f.incarnation, f.sequence, f.all_cleared, f.keepalive);
  if (verdict == V::reset_apply || verdict == V::drop_lost) REQUIRE(core.kv_clear(id).ok());
  if (verdict != V::apply && verdict != V::reset_apply) return;
  REQUIRE(core.kv_removed(id, f.events.removed).ok());
  for (size_t i = 0; i < f.events.stored.size(); ++i) {
    REQUIRE(core.kv_stored(id, f.events.stored_parents[i],
                           std::span(f.events.stored).subspan(i, 1))
                .ok());
  }
}

}  // namespace

TEST_CASE("precise events: the router's index equals the cache over a lossy channel with restarts") {
  using namespace std::chrono_literals;
  uint32_t checked = 0, gaps = 0, restarts = 0;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    RouterCore core = make_core(RouterConfig{}, {d0});
    tandem::router::KvSequence seq(100ms);
    auto now = tandem::router::KvSequence::Clock::time_point{} + 1s;
    uint64_t incarnation = 1, sequence = 0;
    bool snapshot_due = true;
    auto cache = std::make_unique<tandem::kv::PrefixCache>(24, 16);
    std::vector<std::vector<uint32_t>> held;
    std::vector<std::vector<BlockHash>> heads = {chain(900, 2), chain(901, 2), chain(902, 2)};
    std::set<BlockHash> universe;
    auto send = [&](DeviceFrame f) {
      if (rng() % 10 == 0) return;  // lost on the way (10%)
      apply_frame(core, d0, seq, f);
    };
    for (int round = 0; round < 300; ++round) {
      // Some cache activity: prompts of 9 documents sharing 3 heads, and releases.
      for (int op = 0; op < 6; ++op) {
        if (rng() % 2 == 0) {
          uint32_t doc = rng() % 9;
          auto hashes = chain(doc, 2 + rng() % 7, &heads[doc / 3], 2);
          universe.insert(hashes.begin(), hashes.end());
          uint32_t matched = cache->match(hashes);
          auto a = cache->acquire(std::span(hashes).first(matched),
                                  static_cast<uint32_t>(hashes.size()) - matched);
          if (!a.ok()) continue;
          size_t commit_to = matched + rng() % (hashes.size() - matched + 1);
          for (size_t i = matched; i < commit_to; ++i) {
            (void)cache->commit(a->fresh[i - matched], hashes[i],
                                tandem::kv::chain_parent(hashes, i));
          }
          std::vector<uint32_t> all = a->cached;
          all.insert(all.end(), a->fresh.begin(), a->fresh.end());
          held.push_back(all);
        } else if (!held.empty()) {
          size_t pick = rng() % held.size();
          cache->release(held[pick]);
          held.erase(held.begin() + static_cast<long>(pick));
        }
      }
      if (rng() % 60 == 0) {  // the instance restarts: a new process, an empty cache
        cache = std::make_unique<tandem::kv::PrefixCache>(24, 16);
        held.clear();
        ++incarnation;
        sequence = 0;
        snapshot_due = true;
        ++restarts;
      }
      // The source's flush: a snapshot when due, else its events (removed, then stored).
      if (snapshot_due) {
        snapshot_due = false;
        send({incarnation, ++sequence, true, false, cache->snapshot()});
      } else if (cache->has_events()) {
        auto ev = cache->drain_events();
        tandem::kv::CacheEvents removed, stored;
        removed.removed = std::move(ev.removed);
        stored.stored = std::move(ev.stored);
        stored.stored_parents = std::move(ev.stored_parents);
        if (!removed.removed.empty()) send({incarnation, ++sequence, false, false, removed});
        if (!stored.stored.empty()) send({incarnation, ++sequence, false, false, stored});
      }
      // A keepalive (never lost here: the check below needs one) names the last frame.
      apply_frame(core, d0, seq, {incarnation, sequence, false, true, {}});
      now += 100ms;
      if (!seq.synced()) {
        if (seq.resync_due(now)) {
          seq.resync_sent(now);
          snapshot_due = true;  // KvResync reached the source
        }
        continue;
      }
      // Confirmed in sync: the index holds exactly what the cache can match.
      ++checked;
      CHECK(core.index_blocks_count(d0) == cache->blocks_cached_count());
      for (const auto& h : universe) {
        if (core.holds(d0, h) != cache->holds(h)) {
          FAIL_CHECK("index and cache differ on a block, round " << round);
          break;
        }
      }
    }
    gaps += static_cast<uint32_t>(seq.gaps_count());
    core.check_invariants();
  }
  MESSAGE("checked " << checked << " synced rounds, " << gaps << " gaps, " << restarts
                     << " restarts");
  CHECK(checked > 2000);
  CHECK(gaps > 20);
  CHECK(restarts > 20);
}
