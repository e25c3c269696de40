// Lossless verification of speculative drafts: greedy by hand, and sampled by a chi-square
// test over seeded runs that a wrong acceptance rule fails (shown with two wrong rules).
#include <doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "actors/decode/spec_step.hpp"
#include "actors/decode/spec_verify.hpp"

using tandem::decode::verify_greedy;
using tandem::decode::verify_sampled;
using tandem::decode::Verified;
using Rows = std::vector<float>;

TEST_CASE("verify greedy: drafts equal to the target's argmax, then the target's token") {
  // vocab 4, k = 3: argmaxes per row 2, 1, 3, 0.
  Rows rows{0.1f, 0.2f, 0.6f, 0.1f,  0.0f, 0.9f, 0.05f, 0.05f,
            0.2f, 0.2f, 0.1f, 0.5f,  0.7f, 0.1f, 0.1f,  0.1f};
  auto all = verify_greedy(rows, 4, std::vector<int32_t>{2, 1, 3});
  REQUIRE(all.ok());
  CHECK(all->accepted == 3);
  CHECK(all->next == 0);  // the bonus token
  auto second = verify_greedy(rows, 4, std::vector<int32_t>{2, 3, 3});
  REQUIRE(second.ok());
  CHECK(second->accepted == 1);
  CHECK(second->next == 1);  // the correction: row 1's argmax
  auto none = verify_greedy(std::span(rows).first(8), 4, std::vector<int32_t>{0});
  CHECK(none->accepted == 0);
  CHECK(none->next == 2);
  auto plain = verify_greedy(std::span(rows).first(4), 4, {});  // no drafts: plain decoding
  CHECK(plain->accepted == 0);
  CHECK(plain->next == 2);
  // Ties: the lowest index, as the sampler's greedy.
  Rows tie{0.4f, 0.4f, 0.2f, 0.0f, 0.5f, 0.5f};
  CHECK(verify_greedy(tie, 3, std::vector<int32_t>{1})->accepted == 0);
  auto tied = verify_greedy(tie, 3, std::vector<int32_t>{0});
  CHECK(tied->accepted == 1);
  CHECK(tied->next == 1);  // row 1 ties tokens 1 and 2
}

TEST_CASE("verify: malformed inputs are invalid, naming what is wrong") {
  Rows rows(8, 0.25f);
  auto shape = verify_greedy(rows, 4, std::vector<int32_t>{1, 2});
  REQUIRE_FALSE(shape.ok());
  CHECK(shape.error().message.find("8 target values for 2 drafts") != std::string::npos);
  auto outside = verify_greedy(rows, 4, std::vector<int32_t>{4});
  CHECK(outside.error().message.find("draft 0 is token 4") != std::string::npos);
  CHECK_FALSE(verify_greedy(rows, 0, {}).ok());
  auto unit = [] { return 0.5; };
  Rows nan = rows;
  nan[5] = std::nanf("");
  CHECK(verify_sampled(nan, 4, std::vector<int32_t>{1}, {}, unit).error().message.find(
            "row 1 token 1") != std::string::npos);
  Rows empty_row = rows;
  for (int t = 0; t < 4; ++t) empty_row[t] = 0;
  CHECK(verify_sampled(empty_row, 4, std::vector<int32_t>{1}, {}, unit)
            .error().message.find("row 0 sums to 0") != std::string::npos);
  Rows q{0.0f, 0.0f, 1.0f, 0.0f};
  CHECK(verify_sampled(rows, 4, std::vector<int32_t>{1}, q, unit).error().message.find(
            "draft probability 0") != std::string::npos);
  CHECK_FALSE(verify_sampled(rows, 4, std::vector<int32_t>{1}, Rows(3, 0.1f), unit).ok());
}

namespace {
constexpr uint32_t vocab = 5;
// Two target rows (after the context, after draft 0) and a bonus row.
const Rows target{0.30f, 0.05f, 0.40f, 0.15f, 0.10f,   // row 0
                  0.10f, 0.50f, 0.05f, 0.25f, 0.10f,   // row 1
                  0.20f, 0.20f, 0.20f, 0.20f, 0.20f};  // row 2 (bonus)
// An EAGLE-like draft distribution per position (unlike the target).
const Rows draft_q{0.10f, 0.10f, 0.20f, 0.50f, 0.10f,
                   0.40f, 0.10f, 0.10f, 0.20f, 0.20f};

using Rule = std::function<Verified(std::span<const int32_t> drafts, bool with_q,
                                    const std::function<double()>& unit)>;

Verified lossless(std::span<const int32_t> drafts, bool with_q,
                  const std::function<double()>& unit) {
  auto v = verify_sampled(target, vocab, drafts, with_q ? std::span<const float>(draft_q)
                                                        : std::span<const float>(), unit);
  REQUIRE(v.ok());
  return *v;
}

int32_t draw_from(std::span<const float> p, double u) {
  double run = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    run += p[t];
    if (u < run) return static_cast<int32_t>(t);
  }
  return static_cast<int32_t>(p.size() - 1);
}

// Wrong: a rejected point-mass draft resamples the full target row (the draft can come back).
Verified resample_full(std::span<const int32_t> drafts, bool,
                       const std::function<double()>& unit) {
  Verified v;
  for (; v.accepted < drafts.size(); ++v.accepted) {
    auto p = std::span(target).subspan(v.accepted * vocab, vocab);
    if (unit() < p[static_cast<size_t>(drafts[v.accepted])]) continue;
    v.next = draw_from(p, unit());
    return v;
  }
  v.next = draw_from(std::span(target).subspan(drafts.size() * vocab, vocab), unit());
  return v;
}

// Wrong: a rejected draft drawn from q resamples the full target row, not the residual.
Verified no_residual(std::span<const int32_t> drafts, bool, const std::function<double()>& unit) {
  Verified v;
  for (; v.accepted < drafts.size(); ++v.accepted) {
    const size_t i = v.accepted, d = static_cast<size_t>(drafts[i]);
    auto p = std::span(target).subspan(i * vocab, vocab);
    if (unit() < std::min(1.0, double(p[d]) / draft_q[i * vocab + d])) continue;
    v.next = draw_from(p, unit());
    return v;
  }
  v.next = draw_from(std::span(target).subspan(drafts.size() * vocab, vocab), unit());
  return v;
}

// Pearson's chi-square of counts against probabilities.
double chi_square(const std::vector<double>& counts, std::span<const float> p) {
  double n = 0, x2 = 0;
  for (double c : counts) n += c;
  for (size_t t = 0; t < counts.size(); ++t) {
    const double want = n * p[t];
    x2 += (counts[t] - want) * (counts[t] - want) / want;
  }
  return x2;
}

// The emitted first token against row 0, and the second against row 1 where the first draft
// was accepted, over `runs` seeded steps. Drafts: a point mass at {2, 3}, or drawn from
// draft_q (then the draft itself is random, as a draft model's would be).
std::pair<double, double> chi_squares(const Rule& rule, bool with_q, int runs) {
  std::mt19937_64 rng(1402);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  auto unit = [&] { return uniform(rng); };
  std::vector<double> first(vocab, 0), second(vocab, 0);
  for (int r = 0; r < runs; ++r) {
    std::vector<int32_t> drafts{2, 3};
    if (with_q) {
      drafts[0] = draw_from(std::span(draft_q).first(vocab), unit());
      drafts[1] = draw_from(std::span(draft_q).subspan(vocab, vocab), unit());
    }
    Verified v = rule(drafts, with_q, unit);
    const int32_t t0 = v.accepted >= 1 ? drafts[0] : v.next;
    first[static_cast<size_t>(t0)] += 1;
    if (v.accepted >= 1) second[static_cast<size_t>(v.accepted >= 2 ? drafts[1] : v.next)] += 1;
  }
  return {chi_square(first, std::span(target).first(vocab)),
          chi_square(second, std::span(target).subspan(vocab, vocab))};
}

// Chi-square with 4 degrees of freedom: P(X > 18.47) = 0.001.
constexpr double x2_limit = 18.47;
constexpr int runs = 40000;
}  // namespace

TEST_CASE("verify sampled: emitted tokens are distributed as the target's, point-mass drafts") {
  auto [x0, x1] = chi_squares(lossless, false, runs);
  CHECK(x0 < x2_limit);
  CHECK(x1 < x2_limit);
  // The test can fail: resampling the full row after a rejection skews token 2 up.
  auto [w0, w1] = chi_squares(resample_full, false, runs);
  CHECK(w0 > 10 * x2_limit);
  (void)w1;
}

TEST_CASE("verify sampled: emitted tokens are distributed as the target's, drafts with q") {
  auto [x0, x1] = chi_squares(lossless, true, runs);
  CHECK(x0 < x2_limit);
  CHECK(x1 < x2_limit);
  // The test can fail: without the residual norm(max(0, p - q)) the first token is skewed.
  auto [w0, w1] = chi_squares(no_residual, true, runs);
  CHECK(w0 > 10 * x2_limit);
  (void)w1;
}

TEST_CASE("verify sampled: a draft the target rules out is always rejected") {
  Rows rows{0.0f, 1.0f, 0.0f,  0.5f, 0.5f, 0.0f};  // row 0: token 1 certain
  int ones = 0;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  auto unit = [&] { return uniform(rng); };
  for (int r = 0; r < 200; ++r) {
    auto v = verify_sampled(rows, 3, std::vector<int32_t>{2}, {}, unit);
    REQUIRE(v.ok());
    CHECK(v->accepted == 0);
    ones += v->next == 1;
    auto sure = verify_sampled(rows, 3, std::vector<int32_t>{1}, {}, unit);
    CHECK(sure->accepted == 1);
    CHECK(sure->next != 2);  // the bonus row rules token 2 out too
  }
  CHECK(ones == 200);
}

TEST_CASE("verify_step on rows the device chose and scored: the accepted run carries the "
          "device's logprobs, stop ids marked") {
  using tandem::devices::SampledToken;
  tandem::devices::SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = true;
  p.logprobs_top_n = 2;
  p.stop_token_ids = {8};
  std::vector<int32_t> tokens{5, 8, 9};  // rows' argmax: drafts {5, 7} -> 5 accepted, then 8
  std::vector<SampledToken> scored;
  for (int32_t t : tokens) {
    SampledToken s;
    s.token = t;
    s.logprob = -0.25f * float(t);
    s.top = {{t, s.logprob}, {t + 1, -3.0f}};
    scored.push_back(s);
  }
  std::vector<int32_t> drafts{5, 7};
  auto e = tandem::decode::verify_step(p, 0, {{}, tokens, scored}, 0, drafts, {});
  REQUIRE(e.ok());
  CHECK(e->accepted == 1);
  REQUIRE(e->tokens.size() == 2);
  CHECK(e->tokens[0].token == 5);
  CHECK(e->tokens[0].logprob == -1.25f);
  CHECK(e->tokens[0].top == scored[0].top);
  CHECK(!e->tokens[0].is_stop);
  CHECK(e->tokens[1].token == 8);
  CHECK(e->tokens[1].logprob == -2.0f);
  CHECK(e->tokens[1].is_stop);
  // Without scores (a token-producing device such as sim): logprob 0, the token its own top.
  auto bare = tandem::decode::verify_step(p, 0, {{}, tokens, {}}, 0, drafts, {});
  REQUIRE(bare.ok());
  CHECK(bare->tokens[1].logprob == 0.0f);
  CHECK(bare->tokens[1].top.size() == 1);
}
