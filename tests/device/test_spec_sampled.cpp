// Speculative decoding is lossless when sampling, on a real (synthesized) model (issue 14):
// with drafts verified by decode::verify_step, the first two generated tokens are distributed
// as without speculation. Two-sample chi-square tests over many seeded runs; a wrong
// acceptance rule (on a rejection, resample from the target instead of the residual) fails
// the same test.
#include <doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "actors/decode/spec_step.hpp"
#include "devices/cpu/cpu_device.hpp"
#include "devices/cpu/weights.hpp"
#include "devices/sampling.hpp"
#include "tests/support/homogeneity.hpp"
#include "tests/support/process.hpp"
#include "tools/model_synth.hpp"

using namespace tandem;

namespace {

using Tokens = std::vector<int32_t>;

struct Fixture {
  std::unique_ptr<devices::Device> device;
  uint32_t vocab = 0;
  Tokens prompt{5, 77, 120, 9, 200, 31, 64};
  int32_t last = 42;  // the token generated before the pass (its KV is written by it)
  devices::SamplingParams params;

  Fixture() {
    std::string dir = testing::make_temp_dir("spec-sampled");
    tools::SynthOptions o;
    o.vocab = 264;
    o.seed = 7;
    REQUIRE(tools::synth_model(o, dir).ok());
    auto weights = devices::cpu::load_model(dir);
    REQUIRE(weights.ok());
    devices::cpu::CpuDeviceOptions options;
    options.blocks_total = 8;
    options.threads = 1;
    auto made = devices::cpu::make_cpu_device(std::move(*weights), options);
    REQUIRE(made.ok());
    device = std::move(made).value();
    vocab = device->model_config().vocab_size;
    std::filesystem::remove_all(dir);
    auto pre = device->prefill(std::vector<devices::PrefillSeq>{{1, table(), 0, prompt, {}}});
    REQUIRE(pre.ok());
    // A peaked but not degenerate target: temperature 0.5, the top 12 tokens.
    params.temperature = 0.5f;
    params.top_k = 12;
  }
  static std::vector<uint32_t> table() { return {0, 1}; }
  uint32_t start() const { return static_cast<uint32_t>(prompt.size()); }
  Tokens history() const {
    Tokens h = prompt;
    h.push_back(last);
    return h;
  }
  devices::SeqOutput pass(uint32_t start_pos, Tokens tokens) {
    auto out = device->decode(std::vector<devices::DecodeSeq>{{1, table(), start_pos, tokens}});
    REQUIRE(out.ok());
    return out->seqs[0];
  }
};

// Draws (t1, t2) without speculation: two one-token passes, each token from its own stream.
std::pair<int32_t, int32_t> plain(Fixture& f, uint64_t seed) {
  devices::SamplingParams p = f.params;
  p.seed = seed;
  Tokens h = f.history();
  auto row1 = f.pass(f.start(), {f.last});
  auto t1 = devices::Sampler(devices::seeded_at(p, 0)).sample(row1.logits, h);
  REQUIRE(t1.ok());
  h.push_back(t1->token);
  auto row2 = f.pass(f.start() + 1, {t1->token});
  auto t2 = devices::Sampler(devices::seeded_at(p, 1)).sample(row2.logits, h);
  REQUIRE(t2.ok());
  return {t1->token, t2->token};
}

// The same with drafts {d1, d2}: one verification pass, and a second one-token pass when
// fewer than two tokens came out. `wrong`: on a rejection, the token is drawn from the
// target itself (not the residual): the classic mistake.
std::pair<int32_t, int32_t> speculated(Fixture& f, uint64_t seed, const Tokens& drafts,
                                       bool wrong, uint32_t* accepted_total) {
  devices::SamplingParams p = f.params;
  p.seed = seed;
  Tokens h = f.history();
  Tokens fed{f.last};
  fed.insert(fed.end(), drafts.begin(), drafts.end());
  auto rows = f.pass(f.start(), fed);
  Tokens emitted;
  if (!wrong) {
    auto e = decode::verify_step(p, 0, {rows.logits, {}}, f.vocab, drafts, h);
    REQUIRE(e.ok());
    for (const auto& t : e->tokens) emitted.push_back(t.token);
    *accepted_total += e->accepted;
  } else {
    devices::Sampler s(devices::seeded_at(p, 0));
    Tokens ctx = h;
    for (size_t i = 0; i <= drafts.size(); ++i) {
      std::span<const float> row(rows.logits.data() + i * f.vocab, f.vocab);
      std::vector<float> prob;
      REQUIRE(s.distribution(row, ctx, prob).ok());
      if (i < drafts.size() && s.unit() < prob[static_cast<size_t>(drafts[i])]) {
        emitted.push_back(drafts[i]);
        ctx.push_back(drafts[i]);
        continue;
      }
      auto t = s.sample(row, ctx);  // wrong: the full target, not max(0, p - q)
      REQUIRE(t.ok());
      emitted.push_back(t->token);
      break;
    }
  }
  if (emitted.size() >= 2) return {emitted[0], emitted[1]};
  h.push_back(emitted[0]);
  auto row2 = f.pass(f.start() + 1, {emitted[0]});
  auto t2 = devices::Sampler(devices::seeded_at(p, 1)).sample(row2.logits, h);
  REQUIRE(t2.ok());
  return {emitted[0], t2->token};
}

// The tests below: alpha = 1e-4 each (Wilson-Hilferty critical values).
std::pair<double, double> homogeneity(const std::map<int64_t, int>& a,
                                      const std::map<int64_t, int>& b) {
  testing::Homogeneity h = testing::homogeneity(a, b);
  REQUIRE(h.df >= 1);
  return {h.chi2, h.critical};
}

}  // namespace

TEST_CASE("sampled speculation on a synthesized model: the tokens' distribution is the "
          "target's; a wrong rule fails") {
  Fixture f;
  // Drafts the target likes and one it may not: the first is row 1's most probable token.
  auto rows = f.pass(f.start(), {f.last});
  std::vector<float> prob;
  devices::Sampler probe(f.params);
  REQUIRE(probe.distribution(rows.logits, f.history(), prob).ok());
  auto d1 = static_cast<int32_t>(std::max_element(prob.begin(), prob.end()) - prob.begin());
  MESSAGE("p(d1) = ", prob[static_cast<size_t>(d1)]);
  REQUIRE(prob[static_cast<size_t>(d1)] > 0.1);
  REQUIRE(prob[static_cast<size_t>(d1)] < 0.9);  // rejections happen too
  const Tokens drafts{d1, 100};
  constexpr int runs = 12000;
  std::map<int64_t, int> plain1, plain2, spec1, spec2, wrong1, wrong2;
  uint32_t accepted = 0, wrong_accepted = 0;
  for (int i = 0; i < runs; ++i) {
    auto [a1, a2] = plain(f, 1000000 + i);
    ++plain1[a1];
    ++plain2[a2];
    auto [b1, b2] = speculated(f, 2000000 + i, drafts, false, &accepted);
    ++spec1[b1];
    ++spec2[b2];
    auto [c1, c2] = speculated(f, 3000000 + i, drafts, true, &wrong_accepted);
    ++wrong1[c1];
    ++wrong2[c2];
  }
  MESSAGE("accepted drafts per step: ", double(accepted) / runs);
  CHECK(accepted > runs / 10);  // the drafts were really exercised
  auto [x1, crit1] = homogeneity(plain1, spec1);
  auto [x2, crit2] = homogeneity(plain2, spec2);
  auto [w1, wcrit1] = homogeneity(plain1, wrong1);
  MESSAGE("first token: chi2 ", x1, " (critical ", crit1, "); second: ", x2, " (", crit2,
          "); wrong rule, first: ", w1, " (", wcrit1, ")");
  CHECK(x1 < crit1);
  CHECK(x2 < crit2);
  CHECK(w1 > 2 * wcrit1);
}
