#include <doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "devices/sampling.hpp"

using tandem::devices::apply_penalties;
using tandem::devices::Sampler;
using tandem::devices::SampledToken;
using tandem::devices::SamplingParams;

namespace {

SampledToken draw(Sampler& s, const std::vector<float>& logits,
                  const std::vector<int32_t>& history = {}) {
  auto r = s.sample(logits, history);
  REQUIRE(r.ok());
  return *r;
}

// Frequencies of each token over `n` draws.
std::map<int32_t, int> histogram(SamplingParams p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[draw(s, logits).token];
  return h;
}

double log_softmax_at(const std::vector<float>& l, size_t i) {
  double m = -1e30, sum = 0;
  for (float v : l) m = std::max(m, static_cast<double>(v));
  for (float v : l) sum += std::exp(v - m);
  return l[i] - m - std::log(sum);
}

const std::vector<float> kRow = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 2.0f, -3.0f, 1.0f};

}  // namespace

TEST_CASE("greedy picks the argmax (lowest index on ties) with its log-softmax") {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs_top_n = 3;
  Sampler s(p);
  SampledToken t = draw(s, kRow);
  CHECK(t.token == 1);  // 1 and 5 tie at 2.0
  CHECK(t.logprob == doctest::Approx(log_softmax_at(kRow, 1)).epsilon(1e-5));
  REQUIRE(t.top.size() == 3);
  CHECK(t.top[0].token == 1);
  CHECK(t.top[1].token == 5);
  CHECK(t.top[2].token == 3);
  CHECK(t.top[2].logprob == doctest::Approx(log_softmax_at(kRow, 3)).epsilon(1e-5));
  for (int i = 0; i < 20; ++i) CHECK(draw(s, kRow).token == 1);
}

TEST_CASE("top_k = 1 is greedy for any seed; top_k = 3 keeps exactly the three best") {
  std::vector<float> row = {0.1f, 0.3f, 0.2f, 0.25f, 0.05f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams p;
    p.top_k = 1;
    p.seed = seed;
    Sampler s(p);
    CHECK(draw(s, row).token == 1);
  }
  SamplingParams p;
  p.top_k = 3;
  auto h = histogram(p, row, 3000);
  CHECK(h.size() == 3);
  CHECK(h.count(1) == 1);
  CHECK(h.count(2) == 1);
  CHECK(h.count(3) == 1);
}

TEST_CASE("top_p keeps the smallest head that reaches the mass") {
  std::vector<float> row = {3.0f, 2.0f, 1.0f, 0.0f};  // p ~ 0.64, 0.24, 0.09, 0.03
  SamplingParams p;
  p.top_p = 0.5f;
  auto h = histogram(p, row, 2000);
  CHECK(h.size() == 1);
  CHECK(h[0] == 2000);
  p.top_p = 0.8f;  // needs tokens 0 and 1 (0.64 < 0.8 <= 0.88)
  h = histogram(p, row, 4000);
  CHECK(h.size() == 2);
  // Renormalized over the head: p0 = e^3 / (e^3 + e^2) = 0.731.
  CHECK(h[0] / 4000.0 == doctest::Approx(0.731).epsilon(0.05));
  p.top_p = 1.0f;
  h = histogram(p, row, 4000);
  CHECK(h.size() == 4);
}

TEST_CASE("min_p drops tokens below min_p * p_max") {
  std::vector<float> row = {0.0f, -0.5f, -1.0f, -2.0f};  // p / p_max = 1, .61, .37, .14
  SamplingParams p;
  p.min_p = 0.5f;
  auto h = histogram(p, row, 3000);
  CHECK(h.size() == 2);
  CHECK(h.count(0) == 1);
  CHECK(h.count(1) == 1);
  p.min_p = 0.1f;
  CHECK(histogram(p, row, 3000).size() == 4);
  p.min_p = 1.0f;  // only the max survives
  h = histogram(p, row, 500);
  CHECK(h.size() == 1);
  CHECK(h[0] == 500);
}

TEST_CASE("repetition_penalty divides positive and multiplies negative logits once per token") {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  std::vector<float> row = {2.0f, -1.0f, 1.0f, 0.5f};
  std::vector<uint32_t> scratch;
  std::vector<int32_t> history = {0, 1, 0, 0};
  apply_penalties(p, row, history, scratch);
  CHECK(row[0] == 1.0f);
  CHECK(row[1] == -2.0f);
  CHECK(row[2] == 1.0f);
  CHECK(row[3] == 0.5f);
  for (uint32_t c : scratch) CHECK(c == 0);  // scratch left clean
  // Through the sampler: token 0 was the argmax; penalized, it ties 2 and loses on index.
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> row2 = {2.0f, -1.0f, 1.5f};
  CHECK(draw(s, row2, {0}).token == 2);
  CHECK(draw(s, row2, {}).token == 0);
}

TEST_CASE("presence and frequency penalties subtract per OpenAI's formula") {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<float> row = {1.0f, 1.0f, 1.0f};
  std::vector<uint32_t> scratch;
  std::vector<int32_t> history = {0, 0, 0, 1};
  apply_penalties(p, row, history, scratch);
  CHECK(row[0] == doctest::Approx(1.0 - 0.5 - 0.75));
  CHECK(row[1] == doctest::Approx(1.0 - 0.5 - 0.25));
  CHECK(row[2] == 1.0f);
  // A repeated token's probability drops in the processed distribution.
  p.logprobs_top_n = 3;
  Sampler s(p);
  SampledToken with = draw(s, {1.0f, 1.0f, 1.0f}, history);
  std::map<int32_t, float> lp;
  for (auto& t : with.top) lp[t.token] = t.logprob;
  CHECK(lp[0] < lp[1]);
  CHECK(lp[1] < lp[2]);
  // Negative penalties encourage repetition.
  SamplingParams q;
  q.temperature = 0;
  q.presence_penalty = -1.0f;
  Sampler g(q);
  CHECK(draw(g, {1.0f, 1.5f, 1.0f}, {2}).token == 2);
}

TEST_CASE("temperature sharpens and flattens, measured over many draws") {
  std::vector<float> row = {1.0f, 0.0f};
  auto p0 = [&](float t) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 7;
    return histogram(p, row, 8000)[0] / 8000.0;
  };
  double e = std::exp(1.0);
  CHECK(p0(1.0f) == doctest::Approx(e / (1 + e)).epsilon(0.03));           // 0.731
  CHECK(p0(0.5f) == doctest::Approx(e * e / (1 + e * e)).epsilon(0.03));   // 0.881
  CHECK(p0(2.0f) == doctest::Approx(std::sqrt(e) / (1 + std::sqrt(e))).epsilon(0.03));  // .622
  CHECK(p0(0.5f) > p0(1.0f));
  CHECK(p0(1.0f) > p0(2.0f));
}

TEST_CASE("the same seed gives the same tokens; another seed gives others") {
  std::vector<float> row(1000);
  for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>(std::sin(i * 0.37));
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    p.top_p = 0.95f;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(draw(s, row, out).token);
    return out;
  };
  CHECK(run(42) == run(42));
  CHECK(run(42) != run(43));
}

TEST_CASE("logprobs report the processed distribution; filtered tokens never appear") {
  SamplingParams p;
  p.top_k = 2;
  p.logprobs_top_n = 5;
  Sampler s(p);
  std::vector<float> row = {3.0f, 2.0f, 1.0f, 0.0f};
  SampledToken t = draw(s, row);
  REQUIRE(t.top.size() == 2);
  CHECK(t.top[0].token == 0);
  CHECK(t.top[1].token == 1);
  double norm = std::log(std::exp(3.0) + std::exp(2.0));
  CHECK(t.top[0].logprob == doctest::Approx(3.0 - norm).epsilon(1e-5));
  CHECK(t.top[1].logprob == doctest::Approx(2.0 - norm).epsilon(1e-5));
  CHECK(std::exp(t.top[0].logprob) + std::exp(t.top[1].logprob) ==
        doctest::Approx(1.0).epsilon(1e-5));
  CHECK(t.logprob == t.top[static_cast<size_t>(t.token)].logprob);
}

TEST_CASE("stop tokens are flagged") {
  SamplingParams p;
  p.temperature = 0;
  p.stop_token_ids = {3};
  Sampler s(p);
  CHECK(draw(s, {0.0f, 0.0f, 0.0f, 5.0f}).is_stop);
  CHECK_FALSE(draw(s, {5.0f, 0.0f, 0.0f, 0.0f}).is_stop);
}

TEST_CASE("invalid parameters are errors that name the parameter and the range") {
  auto message = [](SamplingParams p, int64_t vocab = 0) {
    auto st = p.validate(vocab);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().kind == tandem::ErrorKind::invalid);
    return st.error().message;
  };
  auto contains = [](const std::string& s, const char* what) {
    return s.find(what) != std::string::npos;
  };
  SamplingParams p;
  CHECK(p.validate().ok());
  p.temperature = -0.1f;
  CHECK(contains(message(p), "temperature"));
  p = {};
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  CHECK(contains(message(p), "temperature"));
  p = {};
  p.top_k = -1;
  CHECK(contains(message(p), "top_k"));
  p = {};
  p.top_p = 0.0f;
  CHECK(contains(message(p), "top_p = 0 is outside (0, 1]"));
  p.top_p = 1.5f;
  CHECK(contains(message(p), "top_p"));
  p = {};
  p.min_p = 1.1f;
  CHECK(contains(message(p), "min_p"));
  p = {};
  p.repetition_penalty = 0.0f;
  CHECK(contains(message(p), "repetition_penalty"));
  p = {};
  p.presence_penalty = 2.5f;
  CHECK(contains(message(p), "presence_penalty"));
  p = {};
  p.frequency_penalty = -2.01f;
  CHECK(contains(message(p), "frequency_penalty"));
  p = {};
  p.logprobs_top_n = 21;
  CHECK(contains(message(p), "logprobs_top_n = 21 is outside [0, 20]"));
  p = {};
  p.stop_token_ids = {1, 100};
  CHECK(p.validate().ok());
  CHECK(contains(message(p, 50), "stop_token_ids[1] = 100 is outside [0, 50)"));
  CHECK_FALSE(tandem::devices::validate(p, 50).ok());
  CHECK(tandem::devices::validate(p, 500).ok());
}

TEST_CASE("bad rows are errors, not crashes") {
  Sampler s(SamplingParams{});
  std::vector<float> empty;
  std::vector<int32_t> none;
  CHECK_FALSE(s.sample(empty, none).ok());
  std::vector<float> nan_row = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  auto r = s.sample(nan_row, none);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("logits[1]") != std::string::npos);
  std::vector<float> row = {0.0f, 1.0f};
  std::vector<int32_t> bad_history = {0, 2};
  r = s.sample(row, bad_history);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("history[1] = 2") != std::string::npos);
  float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> all_masked = {ninf, ninf};
  CHECK_FALSE(s.sample(all_masked, none).ok());
  std::vector<float> some_masked = {ninf, 0.0f};
  CHECK(draw(s, some_masked).token == 1);
}

TEST_CASE("top_p over a large vocab keeps exactly the sorted head (no full sort needed)") {
  std::vector<float> row(5000);
  for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>(std::sin(i * 1.7) * 3.0);
  // Reference: sort descending (index on ties), keep while the mass before is below top_p.
  std::vector<size_t> idx(row.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return row[a] > row[b]; });
  double m = row[idx[0]], total = 0;
  for (float v : row) total += std::exp(v - m);
  std::vector<bool> kept(row.size(), false);
  double before = 0, kept_mass = 0;
  size_t kept_count = 0;
  for (size_t i : idx) {
    if (before >= 0.6 * total) break;
    double w = std::exp(row[i] - m);
    before += w;
    kept_mass += w;
    kept[i] = true;
    ++kept_count;
  }
  REQUIRE(kept_count > 256);  // the head had to grow past its first sizes
  SamplingParams p;
  p.top_p = 0.6f;
  p.logprobs_top_n = 1;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) {
    SampledToken t = draw(s, row);
    CHECK(kept[static_cast<size_t>(t.token)]);
    double want = row[static_cast<size_t>(t.token)] - m - std::log(kept_mass);
    CHECK(t.logprob == doctest::Approx(want).epsilon(1e-4));
    REQUIRE(t.top.size() == 1);
    CHECK(t.top[0].token == static_cast<int32_t>(idx[0]));
  }
}

TEST_CASE("distribution is what sample draws from: its support, sum and the sampled logprob") {
  const std::vector<int32_t> history{1, 1, 3};
  std::vector<SamplingParams> cases(6);
  cases[0].temperature = 0.0f;
  cases[1].temperature = 0.7f;
  cases[2].top_k = 3;
  cases[3].top_p = 0.6f;
  cases[4].min_p = 0.3f;
  cases[5].repetition_penalty = 1.5f;
  cases[5].frequency_penalty = 0.5f;
  cases[5].top_k = 5;
  for (size_t c = 0; c < cases.size(); ++c) {
    CAPTURE(c);
    Sampler dist(cases[c]), sampler(cases[c]);
    std::vector<float> p;
    REQUIRE(dist.distribution(kRow, history, p).ok());
    REQUIRE(p.size() == kRow.size());
    double total = 0;
    for (float x : p) total += x;
    CHECK(total == doctest::Approx(1.0));
    for (int i = 0; i < 300; ++i) {
      auto s = sampler.sample(kRow, history);
      REQUIRE(s.ok());
      // Only tokens it keeps are drawn, with the logprob of its probability (greedy reports
      // the log-softmax instead, as documented).
      REQUIRE(p[static_cast<size_t>(s->token)] > 0.0f);
      if (c > 0) CHECK(s->logprob == doctest::Approx(std::log(p[static_cast<size_t>(s->token)])).epsilon(1e-4));
    }
  }
  // Greedy: all the mass on the argmax (lowest index on ties: 1 over 5).
  Sampler greedy(cases[0]);
  std::vector<float> g;
  REQUIRE(greedy.distribution(kRow, {}, g).ok());
  CHECK(g[1] == 1.0f);
  CHECK(g[5] == 0.0f);
  // top_k = 3 keeps exactly three tokens.
  Sampler top3(cases[2]);
  std::vector<float> t3;
  REQUIRE(top3.distribution(kRow, {}, t3).ok());
  CHECK(std::count_if(t3.begin(), t3.end(), [](float x) { return x > 0; }) == 3);
  // Errors as sample's, and no draw from the stream: the next sample is unchanged.
  std::vector<float> bad;
  CHECK_FALSE(top3.distribution({}, {}, bad).ok());
  CHECK_FALSE(top3.distribution(kRow, std::vector<int32_t>{99}, bad).ok());
  SamplingParams seeded;
  seeded.seed = 7;
  Sampler a(seeded), b(seeded);
  std::vector<float> ignored;
  REQUIRE(a.distribution(kRow, {}, ignored).ok());
  CHECK(draw(a, kRow).token == draw(b, kRow).token);
  CHECK(a.unit() == b.unit());
}
