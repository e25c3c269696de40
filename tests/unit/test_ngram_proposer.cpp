// The n-gram (prompt lookup) proposer: hand-made contexts, bounds, and 2000 random contexts
// against a brute-force reference.
#include <doctest.h>

#include <random>
#include <vector>

#include "actors/decode/ngram_proposer.hpp"

using tandem::decode::NgramConfig;
using tandem::decode::NgramProposer;
using Tokens = std::vector<int32_t>;

namespace {
NgramProposer with(const Tokens& context, NgramConfig config = {}) {
  NgramProposer p(config);
  p.append(context);
  return p;
}

// The definition, by brute force: the longest common suffix (capped at max) of the context
// and any earlier prefix of it, the most recent on ties, at least min long; the tokens after.
Tokens reference(const Tokens& c, const NgramConfig& config, uint32_t k, uint32_t* length) {
  const size_t n = c.size();
  size_t best_end = 0;
  uint32_t best = 0;
  for (size_t end = n - 1; end >= 1 && end < n; --end) {
    uint32_t l = 0;
    while (l < config.match_tokens_max && l < end && c[end - 1 - l] == c[n - 1 - l]) ++l;
    if (l >= config.match_tokens_min && l > best) {
      best = l;
      best_end = end;
    }
  }
  *length = best;
  if (best == 0) return {};
  return Tokens(c.begin() + static_cast<ptrdiff_t>(best_end),
                c.begin() + static_cast<ptrdiff_t>(std::min(n, best_end + k)));
}
}  // namespace

TEST_CASE("ngram: the tokens after the earlier occurrence of the context's suffix") {
  auto p = with({1, 2, 3, 4, 5, 9, 1, 2, 3});
  CHECK(p.propose(3) == Tokens{4, 5, 9});
  CHECK(p.match_tokens() == 3);
  CHECK(p.propose(0).empty());
  // Cut at the context's end: the occurrence is close to it.
  CHECK(p.propose(10) == Tokens{4, 5, 9, 1, 2, 3});
  // Appending continues the match: the next proposal starts one further.
  p.append(4);
  CHECK(p.propose(2) == Tokens{5, 9});
}

TEST_CASE("ngram: the longest match wins over a more recent shorter one; ties go to the newest") {
  // "1 2 3" occurs once (then 7); "2 3" occurs later after a 5 (then 8). The suffix is 1 2 3.
  auto p = with({1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3});
  CHECK(p.propose(1) == Tokens{7});
  CHECK(p.match_tokens() == 3);
  // Two equal-length matches: the newer one's continuation.
  auto q = with({4, 5, 6, 4, 5, 7, 4, 5});
  CHECK(q.propose(1) == Tokens{7});
  CHECK(q.match_tokens() == 2);
}

TEST_CASE("ngram: below match_tokens_min nothing is proposed; match_tokens_max caps the length") {
  NgramConfig three{.match_tokens_min = 3, .match_tokens_max = 4, .candidates_max = 8};
  CHECK(with({1, 2, 9, 1, 2}, three).propose(4).empty());  // "1 2" is only 2 long
  CHECK(with({1, 2, 3, 9, 1, 2, 3}, three).propose(1) == Tokens{9});
  auto capped = with({1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6}, three);
  CHECK(capped.match_tokens() == 4);
  CHECK(capped.propose(1) == Tokens{0});
  CHECK(with({}).propose(4).empty());
  CHECK(with({5}).propose(4).empty());
  CHECK(with({1, 2, 3, 4, 5, 6}).propose(4).empty());  // nothing repeats
  // A run of one token matches itself one back: it proposes the run's continuation.
  CHECK(with({7, 7, 7, 7}).propose(4) == Tokens{7});
}

TEST_CASE("ngram: a proposal considers only the newest candidates_max occurrences") {
  // The long match "1 2 3 4" is the oldest of 4 occurrences of "3 4".
  Tokens c{1, 2, 3, 4, 50, 9, 3, 4, 51, 9, 3, 4, 52, 9, 3, 4, 53, 1, 2, 3, 4};
  NgramConfig all{.match_tokens_min = 2, .match_tokens_max = 8, .candidates_max = 8};
  CHECK(with(c, all).propose(1) == Tokens{50});
  NgramConfig three = all;
  three.candidates_max = 3;  // sees 53's, 52's and 51's: all match 2; the newest wins
  CHECK(with(c, three).propose(1) == Tokens{53});
  CHECK(with(c, three).match_tokens() == 2);
}

TEST_CASE("ngram: 2000 random contexts equal the brute-force definition") {
  std::mt19937_64 rng(14);
  for (int run = 0; run < 2000; ++run) {
    NgramConfig config;
    config.match_tokens_min = 1 + static_cast<uint32_t>(rng() % 3);
    config.match_tokens_max = config.match_tokens_min + static_cast<uint32_t>(rng() % 5);
    config.candidates_max = 1u << 20;  // every occurrence: the reference's definition
    const auto alphabet = static_cast<int32_t>(2 + rng() % 4);
    NgramProposer p(config);
    Tokens c;
    const size_t n = 1 + rng() % 60;
    for (size_t i = 0; i < n; ++i) {
      c.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(alphabet)));
      p.append(c.back());
      const auto k = static_cast<uint32_t>(rng() % 6);
      uint32_t length = 0;
      Tokens want = reference(c, config, k, &length);
      REQUIRE_MESSAGE(p.propose(k) == want, "run ", run, " at ", c.size());
      REQUIRE(p.match_tokens() == length);
    }
    CHECK(p.size() == c.size());
  }
}

TEST_CASE("ngram: a config outside its rules is invalid, naming the key") {
  NgramConfig zero{.match_tokens_min = 0};
  CHECK(zero.validate().error().message.find("match_tokens_min = 0") != std::string::npos);
  NgramConfig inverted{.match_tokens_min = 4, .match_tokens_max = 3};
  CHECK(inverted.validate().error().message.find("match_tokens_max = 3") != std::string::npos);
  NgramConfig none{.candidates_max = 0};
  CHECK_FALSE(none.validate().ok());
  CHECK(NgramConfig{}.validate().ok());
}
