#include <doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "devices/kv_memory.hpp"
#include "devices/sim/sim_device.hpp"

using namespace tandem::devices;
using namespace tandem::devices::sim;

namespace {

bool has(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

DeviceSpec small_spec(uint64_t seed = 1, tandem::devices::SimParams extra = {}) {
  DeviceSpec spec;
  spec.kind = tandem::config::DeviceKind::sim;
  spec.block_tokens = 16;
  spec.blocks_total = 64;
  spec.seed = seed;
  spec.sim = {{"kv_scale", 1.0 / 128}, {"output_tokens_mean", 100000},
              {"output_tokens_sigma", 0}, {"output_tokens_max", 100000}};
  for (auto& [k, v] : extra) spec.sim[k] = v;
  return spec;
}

std::unique_ptr<SimDevice> make(const DeviceSpec& spec) {
  auto d = SimDevice::create(spec);
  if (!d) FAIL(d.error().describe());
  return std::move(d).value();
}

std::vector<int32_t> prompt(size_t n, uint32_t salt = 0) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(mix64(i * 31 + salt) % 200000);
  return t;
}

std::vector<uint32_t> table(uint32_t first, uint32_t count) {
  std::vector<uint32_t> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Prefill `p` then decode `steps` tokens one at a time; returns the generated tokens.
std::vector<int32_t> generate(Device& d, const std::vector<int32_t>& p, size_t steps,
                              const std::vector<uint32_t>& blocks, uint64_t seq_id = 7) {
  PrefillSeq pre{seq_id, blocks, 0, p};
  auto r = d.prefill(std::span(&pre, 1));
  REQUIRE(r.ok());
  std::vector<int32_t> out = {r->seqs[0].tokens.at(0)};
  for (size_t i = 0; i < steps; ++i) {
    DecodeSeq dec{seq_id, blocks, static_cast<uint32_t>(p.size() + i), {out.back()}};
    auto s = d.decode(std::span(&dec, 1));
    REQUIRE(s.ok());
    out.push_back(s->seqs[0].tokens.at(0));
  }
  return out;
}

}  // namespace

TEST_CASE("modelled times follow the documented formulas") {
  sim::SimParams p;  // defaults: 4 NPUs, pp, 2e15 FLOP/s, 4.8e12 B/s, mfu .4, eff .7
  const double overhead = 100e-6, attn = 4.0 * 62 * 48 * 128;
  // Prefill, pp, 2048 new tokens at context 0: C = 4 chunks through 4 stages.
  SeqShape pre{0, 2048};
  double flops = 2 * 10e9 * 2048 + attn * (2048.0 * 2049 / 2);
  CHECK(pass_flops(p, pre) == doctest::Approx(flops));
  double t1 = std::max(flops / (2e15 * 0.4), (10e9 * 4 + 126976.0 * 2048) / (4.8e12 * 0.7));
  CHECK(prefill_time_s(p, std::span(&pre, 1)) ==
        doctest::Approx(t1 * (4 + 3) / (4.0 * 4) + overhead));
  // A single chunk gets no pipeline speedup.
  SeqShape small{0, 100};
  double f_small = pass_flops(p, small);
  double t_small = std::max(f_small / (2e15 * 0.4), (10e9 + 126976.0 * 100) / (4.8e12 * 0.7));
  CHECK(prefill_time_s(p, std::span(&small, 1)) == doctest::Approx(t_small + overhead));
  // dp_ep prefill: all NPUs on the whole batch.
  sim::SimParams q = p;
  q.parallel = ParallelMode::dp_ep;
  double t_dp = std::max(flops / (2e15 * 4 * 0.4), (10e9 + 126976.0 * 2048) / (4.8e12 * 4 * 0.7));
  CHECK(prefill_time_s(q, std::span(&pre, 1)) == doctest::Approx(t_dp + overhead));
  // Decode: 8 sequences at context 10000, one new token each: memory bound.
  std::vector<SeqShape> batch(8, SeqShape{10000, 1});
  double bytes = 10e9 + 8 * 126976.0 * 10001;
  CHECK(decode_step_time_s(p, batch) == doctest::Approx(bytes / (4.8e12 * 0.7) + overhead));
  CHECK(decode_step_time_s(q, batch) == doctest::Approx(bytes / (4.8e12 * 4 * 0.7) + overhead));
  // Longer contexts cost more; more KV capacity than the weights leave is impossible.
  std::vector<SeqShape> longer(8, SeqShape{100000, 1});
  CHECK(decode_step_time_s(p, longer) > decode_step_time_s(p, batch));
  CHECK(kv_capacity_tokens(p) == doctest::Approx((144e9 * 4 - 229e9) * 0.9 / 126976));
}

TEST_CASE("sim params come from the map; bad keys and values are named") {
  auto ok = params_from_map({{"npu_count", 8}, {"dp_ep", 1}, {"copy_probability", 0.25}});
  REQUIRE(ok.ok());
  CHECK(ok->npu_count == 8);
  CHECK(ok->parallel == ParallelMode::dp_ep);
  CHECK(ok->copy_probability == 0.25);
  auto unknown = params_from_map({{"npu_cuont", 8}});
  REQUIRE_FALSE(unknown.ok());
  CHECK(has(unknown.error().message, "unknown parameter 'npu_cuont'"));
  auto frac = params_from_map({{"npu_count", 2.5}});
  REQUIRE_FALSE(frac.ok());
  CHECK(has(frac.error().message, "npu_count"));
  auto range = params_from_map({{"copy_probability", 1.5}});
  REQUIRE_FALSE(range.ok());
  CHECK(has(range.error().message, "copy_probability = 1.5 is outside [0, 1]"));
  CHECK_FALSE(params_from_map({{"kv_scale", 0.001}}).ok());
  CHECK_FALSE(params_from_map({{"eos_id", 300000}}).ok());
  CHECK_FALSE(params_from_map({{"prefill_mfu", 0}}).ok());
}

TEST_CASE("same seed gives the same tokens, another seed others") {
  auto a = make(small_spec(1));
  auto b = make(small_spec(1));
  auto c = make(small_spec(2));
  auto p = prompt(40);
  auto blocks = table(0, 8);
  auto ta = generate(*a, p, 30, blocks);
  CHECK(ta == generate(*b, p, 30, blocks));
  CHECK(ta != generate(*c, p, 30, blocks));
  for (int32_t t : ta) CHECK((t >= 0 && t < 200064));
  CHECK(a->last_pass_modelled_s() > 0);
  CHECK(a->total_modelled_s() > a->last_pass_modelled_s());
}

TEST_CASE("copies happen at about the configured rate and come from the context") {
  for (double rate : {0.0, 0.3, 0.8}) {
    sim::SimParams p;
    p.copy_probability = rate;
    p.output_tokens_sigma = 0;
    p.output_tokens_mean = 1e6;
    p.output_tokens_max = 1000000;
    std::vector<int32_t> ctx = prompt(500, 9);
    std::vector<uint64_t> hashes;
    uint64_t h = context_hash_root;
    for (uint32_t i = 0; i < ctx.size(); ++i) hashes.push_back(h = context_hash(h, ctx[i], i));
    int copied = 0, steps = 3000;
    for (int i = 0; i < steps; ++i) {
      NextToken t = next_token(p, 5, ctx, hashes, 500);
      CHECK_FALSE(t.end);
      if (t.copied) {
        ++copied;
        bool in_context = std::find(ctx.begin(), ctx.end(), t.token) != ctx.end();
        CHECK(in_context);
      }
      ctx.push_back(t.token);
      hashes.push_back(h = context_hash(h, t.token, static_cast<uint32_t>(ctx.size() - 1)));
    }
    CHECK(std::abs(copied / double(steps) - rate) < 0.04);
  }
}

TEST_CASE("outputs end with eos at the drawn length; lengths average the mean") {
  auto d = make(small_spec(3, {{"output_tokens_mean", 12}, {"output_tokens_sigma", 0}}));
  auto out = generate(*d, prompt(20), 11, table(0, 4));
  REQUIRE(out.size() == 12);
  for (size_t i = 0; i + 1 < out.size(); ++i) CHECK(out[i] != 200020);
  CHECK(out.back() == 200020);
  sim::SimParams p;  // lognormal, mean 1000, sigma 0.5
  double sum = 0;
  for (uint64_t i = 0; i < 4000; ++i) sum += output_length_tokens(p, 11, mix64(i));
  CHECK(sum / 4000 == doctest::Approx(1000).epsilon(0.05));
  CHECK(output_length_tokens(p, 11, 42) == output_length_tokens(p, 11, 42));
}

TEST_CASE("bos and eos are never copied or drawn (decode stops at bos)") {
  sim::SimParams p;  // a llama2.c token space: a tiny vocab so draws hit bos and eos often
  p.vocab = 8;
  p.bos_id = 1;
  p.eos_id = 2;
  p.output_tokens_mean = 100000;
  p.output_tokens_sigma = 0;
  p.output_tokens_max = 100000;
  std::vector<int32_t> ctx;
  std::vector<uint64_t> hashes;
  uint64_t h = context_hash_root;
  for (int32_t i = 0; i < 64; ++i) {  // a prompt full of bos and eos for spans to copy
    ctx.push_back(i % 4);
    h = context_hash(h, ctx.back(), static_cast<uint32_t>(i));
    hashes.push_back(h);
  }
  size_t copied = 0;
  for (uint32_t q = 64; q < 2064; ++q) {
    NextToken t = next_token(p, 9, ctx, hashes, 64);
    REQUIRE_FALSE(t.end);
    CHECK(t.token != 1);
    CHECK(t.token != 2);
    copied += t.copied;
    ctx.push_back(t.token);
    h = context_hash(h, t.token, q);
    hashes.push_back(h);
  }
  CHECK(copied > 500);  // the copy path was exercised, not only draws
}

TEST_CASE("KV blocks carry checkable contents; a decode with drafts matches single steps") {
  auto d = make(small_spec());
  auto p = prompt(40);
  auto blocks = table(10, 4);
  auto out = generate(*d, p, 5, blocks);
  std::vector<int32_t> seq = p;
  seq.insert(seq.end(), out.begin(), out.end() - 1);  // the last output is not in KV yet
  const KvLayout& layout = d->kv_layout();
  CHECK(layout.head_dim == 1);  // 128 * 1/128
  std::vector<std::byte> got(layout.block_bytes() * 3);
  REQUIRE(d->copy_blocks_out(std::vector<uint32_t>{10, 11, 12}, got).ok());
  for (uint32_t b = 0; b < 3; ++b) {
    auto want = expected_block_bytes(layout, seq, b);
    CHECK(std::memcmp(got.data() + b * layout.block_bytes(), want.data(), want.size()) == 0);
  }
  auto wrong = expected_block_bytes(layout, prompt(40, 1), 0);
  CHECK(std::memcmp(got.data(), wrong.data(), wrong.size()) != 0);
  // Verify three drafts in one pass: all correct -> rows equal the single-step tokens.
  auto e = make(small_spec());
  auto first = generate(*e, p, 0, blocks);
  DecodeSeq dec{7, blocks, 40, {first[0], out[1], out[2], out[3]}};
  auto r = e->decode(std::span(&dec, 1));
  REQUIRE(r.ok());
  CHECK(r->seqs[0].rows_count == 4);
  CHECK(r->seqs[0].tokens == std::vector<int32_t>{out[1], out[2], out[3], out[4]});
}

TEST_CASE("blocks copied out of one device and into another continue the sequence") {
  auto prefill_dev = make(small_spec());
  auto decode_dev = make(small_spec());
  auto p = prompt(50);
  auto reference = generate(*make(small_spec()), p, 6, table(0, 4));
  PrefillSeq pre{3, table(0, 4), 0, p};
  auto first = prefill_dev->prefill(std::span(&pre, 1));
  REQUIRE(first.ok());
  CHECK(first->seqs[0].tokens[0] == reference[0]);
  const KvLayout& layout = prefill_dev->kv_layout();
  std::vector<std::byte> wire(layout.block_bytes() * 4);
  REQUIRE(prefill_dev->copy_blocks_out(table(0, 4), wire).ok());
  // Without the blocks, decode refuses: the pool does not hold this context.
  auto dst = table(20, 4);
  DecodeSeq dec{9, dst, 50, {reference[0]}};
  auto missing = decode_dev->decode(std::span(&dec, 1));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().kind == tandem::ErrorKind::failed);
  CHECK(has(missing.error().message, "position 0"));
  REQUIRE(decode_dev->copy_blocks_in(dst, wire).ok());
  std::vector<int32_t> got = {reference[0]};
  for (uint32_t i = 0; i < 6; ++i) {
    DecodeSeq step{9, dst, 50 + i, {got.back()}};
    auto r = decode_dev->decode(std::span(&step, 1));
    REQUIRE(r.ok());
    got.push_back(r->seqs[0].tokens[0]);
  }
  CHECK(got == reference);
  std::vector<std::byte> back(layout.block_bytes());
  REQUIRE(decode_dev->copy_blocks_out(std::vector<uint32_t>{20}, back).ok());
  CHECK(std::memcmp(back.data(), wire.data(), back.size()) == 0);
}

TEST_CASE("bad batches and bad specs are errors naming what is wrong") {
  auto d = make(small_spec());
  std::vector<PrefillSeq> none;
  CHECK(has(d->prefill(none).error().message, "empty batch"));
  auto expect = [&](PrefillSeq s, const char* what) {
    auto r = d->prefill(std::span(&s, 1));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().kind == tandem::ErrorKind::invalid);
    CHECK_MESSAGE(has(r.error().message, what), r.error().message);
  };
  expect({1, table(0, 2), 0, {}}, "no tokens");
  expect({1, table(0, 2), 0, {5, 200064}}, "tokens[1] = 200064 is outside [0, 200064)");
  expect({1, table(0, 1), 0, prompt(17)}, "block table has 1 blocks, 2 needed");
  expect({1, {0, 64}, 0, prompt(17)}, "block_table[1] = 64 is outside [0, 64)");
  expect({1, table(0, 2), 204799, {1, 2}}, "exceed max_position");
  std::vector<PrefillSeq> twice = {{1, table(0, 1), 0, {1}}, {1, table(1, 1), 0, {2}}};
  CHECK(has(d->prefill(twice).error().message, "seq_id appears twice"));
  std::vector<std::byte> buf(d->kv_layout().block_bytes());
  auto out_of_range = d->copy_blocks_out(std::vector<uint32_t>{64}, buf);
  REQUIRE_FALSE(out_of_range.ok());
  CHECK(has(out_of_range.error().message, "blocks[0] = 64 is outside [0, 64)"));
  auto short_buf = d->copy_blocks_in(std::vector<uint32_t>{1, 2}, buf);
  REQUIRE_FALSE(short_buf.ok());
  CHECK(has(short_buf.error().message, "2 blocks need"));

  auto spec_error = [](DeviceSpec spec) {
    auto r = SimDevice::create(spec);
    REQUIRE_FALSE(r.ok());
    return r.error().message;
  };
  DeviceSpec spec = small_spec();
  spec.blocks_total = 0;
  CHECK(has(spec_error(spec), "no KV pool size"));
  spec = small_spec();
  spec.sim["bogus"] = 1;
  CHECK(has(spec_error(spec), "unknown parameter 'bogus'"));
  spec = small_spec();
  spec.kind = tandem::config::DeviceKind::cpu;
  CHECK(has(spec_error(spec), "not sim"));
  spec = small_spec();
  spec.blocks_total = 4000000;  // 64M tokens: far beyond 4 x 144 GB
  CHECK(has(spec_error(spec), "exceeds the modelled HBM"));
  spec = small_spec();
  spec.blocks_total = 0;
  spec.kv_bytes_max = 10 * d->kv_layout().block_bytes();
  CHECK(make(spec)->kv_layout().blocks_total == 10);
  CHECK(make_sim_device(small_spec()).ok());
}

TEST_CASE("time_factor: ready_at is the modelled end, passes queue one after another; 0 is now") {
  auto fast = make(small_spec(1, {{"step_overhead_us", 30000}}));
  auto slow = make(small_spec(1, {{"step_overhead_us", 30000}, {"time_factor", 1}}));
  PrefillSeq pre{1, table(0, 1), 0, {1, 2, 3}};
  auto t0 = std::chrono::steady_clock::now();
  auto quick = fast->prefill(std::span(&pre, 1));
  REQUIRE(quick.ok());
  CHECK(quick.value().ready_at == std::chrono::steady_clock::time_point{});
  auto t1 = std::chrono::steady_clock::now();
  auto first = slow->prefill(std::span(&pre, 1));
  REQUIRE(first.ok());
  auto t2 = std::chrono::steady_clock::now();
  CHECK(slow->last_pass_modelled_s() > 0.03);
  // It does not sleep: the modelled time is returned, not spent.
  CHECK(std::chrono::duration<double>(t2 - t1).count() < 0.03);
  CHECK(std::chrono::duration<double>(first.value().ready_at - t1).count() >=
        slow->last_pass_modelled_s());
  CHECK(first.value().ready_at <=
        t2 + std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::duration<double>(slow->last_pass_modelled_s())));
  // A second pass asked for at once starts when the first ends.
  DecodeSeq dec{1, table(0, 1), 3, {first.value().seqs[0].tokens[0]}};
  auto second = slow->decode(std::span(&dec, 1));
  REQUIRE(second.ok());
  CHECK(std::chrono::duration<double>(second.value().ready_at - first.value().ready_at).count() ==
        doctest::Approx(slow->last_pass_modelled_s()).epsilon(0.01));
  // wait_ready sleeps until the modelled end.
  wait_ready(second.value());
  CHECK(std::chrono::steady_clock::now() >= second.value().ready_at);
  CHECK(std::chrono::duration<double>(t1 - t0).count() < 0.03);
  SeqShape shape{0, 3};
  CHECK(fast->last_pass_modelled_s() == doctest::Approx(prefill_time_s(fast->params(),
                                                                       std::span(&shape, 1))));
}

namespace {

// A small vocabulary with MiniMax-M2-like markers at its end: "</think>" is one token (500),
// "<minimax:tool_call>" one (501), and a two-token marker (10, 11) stands for a marker a
// tokenizer splits.
constexpr int32_t kClose = 500, kToolOpen = 501;
SimMarkup minimax_markup() {
  SimMarkup markup;
  markup.reasoning_close = {kClose};
  markup.banned = {{kToolOpen}, {10, 11}};
  return markup;
}

DeviceSpec markup_spec(double share, SimMarkup markup, double mean = 200) {
  DeviceSpec spec = small_spec(3, {{"vocab", 512}, {"bos_id", 505}, {"eos_id", 507},
                                   {"output_tokens_mean", mean}, {"output_tokens_max", 4096},
                                   {"reasoning_share", share}, {"copy_probability", 0.5}});
  spec.sim_markup = std::move(markup);
  return spec;
}

std::vector<int32_t> small_prompt(size_t n, uint32_t salt) {
  std::vector<int32_t> t = prompt(n, salt);
  for (auto& id : t) id %= 500;  // ids below the markers
  return t;
}

}  // namespace

TEST_CASE("reasoning formats: the output closes its reasoning after reasoning_share, then text") {
  const double share = 0.3;
  auto d = make(markup_spec(share, minimax_markup()));
  std::vector<int32_t> p = small_prompt(40, 1);
  p.push_back(kClose);  // the prompt's history holds markers the copy model could repeat
  p.push_back(kToolOpen);
  p.push_back(10);
  p.push_back(11);
  std::vector<int32_t> out = generate(*d, p, 199, table(0, 20));
  REQUIRE(out.back() == 507);  // the whole output (mean 200, sigma 0): eos last
  REQUIRE(out.size() == 200);
  size_t close_count = std::count(out.begin(), out.end(), kClose);
  CHECK(close_count == 1);
  size_t at = std::find(out.begin(), out.end(), kClose) - out.begin();
  CHECK(at == static_cast<size_t>(std::round(share * 199)));  // reasoning tokens before it
  CHECK(at + 1 < out.size() - 1);                             // text follows
  // Never a tool-call marker, whole or completed from its parts, even by copying the prompt.
  CHECK(std::count(out.begin(), out.end(), kToolOpen) == 0);
  for (size_t i = 0; i + 1 < out.size(); ++i) CHECK_FALSE((out[i] == 10 && out[i + 1] == 11));
  // Deterministic: another device with the same seed writes the same.
  auto again = make(markup_spec(share, minimax_markup()));
  CHECK(generate(*again, p, 199, table(0, 20)) == out);
}

TEST_CASE("reasoning formats: an opening marker first (chatml); share 0 and 1; bad markup") {
  SimMarkup chatml;
  chatml.reasoning_open = {498, 499};  // a two-token "<think>"
  chatml.reasoning_close = {kClose};
  chatml.banned = {{kToolOpen}};
  auto d = make(markup_spec(0.5, chatml, 101));
  std::vector<int32_t> out = generate(*d, small_prompt(30, 2), 100, table(0, 20));
  REQUIRE(out.size() == 101);
  CHECK(out[0] == 498);
  CHECK(out[1] == 499);
  CHECK(out[2 + 50] == kClose);
  CHECK(std::count(out.begin(), out.end(), kClose) == 1);
  for (size_t i = 2; i + 1 < out.size(); ++i) CHECK_FALSE((out[i] == 498 && out[i + 1] == 499));

  auto zero = make(markup_spec(0, minimax_markup(), 50));
  std::vector<int32_t> at_once = generate(*zero, small_prompt(30, 3), 49, table(0, 20));
  CHECK(at_once.front() == kClose);  // no reasoning: closed at once, then text
  auto one = make(markup_spec(1, minimax_markup(), 50));
  std::vector<int32_t> never = generate(*one, small_prompt(30, 3), 49, table(0, 20));
  CHECK(std::count(never.begin(), never.end(), kClose) == 0);  // reasoning to the end

  // Plain (no markup): reasoning_share changes nothing.
  auto plain = make(markup_spec(0.3, SimMarkup{}));
  auto plain_other = make(markup_spec(0.9, SimMarkup{}));
  CHECK(generate(*plain, small_prompt(30, 4), 60, table(0, 20)) ==
        generate(*plain_other, small_prompt(30, 4), 60, table(0, 20)));

  SimMarkup bad_id = minimax_markup();
  bad_id.banned.push_back({512});
  auto e1 = SimDevice::create(markup_spec(0.3, bad_id));
  REQUIRE_FALSE(e1.ok());
  CHECK(has(e1.error().message, "outside [0, vocab 512)"));
  SimMarkup open_only;
  open_only.reasoning_open = {498};
  auto e2 = SimDevice::create(markup_spec(0.3, open_only));
  REQUIRE_FALSE(e2.ok());
  CHECK(has(e2.error().message, "without a closing one"));
  SimMarkup empty_ban = minimax_markup();
  empty_ban.banned.push_back({});
  CHECK_FALSE(SimDevice::create(markup_spec(0.3, empty_ban)).ok());
  auto e3 = SimDevice::create(markup_spec(1.5, minimax_markup()));
  REQUIRE_FALSE(e3.ok());
  CHECK(has(e3.error().message, "reasoning_share"));
}

TEST_CASE("KV pools vs host memory: sizes, the budget and the startup error") {
  DeviceSpec spec = small_spec();
  spec.block_tokens = 4096;
  spec.blocks_total = 600;
  auto bytes = kv_pool_host_bytes(spec);
  REQUIRE(bytes.ok());
  CHECK(*bytes == uint64_t{600} * 4096 * 62 * 8 * 1 * 2);  // kv_scale 1/128: 8-byte rows
  // cpu: fp32 rows from the model's shape; stories15M: 6 layers, 6 KV heads of 48 dims.
  DeviceSpec cpu;
  cpu.block_tokens = 16;
  cpu.blocks_total = 512;
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  cpu.model_path = std::string(root) + "/models/stories15M";
  auto cpu_bytes = kv_pool_host_bytes(cpu);
  REQUIRE_MESSAGE(cpu_bytes.ok(), cpu_bytes.error().describe());
  CHECK(*cpu_bytes == uint64_t{512} * 16 * 6 * 2 * 6 * 48 * 4);
  cpu.model_path = std::string(root) + "/models/no-such-model";
  CHECK_FALSE(kv_pool_host_bytes(cpu).ok());
  DeviceSpec bad = small_spec(1, {{"kv_scale", 2.0}});
  CHECK_FALSE(kv_pool_host_bytes(bad).ok());

  const uint64_t gib = uint64_t{1} << 30;
  CHECK(kv_pool_budget_bytes(24 * gib) == 24 * gib - 24 * gib / 10);
  CHECK(kv_pool_budget_bytes(4 * gib) == 3 * gib);  // the margin is at least 1 GiB
  CHECK(kv_pool_budget_bytes(gib / 2) == 0);
  CHECK(host_memory_bytes() > 0);

  std::vector<KvPoolUse> pools = {{"exec-prefill", 31 * gib, 7936, 4096},
                                  {"exec-decode", 31 * gib, 7936, 4096}};
  auto error = check_kv_pools_fit("node 'node1'", pools, 24 * gib);
  REQUIRE(error.has_value());
  for (const char* fragment :
       {"node 'node1'", "62.0 GiB", "24.0 GiB", "21.6 GiB", "executor 'exec-prefill': kv_blocks "
        "7936 x model.block_tokens 4096 = 31.0 GiB", "executor 'exec-decode'", "kv_blocks",
        "[sim] kv_scale", "model.block_tokens"}) {
    CHECK_MESSAGE(has(*error, fragment), fragment, "\n", *error);
  }
  CHECK_FALSE(check_kv_pools_fit("node1", pools, 80 * gib).has_value());
  CHECK_FALSE(check_kv_pools_fit("node1", pools, 0).has_value());  // memory unknown
}

TEST_CASE("a prefill that copies a cached block first continues inside it; bad copies are errors") {
  auto d = make(small_spec());
  auto p = prompt(40);
  auto reference = generate(*make(small_spec()), p, 0, table(0, 3));
  PrefillSeq first{3, table(0, 3), 0, p};
  REQUIRE(d->prefill(std::span(&first, 1)).ok());
  // Another sequence reuses block 0, copies block 1 (tokens 16..31) into its own block 5 and
  // computes from token 24: the context it reads is the copied one.
  PrefillSeq next{9, {0, 5, 6}, 24, {p.begin() + 24, p.end()}};
  next.copies.push_back({1, 5});
  auto r = d->prefill(std::span(&next, 1));
  REQUIRE_MESSAGE(r.ok(), r.error().describe());
  CHECK(r->seqs[0].tokens[0] == reference[0]);
  // Without the copy the pool does not hold that context.
  PrefillSeq stale{10, {0, 7, 8}, 24, {p.begin() + 24, p.end()}};
  auto missing = d->prefill(std::span(&stale, 1));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().kind == tandem::ErrorKind::failed);
  PrefillSeq bad = next;
  bad.seq_id = 11;
  bad.copies = {{1, 64}};
  auto out_of_range = d->prefill(std::span(&bad, 1));
  REQUIRE_FALSE(out_of_range.ok());
  CHECK(has(out_of_range.error().message, "block copy 1 -> 64"));
}
