#include <doctest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "actors/decode/decode_scheduler.hpp"

using tandem::ErrorKind;
using tandem::decode::DecodeConfig;
using tandem::decode::DecodePlan;
using tandem::decode::DecodeRequest;
using tandem::decode::DecodeScheduler;
using tandem::decode::FinishReason;
using tandem::decode::KvSource;
using tandem::decode::SampledTokens;
using tandem::decode::SeqId;
using tandem::decode::SeqStage;
using tandem::decode::SeqUpdate;
using tandem::decode::TokenId;
using tandem::kv::BlockHash;
using tandem::kv::PrefixCache;

namespace {

constexpr uint32_t bt = 4;  // small blocks make boundaries frequent

std::vector<BlockHash> fake_hashes(const std::vector<TokenId>& tokens) {
  std::vector<BlockHash> out;
  uint64_t state = 1469598103934665603ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    state = (state ^ static_cast<uint32_t>(tokens[i])) * 1099511628211ull;
    if ((i + 1) % bt == 0) {
      BlockHash h;
      for (int b = 0; b < 8; ++b) h.bytes[b] = static_cast<uint8_t>(state >> (8 * b));
      out.push_back(h);
    }
  }
  return out;
}

DecodeRequest make_request(SeqId id, size_t prompt_tokens, uint32_t max_tokens,
                           KvSource source = KvSource::local, TokenId first = 1) {
  DecodeRequest r;
  r.id = id;
  for (size_t i = 0; i < prompt_tokens; ++i) r.prompt.push_back(first + static_cast<TokenId>(i));
  r.prefix_hashes = fake_hashes(r.prompt);
  r.max_tokens = max_tokens;
  r.eos_token = 0;
  r.stop_token_ids = {-1};
  r.source = source;
  return r;
}

DecodeConfig config() {
  DecodeConfig c;
  c.block_tokens = bt;
  c.waiting_max = 8;
  c.seqs_max = 4;
  c.step_tokens_max = 8;
  c.max_model_tokens = 32;
  return c;
}

// Runs the planned step, sampling `token` for every entry that samples.
std::vector<SeqUpdate> run(DecodeScheduler& s, const DecodePlan& plan, TokenId token = 7) {
  std::vector<SampledTokens> sampled;
  for (const auto& e : plan.entries) {
    if (e.sample) sampled.push_back(SampledTokens{e.seq, {token}});
  }
  auto updates = s.on_step_result(plan.step_id, sampled);
  s.check_invariants();
  return updates;
}

}  // namespace

TEST_CASE("config validation names the key") {
  CHECK(config().validate(8).ok());
  auto e = config().validate(7);  // 32 tokens / 4 = 8 blocks per sequence
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("decode.max_model_tokens") != std::string::npos);
  auto c = config();
  c.seqs_max = 0;
  CHECK(c.validate(8).error().message.find("decode.seqs_max") != std::string::npos);
}

TEST_CASE("local prefill, then one token per step until max_tokens") {
  PrefixCache cache(16, bt);
  DecodeScheduler s(config(), cache);
  REQUIRE(s.submit(make_request(1, 10, 3)).ok());
  CHECK(s.stage(1) == SeqStage::waiting);
  auto p1 = s.plan_step();
  REQUIRE(p1.entries.size() == 1);
  CHECK(p1.entries[0].tokens.size() == 8);  // step_tokens_max: chunked
  CHECK_FALSE(p1.entries[0].sample);
  CHECK(p1.entries[0].block_table.size() == 3);
  CHECK(run(s, p1).empty());
  CHECK(s.stage(1) == SeqStage::prefilling);
  auto p2 = s.plan_step();
  REQUIRE(p2.entries.size() == 1);
  CHECK(p2.entries[0].start_position == 8);
  CHECK(p2.entries[0].tokens.size() == 2);
  CHECK(p2.entries[0].sample);
  auto u2 = run(s, p2, 50);
  REQUIRE(u2.size() == 1);
  CHECK(u2[0].tokens == std::vector<TokenId>{50});
  CHECK(s.stage(1) == SeqStage::running);
  auto p3 = s.plan_step();
  REQUIRE(p3.entries.size() == 1);
  CHECK(p3.entries[0].start_position == 10);
  CHECK(p3.entries[0].tokens == std::vector<TokenId>{50});
  CHECK(p3.entries[0].draft_tokens_count == 0);
  CHECK(run(s, p3, 51)[0].tokens == std::vector<TokenId>{51});
  auto p4 = s.plan_step();
  CHECK(p4.entries[0].tokens == std::vector<TokenId>{51});
  CHECK(p4.entries[0].block_table.size() == 3);  // position 11 still in block 2
  auto u4 = run(s, p4, 52);
  REQUIRE(u4[0].finished.has_value());
  CHECK(*u4[0].finished == FinishReason::max_tokens);
  CHECK_FALSE(s.stage(1).has_value());
  CHECK(cache.blocks_used_count() == 0);
  CHECK(cache.blocks_cached_count() == 2);  // the prompt's two full blocks stay cached
}

TEST_CASE("a new block is allocated exactly when a block boundary is crossed") {
  PrefixCache cache(16, bt);
  DecodeScheduler s(config(), cache);
  REQUIRE(s.submit(make_request(1, 3, 20)).ok());
  run(s, s.plan_step());  // prefill 3 tokens (1 block), sample token 4 -> position 3
  std::vector<size_t> table_sizes;
  for (int i = 0; i < 6; ++i) {
    auto p = s.plan_step();
    REQUIRE(p.entries.size() == 1);
    uint32_t pos = p.entries[0].start_position;
    CHECK(p.entries[0].block_table.size() == pos / bt + 1);
    table_sizes.push_back(p.entries[0].block_table.size());
    run(s, p);
  }
  CHECK(table_sizes == std::vector<size_t>{1, 2, 2, 2, 2, 3});
}

TEST_CASE("finish on EOS, stop token and context length") {
  PrefixCache cache(16, bt);
  DecodeScheduler s(config(), cache);
  REQUIRE(s.submit(make_request(1, 4, 10)).ok());
  REQUIRE(s.submit(make_request(2, 4, 10, KvSource::local, 100)).ok());
  REQUIRE(s.submit(make_request(3, 30, 10, KvSource::local, 200)).ok());
  auto p = s.plan_step();
  std::vector<SampledTokens> sampled;
  for (const auto& e : p.entries) {
    if (e.sample) sampled.push_back({e.seq, {e.seq == 1 ? 0 : e.seq == 2 ? -1 : 5}});
  }
  auto updates = s.on_step_result(p.step_id, sampled);
  std::map<SeqId, FinishReason> reasons;
  for (const auto& u : updates) {
    if (u.finished) reasons[u.seq] = *u.finished;
  }
  CHECK(reasons[1] == FinishReason::eos);
  CHECK(reasons[2] == FinishReason::stop_token);
  // Seq 3 (30 tokens) needed more budget than the step had; finish it later.
  while (s.stage(3).has_value()) {
    for (const auto& u : run(s, s.plan_step(), 5)) {
      if (u.finished) reasons[u.seq] = *u.finished;
    }
  }
  CHECK(reasons[3] == FinishReason::context_length);
  CHECK(cache.blocks_used_count() == 0);
}

TEST_CASE("budgets: seqs_max and step_tokens_max are respected") {
  PrefixCache cache(64, bt);
  auto c = config();
  c.step_tokens_max = 6;
  DecodeScheduler s(c, cache);
  for (SeqId id = 1; id <= 6; ++id) {
    REQUIRE(s.submit(make_request(id, 2, 30, KvSource::local, 10 * static_cast<TokenId>(id))).ok());
  }
  for (int step = 0; step < 20; ++step) {
    auto p = s.plan_step();
    CHECK(p.tokens_count <= 6);
    CHECK(s.active_count() <= 4);
    if (!p.entries.empty()) run(s, p);
  }
  CHECK(s.active_count() == 4);
  CHECK(s.waiting_count() == 2);
}

TEST_CASE("pulled KV: pull orders, cached blocks skipped, first token from prefill") {
  PrefixCache cache(16, bt);
  DecodeScheduler s(config(), cache);
  REQUIRE(s.submit(make_request(1, 10, 5, KvSource::pull)).ok());
  auto p = s.plan_step();
  CHECK(p.entries.empty());
  CHECK(p.step_id == 0);
  REQUIRE(p.pulls.size() == 1);
  CHECK(p.pulls[0].block_table.size() == 3);
  CHECK(p.pulls[0].pull_block_indexes == std::vector<uint32_t>{0, 1, 2});
  CHECK(s.stage(1) == SeqStage::pulling);
  auto u = s.on_pull_done(1, true, 42);
  REQUIRE(u.ok());
  CHECK(u->tokens == std::vector<TokenId>{42});
  CHECK(s.stage(1) == SeqStage::running);
  auto d = s.plan_step();
  REQUIRE(d.entries.size() == 1);
  CHECK(d.entries[0].start_position == 10);
  CHECK(d.entries[0].tokens == std::vector<TokenId>{42});
  run(s, d);
  // A second request with the same prompt prefix: the two full blocks are local now.
  REQUIRE(s.submit(make_request(2, 9, 5, KvSource::pull)).ok());
  auto p2 = s.plan_step();
  REQUIRE(p2.pulls.size() == 1);
  CHECK(p2.pulls[0].pull_block_indexes == std::vector<uint32_t>{2});
  CHECK(s.on_pull_done(3, true, 1).error().kind == ErrorKind::not_found);
  s.check_invariants();
}

TEST_CASE("a failed pull falls back to local prefill of the uncached part") {
  PrefixCache cache(16, bt);
  DecodeScheduler s(config(), cache);
  REQUIRE(s.submit(make_request(1, 10, 5, KvSource::pull)).ok());
  (void)s.plan_step();
  auto u = s.on_pull_done(1, false, 0);
  REQUIRE(u.ok());
  CHECK(u->tokens.empty());
  CHECK(s.stage(1) == SeqStage::prefilling);
  CHECK(s.counters().pull_failures_count == 1);
  auto p = s.plan_step();
  REQUIRE(p.entries.size() == 1);
  CHECK(p.entries[0].start_position == 0);
  CHECK(p.entries[0].tokens.size() == 8);
  run(s, p);
  auto p2 = s.plan_step();
  CHECK(p2.entries[0].sample);
  CHECK(run(s, p2)[0].tokens.size() == 1);
  CHECK(s.stage(1) == SeqStage::running);
}

TEST_CASE("cancel frees blocks at every stage") {
  PrefixCache cache(16, bt);
  DecodeScheduler s(config(), cache);
  SUBCASE("waiting") {
    REQUIRE(s.submit(make_request(1, 10, 5)).ok());
    REQUIRE(s.cancel(1).ok());
  }
  SUBCASE("prefilling") {
    REQUIRE(s.submit(make_request(1, 10, 5)).ok());
    run(s, s.plan_step());
    REQUIRE(s.stage(1) == SeqStage::prefilling);
    REQUIRE(s.cancel(1).ok());
  }
  SUBCASE("running, with its step in flight") {
    REQUIRE(s.submit(make_request(1, 3, 5)).ok());
    run(s, s.plan_step());
    auto p = s.plan_step();
    REQUIRE(s.cancel(1).ok());
    CHECK(cache.blocks_used_count() == 0);
    CHECK(run(s, p).empty());
  }
  SUBCASE("pulling: blocks are kept until the pull ends") {
    REQUIRE(s.submit(make_request(1, 10, 5, KvSource::pull)).ok());
    (void)s.plan_step();
    REQUIRE(s.cancel(1).ok());
    CHECK(cache.blocks_used_count() == 3);  // the RMA may still be writing them
    auto u = s.on_pull_done(1, true, 9);
    REQUIRE(u.ok());
    CHECK(u->tokens.empty());
    CHECK(u->finished == FinishReason::cancelled);
  }
  CHECK(cache.blocks_used_count() == 0);
  CHECK_FALSE(s.stage(1).has_value());
  CHECK(s.cancel(1).error().kind == ErrorKind::not_found);
  s.check_invariants();
}

TEST_CASE("pool full: the newest sequence is preempted and recomputed later") {
  PrefixCache cache(8, bt);  // 8 blocks = one sequence at full context (32 tokens)
  DecodeScheduler s(config(), cache);
  REQUIRE(s.submit(make_request(1, 8, 20, KvSource::local, 100)).ok());  // oldest
  REQUIRE(s.submit(make_request(2, 8, 20, KvSource::local, 200)).ok());
  REQUIRE(s.submit(make_request(3, 8, 20, KvSource::local, 300)).ok());  // newest
  std::map<SeqId, std::vector<TokenId>> streamed;
  std::vector<SeqId> preempted;
  TokenId next = 1000;
  for (int step = 0; step < 200 && (s.stage(1) || s.stage(2) || s.stage(3)); ++step) {
    auto p = s.plan_step();
    preempted.insert(preempted.end(), p.preempted.begin(), p.preempted.end());
    if (p.entries.empty()) continue;
    for (const auto& u : run(s, p, next++)) {
      streamed[u.seq].insert(streamed[u.seq].end(), u.tokens.begin(), u.tokens.end());
    }
  }
  REQUIRE_FALSE(preempted.empty());
  CHECK(preempted.front() == 3);  // the newest goes first
  CHECK(s.counters().preemptions_count == preempted.size());
  for (SeqId id : {1, 2, 3}) {
    CHECK_FALSE(s.stage(id).has_value());
    CHECK(streamed[id].size() == 20);  // every token streamed once, none lost or repeated
  }
  CHECK(s.counters().prefill_tokens_count > 24);  // recompute happened
  CHECK(cache.blocks_used_count() == 0);
}

TEST_CASE("bad requests and malformed results are errors, not crashes") {
  PrefixCache cache(16, bt);
  DecodeScheduler s(config(), cache);
  CHECK(s.submit(make_request(1, 0, 5)).error().kind == ErrorKind::invalid);
  auto ctx = s.submit(make_request(2, 32, 5));
  REQUIRE_FALSE(ctx.ok());
  CHECK(ctx.error().message.find("no room in the context of 32") != std::string::npos);
  CHECK(s.submit(make_request(3, 4, 0)).error().message.find("max_tokens") != std::string::npos);
  auto wrong = make_request(4, 8, 5);
  wrong.prefix_hashes.pop_back();
  CHECK(s.submit(wrong).error().message.find("1 prefix hashes for 8 tokens") != std::string::npos);
  for (SeqId id = 10; id < 18; ++id) REQUIRE(s.submit(make_request(id, 2, 5)).ok());
  CHECK(s.submit(make_request(10, 2, 5)).error().kind == ErrorKind::invalid);
  CHECK(s.submit(make_request(30, 2, 5)).error().kind == ErrorKind::overloaded);
  auto p = s.plan_step();
  REQUIRE(p.entries.size() == 4);
  // Seq 10 gets nothing, seq 11 two tokens for one input, seq 12 an empty list.
  std::vector<SampledTokens> bad{{11, {5, 6}}, {12, {}}, {13, {5}}, {99, {5}}};
  auto updates = s.on_step_result(p.step_id, bad);
  std::map<SeqId, std::optional<FinishReason>> by;
  for (const auto& u : updates) by[u.seq] = u.finished;
  CHECK(by[10] == FinishReason::failed);
  CHECK(by[11] == FinishReason::failed);
  CHECK(by[12] == FinishReason::failed);
  CHECK_FALSE(by[13].has_value());
  CHECK(s.counters().bad_results_count == 3);
  s.check_invariants();
}

TEST_CASE("randomized: invariants after every operation, pool returns to baseline") {
  const uint32_t seed = 777;
  MESSAGE("seed " << seed);
  std::mt19937 rng(seed);
  PrefixCache cache(12, bt);
  auto c = config();
  c.seqs_max = 5;
  DecodeScheduler s(c, cache);
  std::set<SeqId> live, pulling;
  std::map<SeqId, uint32_t> streamed_count, max_tokens;
  SeqId next_id = 1;
  std::optional<DecodePlan> in_flight;
  for (int op = 0; op < 30000; ++op) {
    switch (rng() % 8) {
      case 0: {
        auto src = rng() % 2 ? KvSource::pull : KvSource::local;
        auto r = make_request(next_id, 1 + rng() % 14, 1 + rng() % 20, src,
                              100 * static_cast<TokenId>(rng() % 3));
        if (s.submit(r).ok()) {
          live.insert(next_id);
          max_tokens[next_id] = r.max_tokens;
        }
        ++next_id;
        break;
      }
      case 1:
      case 2:
      case 3:
        if (!in_flight) {
          auto p = s.plan_step();
          CHECK(p.tokens_count <= c.step_tokens_max);
          for (const auto& pull : p.pulls) pulling.insert(pull.seq);
          if (!p.entries.empty()) in_flight = std::move(p);
        } else {
          std::vector<SampledTokens> sampled;
          for (const auto& e : in_flight->entries) {
            TokenId t = rng() % 25 == 0 ? 0 : static_cast<TokenId>(1 + rng() % 1000);
            if (e.sample && rng() % 500 != 0) sampled.push_back({e.seq, {t}});
          }
          for (const auto& u : s.on_step_result(in_flight->step_id, sampled)) {
            streamed_count[u.seq] += static_cast<uint32_t>(u.tokens.size());
            CHECK(streamed_count[u.seq] <= max_tokens[u.seq]);
            if (u.finished) live.erase(u.seq);
          }
          in_flight.reset();
        }
        break;
      case 4:
      case 5:
        if (!pulling.empty()) {
          SeqId id = *std::next(pulling.begin(), static_cast<long>(rng() % pulling.size()));
          auto u = s.on_pull_done(id, rng() % 4 != 0, static_cast<TokenId>(1 + rng() % 9));
          REQUIRE(u.ok());
          pulling.erase(id);
          streamed_count[id] += static_cast<uint32_t>(u->tokens.size());
          if (u->finished) live.erase(id);
        }
        break;
      case 6:
        if (!live.empty() && rng() % 3 == 0) {
          SeqId id = *std::next(live.begin(), static_cast<long>(rng() % live.size()));
          REQUIRE(s.cancel(id).ok());
          if (!pulling.contains(id)) live.erase(id);
        }
        break;
      default:
        break;
    }
    s.check_invariants();
  }
  if (in_flight) (void)s.on_step_result(in_flight->step_id, {});
  for (SeqId id : pulling) (void)s.on_pull_done(id, false, 0);
  for (SeqId id : live) (void)s.cancel(id);
  s.check_invariants();
  CHECK(s.active_count() == 0);
  CHECK(s.waiting_count() == 0);
  CHECK(cache.blocks_used_count() == 0);
  CHECK(s.counters().preemptions_count > 0);
  CHECK(s.counters().pull_failures_count > 0);
  CHECK(s.counters().finished_count > 500);
}

// measure: the buffer-reusing plan_step(plan) / on_step_result(..., updates) overloads give
// exactly what the by-value ones give, over a random run with preemption, pulls (ok and
// failed), duplicate and missing results; a tight pool forces preemption.
TEST_CASE("reusing overloads match the by-value API step for step") {
  std::mt19937 rng(42);
  DecodeConfig c = config();
  PrefixCache cache_a(12, bt), cache_b(12, bt);
  DecodeScheduler a(c, cache_a), b(c, cache_b);
  DecodePlan plan_b;
  std::vector<SeqUpdate> updates_b;
  std::set<SeqId> pulling;
  SeqId next = 1;
  uint64_t preempted = 0;
  for (int step = 0; step < 400; ++step) {
    if (rng() % 3 == 0) {
      auto source = rng() % 2 ? KvSource::pull : KvSource::local;
      auto r = make_request(next, 1 + rng() % 14, 1 + rng() % 10, source,
                            static_cast<TokenId>(1 + rng() % 3));
      tandem::Status sa = a.submit(r), sb = b.submit(r);
      CHECK(sa.ok() == sb.ok());
      ++next;
    }
    if (!pulling.empty() && rng() % 2 == 0) {
      SeqId id = *pulling.begin();
      pulling.erase(pulling.begin());
      bool ok = rng() % 4 != 0;
      auto ua = a.on_pull_done(id, ok, 5), ub = b.on_pull_done(id, ok, 5);
      REQUIRE(ua.ok() == ub.ok());
      if (ua.ok()) CHECK(ua->tokens == ub->tokens);
    }
    DecodePlan plan_a = a.plan_step();
    b.plan_step(plan_b);
    REQUIRE(plan_a.step_id == plan_b.step_id);
    REQUIRE(plan_a.entries.size() == plan_b.entries.size());
    CHECK(plan_a.tokens_count == plan_b.tokens_count);
    CHECK(plan_a.preempted == plan_b.preempted);
    preempted += plan_a.preempted.size();
    REQUIRE(plan_a.pulls.size() == plan_b.pulls.size());
    for (size_t i = 0; i < plan_a.pulls.size(); ++i) {
      CHECK(plan_a.pulls[i].block_table == plan_b.pulls[i].block_table);
      pulling.insert(plan_a.pulls[i].seq);
    }
    for (size_t i = 0; i < plan_a.entries.size(); ++i) {
      const auto &ea = plan_a.entries[i], &eb = plan_b.entries[i];
      CHECK(ea.seq == eb.seq);
      CHECK(ea.block_table == eb.block_table);
      CHECK(ea.start_position == eb.start_position);
      CHECK(ea.tokens == eb.tokens);
      CHECK(ea.sample == eb.sample);
    }
    if (plan_a.entries.empty()) continue;
    std::vector<SampledTokens> sampled;
    for (const auto& e : plan_a.entries) {
      if (!e.sample || rng() % 20 == 0) continue;  // sometimes missing
      auto token = static_cast<TokenId>(1 + rng() % 50);
      sampled.push_back(SampledTokens{e.seq, {token}});
      if (rng() % 15 == 0) sampled.push_back(SampledTokens{e.seq, {token}});  // repeated
    }
    std::shuffle(sampled.begin(), sampled.end(), rng);
    auto updates_a = a.on_step_result(plan_a.step_id, sampled);
    b.on_step_result(plan_b.step_id, sampled, updates_b);
    REQUIRE(updates_a.size() == updates_b.size());
    for (size_t i = 0; i < updates_a.size(); ++i) {
      CHECK(updates_a[i].seq == updates_b[i].seq);
      CHECK(updates_a[i].tokens == updates_b[i].tokens);
      CHECK(updates_a[i].finished == updates_b[i].finished);
    }
    a.check_invariants();
    b.check_invariants();
  }
  CHECK(a.counters().bad_results_count == b.counters().bad_results_count);
  CHECK(a.counters().bad_results_count > 0);
  CHECK(a.counters().finished_count == b.counters().finished_count);
  CHECK(a.counters().finished_count > 20);
  CHECK(preempted > 0);
}
