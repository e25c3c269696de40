// The decode scheduler speculating (issue 14): drafts planned within the budget and the
// blocks, verified results streamed and cut at EOS / stop / max_tokens, rejected positions'
// blocks released, cancel and preemption mid-draft freeing exactly what was held.
#include <doctest.h>

#include <vector>

#include "actors/decode/decode_scheduler.hpp"
#include "actors/decode/drafter.hpp"

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
using tandem::decode::SpecMethod;
using tandem::decode::TokenId;
using tandem::kv::BlockHash;
using tandem::kv::PrefixCache;

namespace {

constexpr uint32_t bt = 4;

std::vector<BlockHash> hashes_of(const std::vector<TokenId>& tokens) {
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

// A prompt that repeats "10 11 12 13 14 15": an n-gram match proposes what followed.
DecodeRequest repetitive(SeqId id, uint32_t max_tokens, uint32_t repeats = 2) {
  DecodeRequest r;
  r.id = id;
  for (uint32_t k = 0; k < repeats; ++k) {
    for (TokenId t = 10; t < 16; ++t) r.prompt.push_back(t);
  }
  r.prompt.push_back(10);
  r.prompt.push_back(11);
  r.prefix_hashes = hashes_of(r.prompt);
  r.max_tokens = max_tokens;
  r.eos_token = 0;
  r.source = KvSource::local;
  return r;
}

DecodeConfig spec_config(SpecMethod method = SpecMethod::ngram, uint32_t k = 4) {
  DecodeConfig c;
  c.block_tokens = bt;
  c.waiting_max = 8;
  c.seqs_max = 4;
  c.step_tokens_max = 32;
  c.max_model_tokens = 64;
  c.spec.method = method;
  c.spec.draft_tokens_max = k;
  c.spec.row_cost = 0.01;  // extra rows nearly free: every proposal is sent whole
  c.spec.ngram = {2, 4, 4};
  return c;
}

// Prefills (one step) and takes the first sampled token: 12, continuing the pattern.
void prefill(DecodeScheduler& s, TokenId first = 12) {
  auto p = s.plan_step();
  std::vector<SampledTokens> sampled;
  for (const auto& e : p.entries) {
    if (e.sample) sampled.push_back({e.seq, {first}});
  }
  s.on_step_result(p.step_id, sampled);
  s.check_invariants();
}

std::vector<TokenId> drafts_of(const tandem::decode::DecodeEntry& e) {
  return {e.tokens.end() - e.draft_tokens_count, e.tokens.end()};
}

}  // namespace

TEST_CASE("a running sequence carries drafts; accepted ones and the next token stream") {
  PrefixCache cache(32, bt);
  DecodeScheduler s(spec_config(), cache);
  REQUIRE(s.submit(repetitive(1, 20)).ok());
  prefill(s);  // context ... 10 11 12
  auto p = s.plan_step();
  REQUIRE(p.entries.size() == 1);
  const auto& e = p.entries[0];
  CHECK(e.draft_tokens_count == 4);
  CHECK(e.tokens == std::vector<TokenId>{12, 13, 14, 15, 10});
  CHECK(p.tokens_count == 5);
  CHECK(e.block_table.size() * bt >= e.start_position + e.tokens.size());
  s.check_invariants();
  // Accept all four and add the bonus token.
  auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13, 14, 15, 10, 11}}});
  s.check_invariants();
  REQUIRE(u.size() == 1);
  CHECK(u[0].tokens == std::vector<TokenId>{13, 14, 15, 10, 11});
  CHECK_FALSE(u[0].finished);
  CHECK(s.counters().spec_drafts_count == 1);
  CHECK(s.counters().spec_draft_tokens_count == 4);
  CHECK(s.counters().spec_accepted_tokens_count == 4);
  CHECK(s.counters().spec_accepted_at[3] == 1);
  // The next step starts after the five new tokens.
  auto p2 = s.plan_step();
  CHECK(p2.entries[0].start_position == e.start_position + 5);
  CHECK(p2.entries[0].tokens[0] == 11);
}

TEST_CASE("rejected drafts: one token streams, the drafts' blocks go back, k shrinks") {
  PrefixCache cache(32, bt);
  DecodeScheduler s(spec_config(), cache);
  REQUIRE(s.submit(repetitive(1, 20)).ok());
  prefill(s);
  uint32_t used_before = cache.blocks_used_count();
  auto p = s.plan_step();
  REQUIRE(p.entries[0].draft_tokens_count == 4);
  CHECK(cache.blocks_used_count() > used_before);  // grown for the drafts
  // None accepted: the target's own token.
  auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {40}}});
  s.check_invariants();  // holds: no block beyond the next token's
  CHECK(u[0].tokens == std::vector<TokenId>{40});
  CHECK(cache.blocks_used_count() == used_before);
  CHECK(s.counters().spec_accepted_tokens_count == 0);
  CHECK(s.counters().spec_accepted_at[0] == 0);
  // 40 never occurred: nothing to propose, a one-token step.
  auto p2 = s.plan_step();
  CHECK(p2.entries[0].draft_tokens_count == 0);
  s.on_step_result(p2.step_id, std::vector<SampledTokens>{{1, {10}}});
  s.check_invariants();
}

namespace {

// n-gram drafts of at most 4 tokens at row cost 0.35 (match 2..4, 4 candidates).
tandem::decode::SpecConfig ngram_config() {
  tandem::decode::SpecConfig c;
  c.method = SpecMethod::ngram;
  c.draft_tokens_max = 4;
  c.row_cost = 0.35;
  c.ngram = {2, 4, 4};
  return c;
}

}  // namespace

TEST_CASE("drafter: k is what pays at the sequence's acceptance rate; it stops drafting when "
          "drafts miss and resumes when its proposals would have been right") {
  using tandem::decode::Drafter;
  using tandem::decode::SpecConfig;
  using tandem::decode::SpecShared;
  CHECK(Drafter::best_k(0.5, 0.35, 4) == 1);   // 1.5 / 1.35 beats 1.75 / 1.70
  CHECK(Drafter::best_k(0.95, 0.35, 4) == 4);
  CHECK(Drafter::best_k(0.9, 0.35, 2) == 2);   // never beyond the proposal
  CHECK(Drafter::best_k(0.2, 0.35, 4) == 0);   // 1.2 / 1.35 < 1: no draft pays
  CHECK(Drafter::best_k(0.5, 0.01, 4) == 4);   // rows almost free: draft all
  CHECK(Drafter::best_k(0.99, 0.35, 0) == 0);

  SpecConfig c = ngram_config();
  SpecShared shared(c);
  Drafter d(c, shared);
  std::vector<TokenId> context{1, 2, 3, 4, 5, 1, 2};
  d.append(context);  // "1 2" occurred: proposes 3 4 5 1
  CHECK(d.propose(8) == std::vector<TokenId>{3});  // alpha 0.5: one token pays
  d.on_verified(1, 1);
  d.on_verified(2, 2);
  d.on_verified(3, 3);
  CHECK(d.alpha() > 0.7);
  CHECK(d.propose(8).size() >= 3);
  CHECK(d.propose(2).size() <= 2);  // the step's limit
  for (int i = 0; i < 8; ++i) d.on_verified(1, 0);
  CHECK(d.alpha() < 0.2);
  CHECK(d.propose(8).empty());  // drafting stopped...
  // ... but each step checks the proposal's first token against what the step produced.
  for (int i = 0; i < 8; ++i) {
    CHECK(d.propose(8).empty() == (Drafter::best_k(d.alpha(), 0.35, 4) == 0));
    d.observe(3);  // it would have been right
  }
  CHECK(d.alpha() > 0.35);  // where one draft token starts to pay at row_cost 0.35
  CHECK_FALSE(d.propose(8).empty());
  // A wrong token observed after an unsent proposal lowers alpha; one with no proposal
  // pending changes nothing.
  for (int i = 0; i < 20; ++i) d.on_verified(1, 0);
  double low = d.alpha();
  CHECK(d.propose(8).empty());
  d.observe(99);
  CHECK(d.alpha() < low);
  double lower = d.alpha();
  d.observe(3);  // no proposal pending since the last observe
  CHECK(d.alpha() == lower);
}

TEST_CASE("a result that does not extend the drafts fails the sequence") {
  PrefixCache cache(32, bt);
  DecodeScheduler s(spec_config(), cache);
  REQUIRE(s.submit(repetitive(1, 20)).ok());
  prefill(s);
  auto p = s.plan_step();
  REQUIRE(p.entries[0].draft_tokens_count == 4);
  // Claims two accepted drafts that were not the planned ones.
  auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13, 99, 5}}});
  REQUIRE(u[0].finished);
  CHECK(*u[0].finished == FinishReason::failed);
  CHECK(u[0].tokens.empty());
  CHECK(s.counters().bad_results_count == 1);
  CHECK(cache.blocks_used_count() == 0);
  // More tokens than drafts + 1 fails too.
  REQUIRE(s.submit(repetitive(2, 20)).ok());
  prefill(s);
  auto p2 = s.plan_step();
  auto u2 = s.on_step_result(p2.step_id, std::vector<SampledTokens>{{2, {13, 14, 15, 10, 11, 12}}});
  CHECK(*u2[0].finished == FinishReason::failed);
  s.check_invariants();
}

TEST_CASE("EOS, a stop token and max_tokens inside an accepted run cut it there") {
  SUBCASE("eos") {
    PrefixCache cache(32, bt);
    DecodeScheduler s(spec_config(), cache);
    REQUIRE(s.submit(repetitive(1, 20)).ok());
    prefill(s);
    auto p = s.plan_step();
    REQUIRE(p.entries[0].draft_tokens_count == 4);
    // Pretend drafts 13, 14 were accepted and the target then chose EOS (0).
    auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13, 14, 0}}});
    CHECK(u[0].tokens == std::vector<TokenId>{13, 14, 0});
    REQUIRE(u[0].finished);
    CHECK(*u[0].finished == FinishReason::eos);
    CHECK(cache.blocks_used_count() == 0);
    s.check_invariants();
  }
  SUBCASE("stop token accepted as a draft") {
    PrefixCache cache(32, bt);
    DecodeScheduler s(spec_config(), cache);
    auto r = repetitive(1, 20);
    r.stop_token_ids = {14};
    REQUIRE(s.submit(std::move(r)).ok());
    prefill(s);
    auto p = s.plan_step();
    auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13, 14, 15, 10, 11}}});
    CHECK(u[0].tokens == std::vector<TokenId>{13, 14});  // nothing after the stop token
    CHECK(*u[0].finished == FinishReason::stop_token);
    s.check_invariants();
  }
  SUBCASE("max_tokens: drafts never reach past it") {
    PrefixCache cache(32, bt);
    DecodeScheduler s(spec_config(), cache);
    REQUIRE(s.submit(repetitive(1, 3)).ok());
    prefill(s);  // 1 of 3 generated
    auto p = s.plan_step();
    CHECK(p.entries[0].draft_tokens_count == 1);  // 2 left: one draft + the next token
    auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13, 14}}});
    CHECK(u[0].tokens == std::vector<TokenId>{13, 14});
    CHECK(*u[0].finished == FinishReason::max_tokens);
    CHECK(cache.blocks_used_count() == 0);
  }
  SUBCASE("the context length bounds drafts") {
    auto c = spec_config();
    c.max_model_tokens = 17;  // the prompt is 14: tokens 14, 15, 16 left
    PrefixCache cache(32, bt);
    DecodeScheduler s(c, cache);
    REQUIRE(s.submit(repetitive(1, 20)).ok());
    prefill(s);  // 15 tokens
    auto p = s.plan_step();
    CHECK(p.entries[0].draft_tokens_count == 1);
    auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13, 14}}});
    CHECK(*u[0].finished == FinishReason::context_length);
  }
}

TEST_CASE("cancel mid-draft frees every block, the drafts' too") {
  PrefixCache cache(32, bt);
  DecodeScheduler s(spec_config(), cache);
  REQUIRE(s.submit(repetitive(1, 20)).ok());
  prefill(s);
  auto p = s.plan_step();
  REQUIRE(p.entries[0].draft_tokens_count == 4);
  REQUIRE(s.cancel(1).ok());
  CHECK(cache.blocks_used_count() == 0);
  auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13, 14}}});
  CHECK(u.empty());
  s.check_invariants();
  CHECK(cache.blocks_used_count() == 0);
}

TEST_CASE("drafts never preempt: they are cut to the blocks the pool has") {
  // 5 blocks: the prompt (14 tokens, 4 blocks) and its next token fill 4; one free block.
  auto c = spec_config(SpecMethod::ngram, 8);
  c.max_model_tokens = 20;
  PrefixCache cache(5, bt);
  DecodeScheduler s(c, cache);
  REQUIRE(s.submit(repetitive(1, 20)).ok());
  prefill(s);  // 15 tokens: positions 0..14 need 4 blocks
  REQUIRE(s.submit(repetitive(2, 20, 1)).ok());  // waits: 8 tokens need 2 blocks, 1 is free
  auto p = s.plan_step();
  // Sequence 1: position 14 is the last slot of block 3, so drafts need block 4: 4 positions,
  // but the context leaves 20 - 15 - 1 = 4 drafts, so it takes the last free block.
  REQUIRE(p.entries.size() == 1);
  CHECK(p.entries[0].draft_tokens_count == 4);
  CHECK(p.preempted.empty());
  CHECK(s.stage(2) == SeqStage::waiting);
  s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {5}}});
  s.check_invariants();
  CHECK(cache.blocks_used_count() == 4);  // the draft block went back
}

TEST_CASE("speculation is off above batch_max running, and for a request that asks") {
  auto c = spec_config();
  c.spec.batch_max = 1;
  PrefixCache cache(64, bt);
  DecodeScheduler s(c, cache);
  REQUIRE(s.submit(repetitive(1, 20)).ok());
  REQUIRE(s.submit(repetitive(2, 20)).ok());
  prefill(s);
  auto p = s.plan_step();
  REQUIRE(p.entries.size() == 2);
  CHECK(p.entries[0].draft_tokens_count == 0);
  CHECK(p.entries[1].draft_tokens_count == 0);
  CHECK(s.counters().spec_batch_off_steps == 1);
  s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {13}}, {2, {13}}});
  REQUIRE(s.cancel(2).ok());
  auto p2 = s.plan_step();  // one running: drafts again
  CHECK(p2.entries[0].draft_tokens_count > 0);
  s.on_step_result(p2.step_id, std::vector<SampledTokens>{{1, {5}}});

  auto r = repetitive(3, 20);
  r.speculate = false;
  REQUIRE(s.cancel(1).ok());
  REQUIRE(s.submit(std::move(r)).ok());
  prefill(s);
  auto p3 = s.plan_step();
  CHECK(p3.entries[0].draft_tokens_count == 0);
}

TEST_CASE("drafts use the budget left after every running sequence's token, before prefill "
          "chunks") {
  auto c = spec_config(SpecMethod::ngram, 4);
  c.step_tokens_max = 16;
  PrefixCache cache(64, bt);
  DecodeScheduler s(c, cache);
  for (SeqId id = 1; id <= 2; ++id) REQUIRE(s.submit(repetitive(id, 40, 1)).ok());
  DecodeRequest other = repetitive(3, 40, 1);
  for (TokenId& t : other.prompt) t += 40;  // nothing in common with the others' cache
  other.prefix_hashes = hashes_of(other.prompt);
  REQUIRE(s.submit(std::move(other)).ok());
  auto p1 = s.plan_step();  // two 8-token prompts fill the budget
  REQUIRE(p1.entries.size() == 2);
  s.on_step_result(p1.step_id, std::vector<SampledTokens>{{1, {12}}, {2, {12}}});
  auto p2 = s.plan_step();
  REQUIRE(p2.entries.size() == 3);
  CHECK(p2.entries[0].seq == 1);
  CHECK(p2.entries[0].draft_tokens_count == 4);
  CHECK(p2.entries[1].seq == 2);
  CHECK(p2.entries[1].draft_tokens_count == 4);
  CHECK(p2.entries[2].seq == 3);  // its prompt's first chunk: what the drafts left
  CHECK(p2.entries[2].tokens.size() == 16 - 2 * 5);
  CHECK(p2.tokens_count == 16);
  s.on_step_result(p2.step_id, std::vector<SampledTokens>{{1, {13, 14, 15, 10, 11}},
                                                          {2, {13, 40}}});
  s.check_invariants();
  c.step_tokens_max = 3;  // a budget smaller than the drafts: cut to it, oldest first
  PrefixCache small(64, bt);
  DecodeScheduler t(c, small);
  REQUIRE(t.submit(repetitive(1, 40, 1)).ok());
  for (int i = 0; i < 3; ++i) {  // 8 tokens in chunks of 3
    auto p = t.plan_step();
    std::vector<SampledTokens> sampled;
    if (p.entries[0].sample) sampled.push_back({1, {12}});
    t.on_step_result(p.step_id, sampled);
  }
  auto p3 = t.plan_step();
  CHECK(p3.entries[0].draft_tokens_count == 2);
  CHECK(p3.tokens_count == 3);
}

TEST_CASE("suffix: a finished output is proposed to the next request that repeats it") {
  PrefixCache cache(64, bt);
  auto c = spec_config(SpecMethod::suffix, 4);
  DecodeScheduler s(c, cache);
  DecodeRequest r;
  r.id = 1;
  r.prompt = {7, 8, 9};
  r.max_tokens = 6;
  r.eos_token = 0;
  REQUIRE(s.submit(r).ok());
  prefill(s, 30);
  // Generates 30 31 32 33 34 35 one token at a time (drafts rejected or absent).
  for (TokenId t = 31; t <= 35; ++t) {
    auto p = s.plan_step();
    REQUIRE(p.entries.size() == 1);
    s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {t}}});
    s.check_invariants();
  }
  REQUIRE_FALSE(s.stage(1));
  r.id = 2;
  REQUIRE(s.submit(r).ok());
  prefill(s, 30);
  auto p = s.plan_step();
  REQUIRE(p.entries.size() == 1);
  // The instance's cache holds "30 31 32 33 34 35": after 30 it proposes what followed, as
  // many tokens as matched (match_factor 1).
  CHECK(drafts_of(p.entries[0]) == std::vector<TokenId>{31});
  s.on_step_result(p.step_id, std::vector<SampledTokens>{{2, {31, 32}}});
  auto p2 = s.plan_step();  // "30 31 32" matched, and k grew to 2
  CHECK(drafts_of(p2.entries[0]) == std::vector<TokenId>{33, 34});
  s.check_invariants();
}

TEST_CASE("eagle3: the model's drafts, set after a step, ride the next one; stale ones never") {
  PrefixCache cache(64, bt);
  auto c = spec_config(SpecMethod::eagle3);
  c.spec.batch_max = 2;
  DecodeScheduler s(c, cache);
  REQUIRE(s.submit(repetitive(1, 10)).ok());
  std::vector<DecodeScheduler::DraftWant> wants;
  s.model_draft_wants(wants);
  CHECK(wants.empty());  // not running yet
  prefill(s);
  s.model_draft_wants(wants);
  REQUIRE(wants.size() == 1);
  CHECK(wants[0].seq == 1);
  CHECK(wants[0].tokens == 4);  // row_cost 0.01: the whole k pays
  // No drafts were set: a one-token step.
  auto p0 = s.plan_step();
  CHECK(p0.entries[0].draft_tokens_count == 0);
  s.on_step_result(p0.step_id, std::vector<SampledTokens>{{1, {13}}});
  // Set for the current context: the next step carries them.
  s.set_model_drafts(1, {14, 15, 70, 71});
  auto p = s.plan_step();
  REQUIRE(p.entries.size() == 1);
  CHECK(drafts_of(p.entries[0]) == std::vector<TokenId>{14, 15, 70, 71});
  auto u = s.on_step_result(p.step_id, std::vector<SampledTokens>{{1, {14, 15, 9}}});
  s.check_invariants();
  CHECK(u[0].tokens == std::vector<TokenId>{14, 15, 9});
  CHECK(s.counters().spec_accepted_tokens_count == 2);
  // Room: max_tokens 10, 5 generated -> at most 5 more tokens, so 4 drafts.
  s.model_draft_wants(wants);
  REQUIRE(wants.size() == 1);
  CHECK(wants[0].tokens == 4);
  // Drafts set, then a token arrives before they are used (here: a step without them is not
  // possible, so a stale set is simulated by setting for the old context and stepping twice).
  s.set_model_drafts(1, {1, 2, 3});
  auto p2 = s.plan_step();
  CHECK(drafts_of(p2.entries[0]) == std::vector<TokenId>{1, 2, 3});
  s.on_step_result(p2.step_id, std::vector<SampledTokens>{{1, {4}}});
  auto p3 = s.plan_step();  // nothing set since the last token: none
  CHECK(p3.entries[0].draft_tokens_count == 0);
  s.on_step_result(p3.step_id, std::vector<SampledTokens>{{1, {5}}});
  // Unknown or finished sequences are ignored.
  s.set_model_drafts(77, {1});
  s.check_invariants();

  SUBCASE("above batch_max, no wants") {
    REQUIRE(s.submit(repetitive(2, 10)).ok());
    REQUIRE(s.submit(repetitive(3, 10)).ok());
    prefill(s);
    s.model_draft_wants(wants);
    CHECK(wants.empty());
  }
  SUBCASE("a request that turned speculation off gets no wants") {
    auto r = repetitive(4, 10);
    r.speculate = false;
    REQUIRE(s.cancel(1).ok());
    REQUIRE(s.submit(std::move(r)).ok());
    prefill(s);
    s.model_draft_wants(wants);
    CHECK(wants.empty());
  }
}

TEST_CASE("eagle3 drafter: asks the model for the k that pays, and at least one") {
  using tandem::decode::Drafter;
  using tandem::decode::SpecShared;
  auto c = spec_config(SpecMethod::eagle3).spec;
  c.row_cost = 0.35;
  SpecShared shared(c);
  Drafter d(c, shared);
  CHECK(d.model_tokens_wanted(0, 1) == 0);
  uint32_t first = d.model_tokens_wanted(4, 1);
  CHECK(first >= 1);
  for (int i = 0; i < 30; ++i) d.on_verified(1, 0);  // every draft rejected
  // Drafts do not pay: the model is probed for one token (the shadow check's), at intervals
  // 1, 2, 4, ... steps, up to probe_interval_max.
  std::vector<uint32_t> asked;
  for (int step = 0; step < 200; ++step) {
    uint32_t n = d.model_tokens_wanted(4, 1);
    CHECK(n <= 1);
    if (n == 1) asked.push_back(uint32_t(step));
  }
  REQUIRE(asked.size() >= 8);
  CHECK(asked[0] == 0);
  CHECK(asked[1] == 1);
  CHECK(asked[2] == 3);
  CHECK(asked[3] == 7);
  CHECK(asked.back() - asked[asked.size() - 2] == Drafter::probe_interval_max);
  d.append(std::vector<int32_t>{1, 2, 3});
  d.set_model_drafts({8, 9});
  CHECK(d.propose(4).empty());  // alpha ~0: not worth sending
  d.observe(8);                 // ... but the model was right: probed every step again
  CHECK(d.model_tokens_wanted(4, 1) == 1);
  CHECK(d.model_tokens_wanted(4, 1) == 1);
  for (int i = 0; i < 30; ++i) {
    d.append(std::vector<int32_t>{8});
    d.set_model_drafts({8, 8, 8, 8});
    auto sent = d.propose(4);
    if (sent.empty()) {
      d.observe(8);
    } else {
      d.on_verified(static_cast<uint32_t>(sent.size()), static_cast<uint32_t>(sent.size()));
    }
  }
  CHECK(d.model_tokens_wanted(4, 1) == 4);
  CHECK(d.propose(4).size() == 4);
}

TEST_CASE("drafter: measured row costs by batch size size drafts, interpolated between sizes") {
  using tandem::decode::Drafter;
  using tandem::decode::SpecConfig;
  using tandem::decode::SpecShared;
  SpecConfig c = ngram_config();
  SpecShared shared(c);
  {
    Drafter formula(c, shared);  // nothing measured: derived from row_cost
    CHECK(formula.batch_cost(1) == doctest::Approx(0.35));
    CHECK(formula.batch_cost(8) == doctest::Approx(Drafter::batch_row_cost(0.35, 8)));
  }
  // A cpu-like device: extra rows nearly free for one sequence, dear in a batch of 8.
  c.batch_row_costs = {{1, 0.07}, {8, 0.9}};
  REQUIRE(c.validate().ok());
  Drafter d(c, shared);
  CHECK(d.batch_cost(1) == doctest::Approx(0.07));
  CHECK(d.batch_cost(4) == doctest::Approx(0.07 + (0.9 - 0.07) * 3.0 / 7.0));
  CHECK(d.batch_cost(8) == doctest::Approx(0.9));
  CHECK(d.batch_cost(64) == doctest::Approx(0.9));  // past the last size: held
  // So the same proposal at the same acceptance is drafted alone and not in a batch of 8.
  std::vector<TokenId> context{1, 2, 3, 4, 5, 1, 2};
  d.append(context);
  CHECK(d.propose(8, 1).size() == 3);  // alpha 0.5 at 0.07 a row: 1.875 / 1.21 is best
  CHECK(d.propose(8, 8).empty());      // at 0.9 a row none does
  // Sizes must increase; costs lie in (0, 4].
  c.batch_row_costs = {{2, 0.1}, {2, 0.2}};
  CHECK_FALSE(c.validate().ok());
  c.batch_row_costs = {{1, 0.0}};
  CHECK_FALSE(c.validate().ok());
}
