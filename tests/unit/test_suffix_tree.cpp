// Suffix decoding's trees: counts against brute force (appends, inserts, removals), drafts by
// hand and on random contexts, the bounds, and the config's rules.
#include <doctest.h>

#include <random>
#include <vector>

#include "actors/decode/suffix_tree.hpp"

using tandem::decode::SuffixCache;
using tandem::decode::SuffixConfig;
using tandem::decode::SuffixProposer;
using tandem::decode::SuffixTree;
using Tokens = std::vector<int32_t>;

namespace {
uint32_t occurrences(const std::vector<Tokens>& seqs, const Tokens& w) {
  uint32_t n = 0;
  for (const Tokens& s : seqs) {
    for (size_t i = 0; i + w.size() <= s.size(); ++i) {
      n += std::equal(w.begin(), w.end(), s.begin() + static_cast<ptrdiff_t>(i));
    }
  }
  return n;
}

// Every substring of every sequence up to `depth` (and a few absent ones): counted exactly.
void check_counts(const SuffixTree& tree, const std::vector<Tokens>& seqs, uint32_t depth) {
  tree.check_invariants();
  for (const Tokens& s : seqs) {
    for (size_t i = 0; i < s.size(); ++i) {
      for (size_t l = 1; l <= depth + 1 && i + l <= s.size(); ++l) {
        Tokens w(s.begin() + static_cast<ptrdiff_t>(i), s.begin() + static_cast<ptrdiff_t>(i + l));
        REQUIRE(tree.count(w) == (l > depth ? 0 : occurrences(seqs, w)));
      }
    }
  }
  CHECK(tree.count(Tokens{999}) == 0);
  CHECK(tree.count(Tokens{}) == 0);
}
}  // namespace

TEST_CASE("suffix tree: appended token by token, every substring is counted exactly") {
  std::mt19937_64 rng(1);
  for (int run = 0; run < 200; ++run) {
    const auto depth = static_cast<uint32_t>(1 + rng() % 6);
    SuffixTree tree(depth, 1u << 20);
    SuffixTree::Cursor cursor;
    Tokens seq;
    const size_t n = 1 + rng() % 40;
    for (size_t i = 0; i < n; ++i) {
      seq.push_back(static_cast<int32_t>(rng() % (2 + rng() % 3)));
      tree.append(cursor, seq.back());
    }
    check_counts(tree, {seq}, depth);
    SuffixTree whole(depth, 1u << 20);
    whole.insert(seq);
    CHECK(whole.nodes_count() == tree.nodes_count());
  }
}

TEST_CASE("suffix tree: inserts and removals stay exact, and removing all empties it") {
  std::mt19937_64 rng(2);
  for (int run = 0; run < 100; ++run) {
    const uint32_t depth = 4;
    SuffixTree tree(depth, 1u << 20);
    std::vector<Tokens> in;
    for (int op = 0; op < 12; ++op) {
      if (!in.empty() && rng() % 3 == 0) {
        size_t victim = rng() % in.size();
        tree.remove(in[victim]);
        in.erase(in.begin() + static_cast<ptrdiff_t>(victim));
      } else {
        Tokens s;
        for (size_t i = 0, n = 1 + rng() % 20; i < n; ++i) s.push_back(static_cast<int32_t>(rng() % 3));
        tree.insert(s);
        in.push_back(s);
      }
      check_counts(tree, in, depth);
    }
    for (const Tokens& s : in) tree.remove(s);
    CHECK(tree.nodes_count() == 1);  // the root
    tree.check_invariants();
  }
}

TEST_CASE("suffix: a draft follows the most frequent continuation while it is likely enough") {
  SuffixConfig config;
  config.probability_min = 0.5;
  SuffixProposer p(config, nullptr);
  // "7 1 2" is followed by 3 4 twice and by 5 once.
  p.append(Tokens{7, 1, 2, 3, 4, 9, 7, 1, 2, 3, 4, 9, 7, 1, 2, 5, 9, 7, 1, 2});
  auto d = p.propose(4);
  // Matching "7 1 2" (3 tokens, so at most 3 drafted): 3 4 9 at 2/3 each, score 2. Matching
  // "9 7 1 2": 3 at 1/2 (once 3, once 5), then 4 9 7 at 1/2: also 2; the longer match wins.
  CHECK(d.tokens == Tokens{3, 4, 9, 7});
  CHECK(d.match_tokens == 4);
  CHECK(d.score == doctest::Approx(2.0));
  // A floor above 2/3: nothing is likely enough.
  config.probability_min = 0.7;
  SuffixProposer strict(config, nullptr);
  strict.append(p.tokens());
  CHECK(strict.propose(4).tokens.empty());
  CHECK(p.propose(0).tokens.empty());
  // The budget: at most match_factor x match tokens.
  config.probability_min = 0.1;
  config.match_factor = 0.5;
  SuffixProposer half(config, nullptr);
  half.append(Tokens{1, 2, 3, 4, 5, 6, 1, 2});
  auto short_draft = half.propose(8);
  CHECK(short_draft.match_tokens == 2);
  CHECK(short_draft.tokens == Tokens{3});  // floor(0.5 x 2) = 1
}

TEST_CASE("suffix: the instance's cache of outputs proposes what an earlier request wrote") {
  SuffixConfig config;
  SuffixCache cache(config);
  cache.add(Tokens{40, 41, 42, 43, 44, 45});
  SuffixProposer p(config, &cache);
  p.append(Tokens{1, 2, 3, 40, 41});
  auto d = p.propose(3);
  CHECK(d.tokens == Tokens{42, 43});  // "40 41" matched: at most 2
  CHECK(d.score == doctest::Approx(2.0));
  // Its own context now continues "40 41" with 50 (twice): for one token a tie, which goes to
  // the request's own tree; for two, the cache's 42 43 (2.0) beats 50 then 7 or 8 (1.5).
  p.append(Tokens{50, 7, 40, 41, 50, 8, 40, 41});
  CHECK(p.propose(1).tokens == Tokens{50});
  CHECK(p.propose(2).tokens == Tokens{42, 43});
  // Evicted by tokens: the oldest output goes, and its substrings with it.
  config.cache_tokens_max = 8;
  SuffixCache small(config);
  small.add(Tokens{1, 2, 3, 4, 5});
  small.add(Tokens{6, 7, 8, 9});
  CHECK(small.outputs_count() == 1);
  CHECK(small.tokens_count() == 4);
  CHECK(small.tree().count(Tokens{1, 2}) == 0);
  CHECK(small.tree().count(Tokens{7, 8}) == 1);
  small.tree().check_invariants();
  // Evicted by nodes: the newest output is kept even alone.
  config.cache_tokens_max = 1000;
  config.cache_nodes_max = 10;
  SuffixCache nodes(config);
  nodes.add(Tokens{1, 2, 3});
  nodes.add(Tokens{4, 5, 6, 7, 8, 9});
  CHECK(nodes.outputs_count() == 1);
  CHECK(nodes.tree().count(Tokens{1}) == 0);
  CHECK(nodes.tree().count(Tokens{4, 5, 6}) == 1);
}

TEST_CASE("suffix: on random contexts every draft continues its match as the context did") {
  std::mt19937_64 rng(3);
  for (int run = 0; run < 300; ++run) {
    SuffixConfig config;
    config.depth_max = static_cast<uint32_t>(2 + rng() % 8);
    config.probability_min = 0.05 + 0.5 * static_cast<double>(rng() % 100) / 100.0;
    SuffixProposer p(config, nullptr);
    for (size_t i = 0, n = 1 + rng() % 80; i < n; ++i) {
      p.append(static_cast<int32_t>(rng() % 4));
      const auto k = static_cast<uint32_t>(1 + rng() % 6);
      auto d = p.propose(k);
      Tokens ctx(p.tokens().begin(), p.tokens().end());
      REQUIRE(d.tokens.size() <= k);
      if (d.tokens.empty()) continue;
      REQUIRE(d.match_tokens >= 1);
      REQUIRE(d.tokens.size() <= d.match_tokens);  // match_factor 1
      Tokens w(ctx.end() - d.match_tokens, ctx.end());
      double probability = 1, score = 0;
      for (int32_t t : d.tokens) {
        // The path's probability, recomputed from the context: count(w t) / followers of w.
        uint32_t followers = 0;
        for (int32_t u = 0; u < 4; ++u) {
          Tokens wu = w;
          wu.push_back(u);
          if (wu.size() <= config.depth_max) followers += occurrences({ctx}, wu);
        }
        w.push_back(t);
        REQUIRE(w.size() <= config.depth_max);
        REQUIRE(occurrences({ctx}, w) > 0);
        probability *= static_cast<double>(occurrences({ctx}, w)) / followers;
        score += probability;
        REQUIRE(probability >= config.probability_min);
      }
      REQUIRE(d.score == doctest::Approx(score));
    }
  }
}

TEST_CASE("suffix: a request's tree stops growing at request_nodes_max, and still proposes") {
  SuffixConfig config;
  config.depth_max = 16;
  config.request_nodes_max = 100;
  SuffixProposer p(config, nullptr);
  std::mt19937_64 rng(4);
  for (int i = 0; i < 500; ++i) p.append(static_cast<int32_t>(rng() % 1000));
  CHECK(p.tree().nodes_count() == 101);
  CHECK(p.tree().nodes_refused() > 0);
  p.tree().check_invariants();
  // An early pair repeated is still recorded and proposed.
  Tokens head(p.tokens().begin(), p.tokens().begin() + 3);
  p.append(head[0]);
  p.append(head[1]);
  CHECK(p.propose(1).tokens == Tokens{head[2]});
}

TEST_CASE("suffix: a config outside its rules is invalid, naming the key") {
  SuffixConfig c;
  CHECK(c.validate().ok());
  c.depth_max = 0;
  CHECK(c.validate().error().message.find("depth_max = 0") != std::string::npos);
  c = {};
  c.probability_min = 0;
  CHECK(c.validate().error().message.find("probability_min") != std::string::npos);
  c = {};
  c.match_factor = -1;
  CHECK(c.validate().error().message.find("match_factor") != std::string::npos);
  c = {};
  c.cache_tokens_max = 0;
  CHECK(c.validate().error().message.find("cache_tokens_max") != std::string::npos);
}
