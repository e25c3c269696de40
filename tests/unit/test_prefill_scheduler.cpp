#include <doctest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "actors/prefill/prefill_scheduler.hpp"

using namespace std::chrono_literals;
using tandem::ErrorKind;
using tandem::kv::BlockHash;
using tandem::kv::PrefixCache;
using tandem::prefill::Nanos;
using tandem::prefill::PrefillConfig;
using tandem::prefill::PrefillPlan;
using tandem::prefill::PrefillRequest;
using tandem::prefill::PrefillScheduler;
using tandem::prefill::PrefillStage;
using tandem::prefill::TokenId;

namespace {

// A stand-in for the chained block hash: block i's hash depends on every token before it.
std::vector<BlockHash> fake_hashes(const std::vector<TokenId>& tokens, uint32_t block_tokens) {
  std::vector<BlockHash> out;
  uint64_t state = 1469598103934665603ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    state = (state ^ static_cast<uint32_t>(tokens[i])) * 1099511628211ull;
    if ((i + 1) % block_tokens == 0) {
      BlockHash h;
      for (int b = 0; b < 8; ++b) h.bytes[b] = static_cast<uint8_t>(state >> (8 * b));
      out.push_back(h);
    }
  }
  return out;
}

PrefillRequest make_request(uint64_t id, std::vector<TokenId> tokens, uint32_t block_tokens = 16) {
  auto hashes = fake_hashes(tokens, block_tokens);
  return PrefillRequest{id, std::move(tokens), std::move(hashes)};
}

std::vector<TokenId> seq_tokens(size_t count, TokenId first) {
  std::vector<TokenId> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = first + static_cast<TokenId>(i);
  return out;
}

PrefillConfig small_config() {
  PrefillConfig c;
  c.block_tokens = 16;
  c.queue_max = 4;
  c.running_max = 2;
  c.held_max = 4;
  c.step_tokens_max = 32;
  c.hold_timeout_ms = 100ms;
  return c;
}

}  // namespace

TEST_CASE("config validation names the key") {
  auto c = small_config();
  CHECK(c.validate().ok());
  c.step_tokens_max = 0;
  REQUIRE_FALSE(c.validate().ok());
  CHECK(c.validate().error().message.find("prefill.step_tokens_max") != std::string::npos);
  c = small_config();
  c.held_max = 1;
  CHECK(c.validate().error().message.find("prefill.held_max") != std::string::npos);
  c = small_config();
  c.hold_timeout_ms = 0ms;
  CHECK(c.validate().error().kind == ErrorKind::invalid);
}

TEST_CASE("a long prompt is chunked across steps under the token budget, then held") {
  PrefixCache cache(16, 16);
  PrefillScheduler s(small_config(), cache);
  REQUIRE(s.submit(make_request(1, seq_tokens(100, 1))).ok());
  CHECK(s.stage(1) == PrefillStage::queued);
  std::vector<uint32_t> starts, sizes;
  std::vector<tandem::prefill::PrefillDone> done;
  for (int step = 0; step < 10 && done.empty(); ++step) {
    auto plan = s.plan_step();
    REQUIRE(plan.has_value());
    REQUIRE(plan->chunks.size() == 1);
    const auto& chunk = plan->chunks[0];
    CHECK(plan->tokens_count <= 32);
    CHECK(chunk.block_table.size() == 7);  // ceil(100 / 16)
    CHECK(chunk.tokens.front() == static_cast<TokenId>(1 + chunk.start_position));
    CHECK(chunk.last == (chunk.start_position + chunk.tokens.size() == 100));
    starts.push_back(chunk.start_position);
    sizes.push_back(static_cast<uint32_t>(chunk.tokens.size()));
    CHECK(s.stage(1) == PrefillStage::running);
    done = s.on_step_done(plan->step_id, Nanos(1000));
    s.check_invariants();
  }
  CHECK(starts == std::vector<uint32_t>{0, 32, 64, 96});
  CHECK(sizes == std::vector<uint32_t>{32, 32, 32, 4});
  REQUIRE(done.size() == 1);
  CHECK(done[0].request == 1);
  CHECK(done[0].prompt_tokens_count == 100);
  CHECK(done[0].cached_tokens_count == 0);
  CHECK(done[0].prefix_hashes.size() == 6);
  CHECK(done[0].hold_deadline == Nanos(1000) + 100ms);
  CHECK(s.stage(1) == PrefillStage::held);
  CHECK(cache.blocks_used_count() == 7);
  CHECK(cache.blocks_cached_count() == 6);  // full blocks committed; the partial one is not
  CHECK_FALSE(s.plan_step().has_value());
  REQUIRE(s.pull_done(1).ok());
  CHECK(cache.blocks_used_count() == 0);
  CHECK(s.pull_done(1).error().kind == ErrorKind::not_found);
  CHECK(s.counters().computed_tokens_count == 100);
  s.check_invariants();
}

TEST_CASE("several requests share a step; oldest first; running_max bounds admission") {
  PrefixCache cache(32, 16);
  auto c = small_config();
  c.step_tokens_max = 40;
  PrefillScheduler s(c, cache);
  REQUIRE(s.submit(make_request(1, seq_tokens(24, 100))).ok());
  REQUIRE(s.submit(make_request(2, seq_tokens(24, 200))).ok());
  REQUIRE(s.submit(make_request(3, seq_tokens(8, 300))).ok());
  auto p1 = s.plan_step();
  REQUIRE(p1.has_value());
  REQUIRE(p1->chunks.size() == 2);  // running_max 2: request 3 waits
  CHECK(p1->chunks[0].request == 1);
  CHECK(p1->chunks[0].tokens.size() == 24);
  CHECK(p1->chunks[1].request == 2);
  CHECK(p1->chunks[1].tokens.size() == 16);
  CHECK(p1->tokens_count == 40);
  CHECK(s.stage(3) == PrefillStage::queued);
  auto d1 = s.on_step_done(p1->step_id, Nanos(0));
  REQUIRE(d1.size() == 1);
  CHECK(d1[0].request == 1);
  auto p2 = s.plan_step();
  REQUIRE(p2.has_value());
  REQUIRE(p2->chunks.size() == 2);
  CHECK(p2->chunks[0].request == 2);
  CHECK(p2->chunks[0].start_position == 16);
  CHECK(p2->chunks[1].request == 3);
  auto d2 = s.on_step_done(p2->step_id, Nanos(0));
  CHECK(d2.size() == 2);
  s.check_invariants();
}

TEST_CASE("cached prefix blocks are reused and not computed") {
  PrefixCache cache(16, 16);
  PrefillScheduler s(small_config(), cache);
  auto shared = seq_tokens(48, 7);
  REQUIRE(s.submit(make_request(1, shared)).ok());
  for (int i = 0; i < 2; ++i) {  // 48 tokens at 32 per step
    auto p = s.plan_step();
    REQUIRE(p.has_value());
    (void)s.on_step_done(p->step_id, Nanos(0));
  }
  REQUIRE(s.pull_done(1).ok());
  auto longer = shared;
  for (TokenId t : seq_tokens(20, 900)) longer.push_back(t);
  REQUIRE(s.submit(make_request(2, longer)).ok());
  auto p = s.plan_step();
  REQUIRE(p.has_value());
  CHECK(p->chunks[0].start_position == 48);
  CHECK(p->chunks[0].tokens.size() == 20);
  auto done = s.on_step_done(p->step_id, Nanos(0));
  REQUIRE(done.size() == 1);
  CHECK(done[0].cached_tokens_count == 48);
  CHECK(cache.counters().hit_blocks_count == 3);
  // The query counters count the prompts' full blocks (3 + 4), not only the blocks offered
  // to acquire(): the tokens-weighted hit rate on /metrics is below 1 for uncached prompts.
  CHECK(cache.counters().query_blocks_count == 7);
  CHECK(cache.counters().query_tokens_count == 7 * 16);

  SUBCASE("a fully cached prompt recomputes only its last block") {
    REQUIRE(s.submit(make_request(3, shared)).ok());
    auto q = s.plan_step();
    REQUIRE(q.has_value());
    CHECK(q->chunks[0].start_position == 32);
    CHECK(q->chunks[0].tokens.size() == 16);
    CHECK(q->chunks[0].last);
    auto d = s.on_step_done(q->step_id, Nanos(0));
    REQUIRE(d.size() == 1);
    CHECK(d[0].cached_tokens_count == 32);
    CHECK(cache.counters().query_blocks_count == 10);  // all 3 asked, 2 reused
    CHECK(cache.counters().hit_blocks_count == 5);
    s.check_invariants();
  }
}

TEST_CASE("hold timeout frees blocks; pull_done after it is not_found") {
  PrefixCache cache(8, 16);
  PrefillScheduler s(small_config(), cache);
  REQUIRE(s.submit(make_request(1, seq_tokens(20, 1))).ok());
  auto p = s.plan_step();
  REQUIRE(p.has_value());
  auto done = s.on_step_done(p->step_id, Nanos(5'000'000));
  REQUIRE(done.size() == 1);
  CHECK(cache.blocks_used_count() == 2);
  CHECK(s.expire_holds(Nanos(5'000'000) + 100ms).empty());  // not yet: now == deadline
  CHECK(cache.blocks_used_count() == 2);
  auto expired = s.expire_holds(Nanos(5'000'001) + 100ms);
  CHECK(expired == std::vector<uint64_t>{1});
  CHECK(cache.blocks_used_count() == 0);
  CHECK_FALSE(s.stage(1).has_value());
  CHECK(s.pull_done(1).error().kind == ErrorKind::not_found);
  CHECK(s.counters().expired_count == 1);
  s.check_invariants();
}

TEST_CASE("cancel frees blocks at every stage") {
  PrefixCache cache(16, 16);
  PrefillScheduler s(small_config(), cache);
  SUBCASE("queued") {
    REQUIRE(s.submit(make_request(1, seq_tokens(40, 1))).ok());
    REQUIRE(s.cancel(1).ok());
    CHECK_FALSE(s.plan_step().has_value());
  }
  SUBCASE("running, between steps") {
    REQUIRE(s.submit(make_request(1, seq_tokens(80, 1))).ok());
    auto p = s.plan_step();
    REQUIRE(p.has_value());
    (void)s.on_step_done(p->step_id, Nanos(0));
    CHECK(cache.blocks_used_count() == 5);
    REQUIRE(s.cancel(1).ok());
  }
  SUBCASE("running, while its step is in flight") {
    REQUIRE(s.submit(make_request(1, seq_tokens(20, 1))).ok());
    auto p = s.plan_step();
    REQUIRE(p.has_value());
    REQUIRE(s.cancel(1).ok());
    CHECK(cache.blocks_used_count() == 0);
    CHECK(s.on_step_done(p->step_id, Nanos(0)).empty());
  }
  SUBCASE("held") {
    REQUIRE(s.submit(make_request(1, seq_tokens(20, 1))).ok());
    auto p = s.plan_step();
    REQUIRE(p.has_value());
    REQUIRE(s.on_step_done(p->step_id, Nanos(0)).size() == 1);
    REQUIRE(s.cancel(1).ok());
  }
  CHECK(cache.blocks_used_count() == 0);
  CHECK(s.cancel(1).error().kind == ErrorKind::not_found);
  CHECK(s.counters().cancelled_count == 1);
  s.check_invariants();
}

TEST_CASE("bad requests and a full queue are errors") {
  PrefixCache cache(4, 16);
  PrefillScheduler s(small_config(), cache);
  CHECK(s.submit(make_request(1, {})).error().kind == ErrorKind::invalid);
  auto wrong = make_request(2, seq_tokens(40, 1));
  wrong.prefix_hashes.pop_back();
  auto e = s.submit(wrong);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("1 prefix hashes for 40 tokens (2 full 16-token sub-blocks expected)") !=
        std::string::npos);
  auto huge = s.submit(make_request(3, seq_tokens(65, 1)));  // 5 blocks > pool of 4
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.error().message.find("needs 5 KV blocks, the pool has 4") != std::string::npos);
  for (uint64_t id = 10; id < 14; ++id) REQUIRE(s.submit(make_request(id, {1, 2})).ok());
  CHECK(s.submit(make_request(10, {1})).error().kind == ErrorKind::invalid);  // duplicate id
  auto full = s.submit(make_request(20, {1, 2}));
  REQUIRE_FALSE(full.ok());
  CHECK(full.error().kind == ErrorKind::overloaded);
}

TEST_CASE("admission is FIFO: a head that does not fit blocks those behind it") {
  PrefixCache cache(8, 16);
  PrefillScheduler s(small_config(), cache);
  REQUIRE(s.submit(make_request(1, seq_tokens(96, 1))).ok());  // 6 blocks
  for (int i = 0; i < 3; ++i) {
    auto p = s.plan_step();
    REQUIRE(p.has_value());
    (void)s.on_step_done(p->step_id, Nanos(0));
  }
  CHECK(s.stage(1) == PrefillStage::held);
  REQUIRE(s.submit(make_request(2, seq_tokens(64, 500))).ok());  // 4 blocks: does not fit
  REQUIRE(s.submit(make_request(3, seq_tokens(8, 900))).ok());   // 1 block: would fit
  CHECK_FALSE(s.plan_step().has_value());
  CHECK(s.stage(3) == PrefillStage::queued);
  REQUIRE(s.pull_done(1).ok());  // request 1's blocks become evictable
  auto p = s.plan_step();
  REQUIRE(p.has_value());
  CHECK(p->chunks[0].request == 2);
  CHECK(cache.counters().evictions_count == 2);
  s.check_invariants();
}

namespace {

// The device as the scheduler drives it: every block's content (the token at each slot),
// copies applied before the chunk, then the chunk's tokens written. Checks that every
// chunk's context (positions before it) holds the request's own tokens: no request ever
// computes on another's KV.
struct DeviceModel {
  std::map<tandem::kv::BlockIndex, std::vector<TokenId>> blocks;
  std::map<uint64_t, std::vector<TokenId>> prompts;  // by request id
  uint64_t copies = 0;
  void run(const PrefillPlan& plan, uint32_t block_tokens) {
    for (const auto& c : plan.chunks) {
      if (c.copy) {
        blocks[c.copy->dst] = blocks[c.copy->src];
        ++copies;
      }
      const auto& prompt = prompts.at(c.request);
      for (uint32_t pos = 0; pos < c.start_position; ++pos) {
        auto& b = blocks[c.block_table.at(pos / block_tokens)];
        b.resize(block_tokens, -1);
        REQUIRE(b[pos % block_tokens] == prompt[pos]);
      }
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        uint32_t pos = c.start_position + static_cast<uint32_t>(i);
        auto& b = blocks[c.block_table.at(pos / block_tokens)];
        b.resize(block_tokens, -1);
        b[pos % block_tokens] = c.tokens[i];
      }
    }
  }
};

}  // namespace

TEST_CASE("sub-blocks: the next turn reuses the last turn's partial block through a copy") {
  PrefixCache cache(16, 16, 4);
  PrefillScheduler s(small_config(), cache);
  DeviceModel device;
  auto run_all = [&] {
    std::vector<tandem::prefill::PrefillDone> done;
    while (auto plan = s.plan_step()) {
      device.run(*plan, 16);
      for (auto& d : s.on_step_done(plan->step_id, Nanos(0))) done.push_back(std::move(d));
    }
    return done;
  };
  auto turn1 = seq_tokens(24, 100);  // a block and 2 sub-blocks
  device.prompts[1] = turn1;
  REQUIRE(s.submit(make_request(1, turn1, 4)).ok());
  auto done1 = run_all();
  REQUIRE(done1.size() == 1);
  CHECK(done1[0].cached_tokens_count == 0);
  REQUIRE(s.pull_done(1).ok());
  auto turn2 = turn1;
  for (TokenId t : seq_tokens(16, 900)) turn2.push_back(t);
  device.prompts[2] = turn2;
  REQUIRE(s.submit(make_request(2, turn2, 4)).ok());
  auto plan = s.plan_step();
  REQUIRE(plan);
  REQUIRE(plan->chunks.size() == 1);
  const auto& chunk = plan->chunks[0];
  CHECK(chunk.start_position == 24);  // 6 sub-blocks reused, the copy brings 2 of them
  REQUIRE(chunk.copy.has_value());
  CHECK(chunk.copy->src == done1[0].block_table[1]);
  CHECK(chunk.copy->dst == chunk.block_table[1]);
  CHECK(cache.ref_count(chunk.copy->src) == 1);  // held for the copy
  s.check_invariants();
  device.run(*plan, 16);
  auto done2 = s.on_step_done(plan->step_id, Nanos(0));  // 16 tokens: one step
  s.check_invariants();
  REQUIRE(done2.size() == 1);
  CHECK(done2[0].cached_tokens_count == 24);
  CHECK(cache.counters().merged_count == 1);  // the old partial block was taken over
  CHECK_FALSE(cache.is_cached(done1[0].block_table[1]));
  REQUIRE(s.pull_done(2).ok());
  // The same prompt again: everything is cached, the last sub-block is recomputed.
  device.prompts[3] = turn2;
  REQUIRE(s.submit(make_request(3, turn2, 4)).ok());
  auto again = s.plan_step();
  REQUIRE(again);
  CHECK(again->chunks[0].start_position == 36);
  CHECK(again->chunks[0].copy.has_value());  // block 2 is the prompt's last, partial
  // Cancelled while the copy runs: the source's reference goes with it.
  REQUIRE(s.cancel(3).ok());
  s.check_invariants();
  (void)s.on_step_done(again->step_id, Nanos(0));
  CHECK(cache.blocks_used_count() == 0);
}

TEST_CASE("sub-blocks: tier 2 is offered the trailing partial block, and asked for it") {
  PrefixCache cache(16, 16, 4);
  PrefillScheduler s(small_config(), cache);
  DeviceModel device;
  auto turn1 = seq_tokens(24, 100);  // a block and 2 sub-blocks
  device.prompts[1] = turn1;
  REQUIRE(s.submit(make_request(1, turn1, 4)).ok());
  std::vector<tandem::prefill::PrefillDone> done;
  while (auto plan = s.plan_step()) {
    device.run(*plan, 16);
    for (auto& d : s.on_step_done(plan->step_id, Nanos(0))) done.push_back(std::move(d));
  }
  REQUIRE(done.size() == 1);
  const auto& q = done[0].prefix_hashes;
  REQUIRE(q.size() == 6);
  // Offered: block 0 under its block hash, block 1 under its second sub-block's prefix hash.
  auto offered = tandem::prefill::tier2_offer_hashes(done[0], 4);
  REQUIRE(offered.size() == 2);
  CHECK(offered[0] == q[3]);
  CHECK(offered[1] == q[5]);
  CHECK(tandem::prefill::block_hashes(done[0], 4).size() == 1);
  CHECK(tandem::prefill::tier2_offer_hashes(done[0], 1).size() == 2);  // k = 1: 6 blocks, 2 held
  // A partial of 2 sub-blocks is offered when 2 pay (tier2_partial_gain_min), not when 3 do.
  CHECK(tandem::prefill::tier2_offer_hashes(done[0], 4, 2).size() == 2);
  CHECK(tandem::prefill::tier2_offer_hashes(done[0], 4, 3) == std::vector<BlockHash>{q[3]});
  auto whole_only = done[0];
  whole_only.prefix_hashes.resize(4);  // a prompt ending on a block boundary: no partial
  CHECK(tandem::prefill::tier2_offer_hashes(whole_only, 4).size() == 1);

  // What another instance lacks of the next turn (28 tokens: 7 sub-blocks).
  auto turn2 = turn1;
  for (TokenId t : seq_tokens(4, 900)) turn2.push_back(t);
  auto q2 = make_request(2, turn2, 4).prefix_hashes;
  REQUIRE(q2.size() == 7);
  auto lack = tandem::prefill::tier2_lack(q2, 4, 0);
  CHECK(lack.first == 0);
  CHECK(lack.held == 0);
  CHECK(lack.whole == 1);
  CHECK(lack.trailing);
  CHECK(lack.positions() == 2);
  auto ask = tandem::prefill::tier2_ask(q2, 4, lack, 2);
  CHECK(ask.block_hashes == std::vector<BlockHash>{q2[3]});
  CHECK(ask.sub_hashes.size() == 7);
  CHECK(tandem::prefill::tier2_ask(q2, 4, lack, 1).sub_hashes.size() == 4);
  CHECK(tandem::prefill::tier2_ask(q2, 1, tandem::prefill::tier2_lack(q2, 1, 0), 3)
            .sub_hashes.empty());
  // [kv_offload] partial_blocks = false: the whole block only, no prefix hashes.
  auto whole_lack = tandem::prefill::tier2_lack(q2, 4, 0, false);
  CHECK_FALSE(whole_lack.trailing);
  CHECK(whole_lack.positions() == 1);
  auto whole_ask = tandem::prefill::tier2_ask(q2, 4, whole_lack, 1);
  CHECK(whole_ask.block_hashes == std::vector<BlockHash>{q2[3]});
  CHECK(whole_ask.sub_hashes.empty());
  CHECK(ask.held == 0);
  // The pool holds 2 sub-blocks of block 0: asked from block 0, a partial there must be longer.
  auto head = tandem::prefill::tier2_lack(q2, 4, 2);
  CHECK(head.first == 0);
  CHECK(head.held == 2);
  CHECK(head.positions() == 2);
  CHECK(tandem::prefill::tier2_ask(q2, 4, head, 2).held == 2);
  CHECK(tandem::prefill::tier2_ask(q2, 1, tandem::prefill::tier2_lack(q2, 1, 2), 1).held == 0);
  // The pool holds block 0 and one sub-block of block 1: only the trailing partial block is
  // lacked, and that is not asked for (a warm turn's new tokens: no round trip for them).
  for (uint32_t matched : {4u, 5u, 6u, 7u}) {
    auto partly = tandem::prefill::tier2_lack(q2, 4, matched);
    CHECK(partly.first == 1);
    CHECK(partly.whole == 0);
    CHECK_FALSE(partly.trailing);
    CHECK(partly.positions() == 0);
  }
  // The staged partial (turn 1's block 1) is recognized as 2 sub-blocks of position 1.
  tandem::kv::PrefixHashes p2{q2, 4};
  CHECK(p2.partial_of(1, offered[1]) == 2);
  CHECK(p2.partial_of(1, offered[0]) == 0);
  CHECK(p2.partial_of(0, q2[3]) == 0);  // a whole block is not a partial
  CHECK(p2.sub_blocks(1) == 3);
  CHECK(p2.sub_blocks(2) == 0);

  // Read into another instance's pool: committed as a partial block, its next prompt copies
  // it and computes from sub-block 6.
  PrefixCache other(16, 16, 4);
  PrefillScheduler s2(small_config(), other);
  auto alloc = other.acquire({}, 2, 0, PrefixCache::Query::internal);
  REQUIRE(alloc.ok());
  tandem::kv::PrefixHashes pq{q2, 4};
  CHECK(other.commit(alloc->fresh[0], pq.slots(0, 4), pq.parent(0)) == tandem::kv::CommitOutcome::stored);
  CHECK(other.commit(alloc->fresh[1], pq.slots(1, 2), pq.parent(1)) == tandem::kv::CommitOutcome::stored);
  other.release(alloc->fresh);
  CHECK(other.match(q2) == 6);
  REQUIRE(s2.submit(make_request(2, turn2, 4)).ok());
  auto plan = s2.plan_step();
  REQUIRE(plan);
  CHECK(plan->chunks[0].start_position == 24);
  REQUIRE(plan->chunks[0].copy.has_value());
  CHECK(plan->chunks[0].copy->src == alloc->fresh[1]);
  s2.check_invariants();
}

TEST_CASE("randomized: invariants after every operation, pool returns to baseline, and every "
          "chunk computes on its own prompt's KV") {
  for (uint32_t sub_tokens : {16u, 4u}) {
  CAPTURE(sub_tokens);
  const uint32_t seed = 4242;
  MESSAGE("seed " << seed);
  std::mt19937 rng(seed);
  PrefixCache cache(24, 16, sub_tokens);
  auto c = small_config();
  c.queue_max = 8;
  c.running_max = 3;
  c.held_max = 5;
  c.step_tokens_max = 48;
  PrefillScheduler s(c, cache);
  DeviceModel device;
  std::set<uint64_t> live;
  uint64_t next_id = 1;
  int64_t now_ms = 0;
  std::optional<PrefillPlan> in_flight;
  for (int op = 0; op < 20000; ++op) {
    now_ms += rng() % 7;
    Nanos now = std::chrono::milliseconds(now_ms);
    switch (rng() % 6) {
      case 0: {  // prompts from 4 shared documents plus a private tail
        auto tokens = seq_tokens(16 * (rng() % 5) + 4 * (rng() % 4),
                                 1000 * static_cast<TokenId>(rng() % 4));
        for (TokenId t : seq_tokens(1 + rng() % 40, static_cast<TokenId>(next_id) * 100000)) {
          tokens.push_back(t);
        }
        device.prompts[next_id] = tokens;
        if (s.submit(make_request(next_id, tokens, sub_tokens)).ok()) live.insert(next_id);
        ++next_id;
        break;
      }
      case 1:
      case 2:
        if (!in_flight) {
          in_flight = s.plan_step();
          if (in_flight) {
            CHECK(in_flight->tokens_count <= c.step_tokens_max);
            device.run(*in_flight, 16);
          }
        } else {
          (void)s.on_step_done(in_flight->step_id, now);
          in_flight.reset();
        }
        break;
      case 3:
        if (!live.empty()) {
          auto id = *std::next(live.begin(), static_cast<long>(rng() % live.size()));
          if (s.pull_done(id).ok()) live.erase(id);
        }
        break;
      case 4:
        for (auto id : s.expire_holds(now)) live.erase(id);
        break;
      case 5:
        if (!live.empty() && rng() % 4 == 0) {
          auto id = *std::next(live.begin(), static_cast<long>(rng() % live.size()));
          REQUIRE(s.cancel(id).ok());
          live.erase(id);
        }
        break;
    }
    s.check_invariants();
  }
  if (in_flight) (void)s.on_step_done(in_flight->step_id, Nanos(0));
  for (auto id : live) REQUIRE(s.cancel(id).ok());
  s.check_invariants();
  CHECK(cache.blocks_used_count() == 0);
  CHECK(s.counters().completed_count > 100);
  CHECK(s.counters().cached_tokens_count > 0);
  CHECK(s.counters().expired_count > 0);
  if (sub_tokens < 16) {
    CHECK(device.copies > 20);
    CHECK(cache.counters().partial_hits_count > 20);
  }
  }
}
