// The cpu Device against an independent dense reference (tests/device/ref_model.hpp), and
// against itself: paged incremental decode vs full recompute, chunked vs one-shot prefill,
// batched vs alone, KV blocks moved between devices, draft verification in one pass.
#include <doctest/doctest.h>

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "devices/cpu/cpu_device.hpp"
#include "devices/cpu/small_gemm.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/device/model_files.hpp"
#include "tools/model_synth.hpp"

namespace {

using namespace tandem::devices;
using tandem::devices::cpu::select_blas_kernels;
using reftest::RefModel;

std::string source_root() {
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  return root ? root : ".";
}

std::string stories_dir() { return source_root() + "/models/stories15M"; }

// The kernels this process runs (TANDEM_CPU_KERNELS, read once; devices/README.md): the
// small-row AVX2/AVX-512 kernels, or "none", the portable BLAS path of a CPU without AVX2,
// which the `cpu_device_portable` test forces. Safe in skip decorators (static init).
bool small_kernels() { return std::string(tandem::devices::cpu::small_gemm_isa()) != "none"; }

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("tandem-cpu-test-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// A model under test: the reference's weights and a path the device loads the same weights from.
struct Subject {
  std::string name;
  RefModel ref;
  std::string path;
};

ModelConfig gqa_config() {
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab_size = 61;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.intermediate = 48;
  c.rope_theta = 10000.0f;
  c.rotary_dim = 8;
  c.rms_eps = 1e-5f;
  c.tie_embeddings = false;
  c.max_position = 96;
  return c;
}

ModelConfig minimax_config() {
  ModelConfig c = gqa_config();
  c.arch = Arch::minimax_m2;
  c.head_dim = 16;  // heads*head_dim (64) != hidden (32)
  c.rotary_dim = 8; // partial rotary
  c.rope_theta = 5e6f;
  c.intermediate = 0;
  c.qk_norm = true;
  c.experts = 6;
  c.experts_per_token = 2;
  c.moe_intermediate = 24;
  c.router_bias = true;
  c.tie_embeddings = true;
  return c;
}

Subject random_subject(const std::string& name, const ModelConfig& c, uint32_t seed,
                       bool whole_qk_norm, bool biases) {
  Subject s{name, {}, temp_dir(name)};
  s.ref.c = c;
  s.ref.t = reftest::random_tensors(c, seed, whole_qk_norm);
  if (biases) {  // Qwen2-style q/k/v biases
    std::mt19937 rng(seed + 1);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (uint32_t l = 0; l < c.layers; ++l) {
      for (const char* p : {"q", "k", "v"}) {
        size_t n = size_t(std::string(p) == "q" ? c.heads : c.kv_heads) * c.head_dim;
        std::vector<float> b(n);
        for (auto& x : b) x = u(rng);
        s.ref.t[s.ref.L(l, std::string("self_attn.") + p + "_proj.bias")] = b;
      }
    }
  }
  reftest::write_hf_dir(s.path, c, s.ref.t);
  return s;
}

Subject stories_subject() {
  Subject s{"stories15M", {}, stories_dir() + "/stories15M.bin"};
  REQUIRE_MESSAGE(reftest::read_llama2c(s.path, &s.ref),
                  "missing " << s.path << ": run tools/setup.sh (tools/setup.d/30-model.sh)");
  return s;
}

// A directory written by `tandem model synth` (its library, tools/model_synth.hpp); the
// reference reads the same safetensors file with its own reader and takes the config synth
// declares, while the device parses config.json.
Subject synth_subject(const std::string& name, const tandem::tools::SynthOptions& options) {
  Subject s{name, {}, temp_dir(name)};
  auto config = tandem::tools::synth_config(options);
  REQUIRE_MESSAGE(config.ok(), (config.ok() ? "" : config.error().describe()));
  auto st = tandem::tools::synth_model(options, s.path);
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().describe()));
  s.ref.c = *config;
  REQUIRE(reftest::read_safetensors_f32(s.path + "/model.safetensors", &s.ref.t));
  return s;
}

tandem::tools::SynthOptions synth_llama_gqa() {
  tandem::tools::SynthOptions o;
  o.arch = Arch::llama;
  o.heads = 8;
  o.kv_heads = 2;  // GQA: 4 query heads per KV head
  o.head_dim = 8;
  o.seed = 21;
  return o;
}

tandem::tools::SynthOptions synth_minimax_moe() {
  tandem::tools::SynthOptions o;
  o.arch = Arch::minimax_m2;  // QK-norm, sigmoid router with bias
  o.experts = 8;
  o.experts_per_token = 2;
  o.ffn = 32;
  o.rotary_dim = 8;  // partial rotary: 8 of 16 dims
  o.seed = 22;
  return o;
}

std::vector<Subject>& subjects() {
  static std::vector<Subject> all = [] {
    std::vector<Subject> v;
    v.push_back(stories_subject());
    v.push_back(random_subject("llama_gqa", gqa_config(), 7, false, true));
    v.push_back(random_subject("minimax_m2", minimax_config(), 11, true, false));
    ModelConfig per_head = minimax_config();
    per_head.router_bias = false;
    per_head.tie_embeddings = false;
    v.push_back(random_subject("minimax_per_head_qk", per_head, 13, false, false));
    v.push_back(synth_subject("synth_llama_gqa", synth_llama_gqa()));
    v.push_back(synth_subject("synth_minimax_moe", synth_minimax_moe()));
    return v;
  }();
  return all;
}

std::unique_ptr<Device> open_device(const std::string& path, uint32_t block_tokens = 4,
                                    uint32_t blocks_total = 96) {
  DeviceSpec spec;
  spec.kind = tandem::config::DeviceKind::cpu;
  spec.model_path = path;
  spec.block_tokens = block_tokens;
  spec.blocks_total = blocks_total;
  spec.threads = 1;
  auto dev = make_device(spec);
  REQUIRE_MESSAGE(dev.ok(), (dev.ok() ? "" : dev.error().describe()));
  return std::move(*dev);
}

// Hands out block ids in a scrambled order so that tables are never contiguous.
struct Blocks {
  std::vector<uint32_t> free;
  explicit Blocks(uint32_t total, uint32_t seed = 3) {
    for (uint32_t i = 0; i < total; ++i) free.push_back(i);
    std::shuffle(free.begin(), free.end(), std::mt19937(seed));
  }
  std::vector<uint32_t> take(uint32_t count) {
    REQUIRE(count <= free.size());
    std::vector<uint32_t> out(free.end() - count, free.end());
    free.resize(free.size() - count);
    return out;
  }
};

uint32_t blocks_for(uint32_t tokens, uint32_t block_tokens) {
  return (tokens + block_tokens - 1) / block_tokens;
}

std::vector<int32_t> random_tokens(const ModelConfig& c, uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(3, int32_t(c.vocab_size) - 1);
  std::vector<int32_t> v{c.bos_id};
  while (v.size() < n) v.push_back(u(rng));
  return v;
}

// max |a-b| <= tol * max(1, max |b|)
template <class A, class B>
bool close(const A& a, const B& b, double tol, size_t offset = 0) {
  double diff = 0, mag = 1;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[offset + i]) - double(b[i])));
    mag = std::max(mag, std::abs(double(b[i])));
  }
  if (diff > tol * mag) MESSAGE("max diff " << diff << " vs scale " << mag);
  return diff <= tol * mag;
}

std::vector<float> row(const SeqOutput& out, uint32_t r, uint32_t vocab) {
  REQUIRE(r < out.rows_count);
  REQUIRE(out.logits.size() == size_t(out.rows_count) * vocab);
  return {out.logits.begin() + long(r) * vocab, out.logits.begin() + long(r + 1) * vocab};
}

std::vector<float> prefill_last(Device& dev, Blocks& blocks, const std::vector<int32_t>& toks) {
  uint32_t bt = dev.kv_layout().block_tokens;
  PrefillSeq s{1, blocks.take(blocks_for(uint32_t(toks.size()), bt)), 0, toks};
  auto out = dev.prefill(std::span(&s, 1));
  REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().describe()));
  auto r = row(out->seqs[0], 0, dev.model_config().vocab_size);
  blocks.free.insert(blocks.free.begin(), s.block_table.begin(), s.block_table.end());
  return r;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

TEST_CASE("cpu device: stories15M greedy from 'Once upon a time' matches the reference") {
  Subject& s = subjects()[0];
  auto dev = open_device(s.path, 16, 32);
  const std::vector<int32_t> prompt = {1, 9038, 2501, 263, 931};  // BOS "Once upon a time"
  const uint32_t new_tokens = 64;
  // Reference: dense, one token at a time.
  std::vector<int32_t> want;
  std::vector<double> logits;
  for (uint32_t i = 0; i < prompt.size(); ++i) logits = s.ref.step(prompt[i], i);
  for (uint32_t i = 0; i < new_tokens; ++i) {
    want.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    if (i + 1 < new_tokens) logits = s.ref.step(want.back(), uint32_t(prompt.size() + i));
  }
  // Device: one prefill, then paged decode steps.
  Blocks blocks(32);
  auto table = blocks.take(blocks_for(uint32_t(prompt.size()) + new_tokens, 16));
  PrefillSeq p{42, table, 0, prompt};
  auto out = dev->prefill(std::span(&p, 1));
  REQUIRE(out.ok());
  std::vector<int32_t> got{argmax(row(out->seqs[0], 0, 32000))};
  while (got.size() < new_tokens) {
    DecodeSeq d{42, table, uint32_t(prompt.size() + got.size() - 1), {got.back()}};
    auto step = dev->decode(std::span(&d, 1));
    REQUIRE(step.ok());
    CHECK(step->seqs[0].seq_id == 42);
    got.push_back(argmax(row(step->seqs[0], 0, 32000)));
  }
  CHECK(got == want);
  // ", there was a little girl named Lily."
  const std::vector<int32_t> lily = {29892, 727, 471, 263, 2217, 7826, 4257, 365, 2354, 29889};
  CHECK(std::vector<int32_t>(got.begin(), got.begin() + 10) == lily);
}

TEST_CASE("cpu device: which kernels this run uses (TANDEM_CPU_KERNELS)") {
  const char* want = std::getenv("TANDEM_CPU_KERNELS");
  std::string isa = tandem::devices::cpu::small_gemm_isa();
  std::string shown = want == nullptr ? "(unset)" : want;
  std::string path = small_kernels() ? "" : " (the portable BLAS path; row-invariance skipped)";
  MESSAGE("TANDEM_CPU_KERNELS=", shown, ": small-row kernels ", isa, path);
  if (want != nullptr && std::string(want) == "blas") CHECK(isa == "none");
  if (want != nullptr && std::string(want) == "avx2") {
    CHECK(isa == (cpu_has_avx2() ? "avx2" : "none"));
  }
  if (want == nullptr && cpu_has_avx2()) CHECK(isa != "none");
}

TEST_CASE("cpu device: select_blas_kernels() names the OpenBLAS core in use") {
  auto dev = open_device(subjects()[1].path);  // make_cpu_device selects the kernels
  std::string description = select_blas_kernels();
  CAPTURE(description);
  CHECK(description.rfind("OpenBLAS core ", 0) == 0);
  CHECK(description.find(openblas_get_corename()) != std::string::npos);
}

// Skipped (counted so) on a CPU without AVX2+FMA, or when the environment's
// OPENBLAS_CORETYPE pins the core (decided at startup, before the device sets it).
TEST_CASE("cpu device: OpenBLAS runs AVX2-or-better kernels on a CPU that has them" *
          doctest::skip(!cpu_has_avx2() || std::getenv("OPENBLAS_CORETYPE") != nullptr)) {
  auto dev = open_device(subjects()[1].path);  // make_cpu_device selects the kernels
  std::string description = select_blas_kernels();
  CAPTURE(description);
  CHECK(std::string(openblas_get_corename()) != "Prescott");
}

TEST_CASE("cpu device: synth models' shapes are what they claim (GQA, MoE, partial rotary)") {
  const ModelConfig& llama = subjects()[4].ref.c;
  CHECK(llama.heads / llama.kv_heads == 4);
  const ModelConfig& moe = subjects()[5].ref.c;
  CHECK(moe.arch == Arch::minimax_m2);
  CHECK(moe.qk_norm);
  CHECK(moe.router_bias);
  CHECK(moe.experts == 8);
  CHECK(moe.rotary_dim < moe.head_dim);
  for (size_t i : {4u, 5u}) {  // the device parses config.json to the config synth declared
    auto dev = open_device(subjects()[i].path);
    ModelConfig loaded = dev->model_config();
    loaded.weight_dtype = subjects()[i].ref.c.weight_dtype;
    CHECK(loaded == subjects()[i].ref.c);
  }
}

TEST_CASE("cpu device: a synth dir's tokenizer.json loads with runtime/text and round-trips") {
  const std::string texts[] = {"Once upon a time, there was a little girl named Lily.",
                               "def f(x):\n    return x * 2  # twice\n",
                               "  spaces\t\ttabs\n\nand \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x99\x82"};
  for (size_t i : {4u, 5u}) {
    CAPTURE(subjects()[i].name);
    auto tok = tandem::text::load_tokenizer(subjects()[i].path);
    REQUIRE_MESSAGE(tok.ok(), (tok.ok() ? "" : tok.error().describe()));
    CHECK((*tok)->vocab_size() == int32_t(subjects()[i].ref.c.vocab_size));
    CHECK((*tok)->bos_id() == std::optional<int32_t>(subjects()[i].ref.c.bos_id));
    CHECK((*tok)->eos_id() == std::optional<int32_t>(subjects()[i].ref.c.eos_id));
    for (const std::string& text : texts) {
      auto ids = (*tok)->encode(text, false);
      CHECK((*tok)->decode(ids) == text);
    }
    CHECK((*tok)->encode(texts[0], false).size() < texts[0].size());  // merges apply
  }
}

TEST_CASE("cpu device: prefill logits match the dense reference at every position") {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto dev = open_device(s.path);
    auto toks = random_tokens(s.ref.c, 17, 5);
    RefModel ref = s.ref;
    ref.kc.clear();
    ref.vc.clear();
    Blocks blocks(96);
    for (uint32_t i = 0; i < toks.size(); ++i) {
      auto want = ref.step(toks[i], i);
      auto got = prefill_last(*dev, blocks, {toks.begin(), toks.begin() + i + 1});
      CHECK(close(got, want, 2e-4));
    }
  }
}

TEST_CASE("cpu device: paged incremental decode equals a full recompute") {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto dev = open_device(s.path);
    const ModelConfig& c = dev->model_config();
    auto toks = random_tokens(c, 30, 9);
    Blocks blocks(96);
    auto table = blocks.take(blocks_for(30, 4));
    PrefillSeq p{1, table, 0, {toks.begin(), toks.begin() + 6}};
    REQUIRE(dev->prefill(std::span(&p, 1)).ok());
    for (uint32_t pos = 6; pos < toks.size(); ++pos) {
      DecodeSeq d{1, table, pos, {toks[pos]}};
      auto step = dev->decode(std::span(&d, 1));
      REQUIRE(step.ok());
      auto full = prefill_last(*dev, blocks, {toks.begin(), toks.begin() + pos + 1});
      CHECK(close(row(step->seqs[0], 0, c.vocab_size), full, 1e-4));
    }
  }
}

TEST_CASE("cpu device: chunked prefill equals one-shot prefill") {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto dev = open_device(s.path);
    const ModelConfig& c = dev->model_config();
    auto toks = random_tokens(c, 23, 21);
    Blocks blocks(96);
    auto one_shot = prefill_last(*dev, blocks, toks);
    auto table = blocks.take(blocks_for(23, 4));
    std::vector<float> last;
    uint32_t pos = 0;
    for (uint32_t chunk : {7u, 9u, 1u, 6u}) {  // boundaries fall mid-block
      PrefillSeq p{2, table, pos, {toks.begin() + pos, toks.begin() + pos + chunk}};
      auto out = dev->prefill(std::span(&p, 1));
      REQUIRE(out.ok());
      last = row(out->seqs[0], 0, c.vocab_size);
      pos += chunk;
    }
    REQUIRE(pos == toks.size());
    CHECK(close(last, one_shot, 1e-4));
  }
}

TEST_CASE("cpu device: a prefix hit inside a block, copied, continues like a full prefill") {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto dev = open_device(s.path);  // 4-token blocks
    const ModelConfig& c = dev->model_config();
    auto toks = random_tokens(c, 15, 31);
    Blocks blocks(96);
    auto one_shot = prefill_last(*dev, blocks, toks);
    // Another prompt shares the first 10 tokens (blocks 0, 1 and half of block 2) and was
    // computed into its own blocks; this one reuses blocks 0 and 1, copies block 2 into its
    // own and computes from token 10.
    auto other = toks;
    other[11] = other[11] == 3 ? 4 : 3;
    auto held = blocks.take(blocks_for(uint32_t(other.size()), 4));
    PrefillSeq first{1, held, 0, other};
    REQUIRE(dev->prefill(std::span(&first, 1)).ok());
    auto own = blocks.take(2);
    std::vector<uint32_t> table{held[0], held[1], own[0], own[1]};
    PrefillSeq next{2, table, 10, {toks.begin() + 10, toks.end()}};
    next.copies.push_back({held[2], own[0]});
    auto out = dev->prefill(std::span(&next, 1));
    REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().describe()));
    CHECK(close(row(out->seqs[0], 0, c.vocab_size), one_shot, 1e-4));
    // Without the copy the context is wrong (the fresh block holds other KV).
    PrefillSeq stale{3, {held[0], held[1], own[1], own[0]}, 10, {toks.begin() + 10, toks.end()}};
    auto wrong = dev->prefill(std::span(&stale, 1));
    REQUIRE(wrong.ok());
    CHECK_FALSE(close(row(wrong->seqs[0], 0, c.vocab_size), one_shot, 1e-4));
    // Bad copies are errors and nothing is written.
    PrefillSeq bad = next;
    bad.copies = {{own[0], own[0]}};
    CHECK_FALSE(dev->prefill(std::span(&bad, 1)).ok());
    bad.copies = {{96, own[0]}};
    auto err = dev->prefill(std::span(&bad, 1));
    REQUIRE_FALSE(err.ok());
    CHECK(err.error().message.find("block copy 96 -> ") != std::string::npos);
  }
}

TEST_CASE("cpu device: a batch of 8 mixed-length sequences equals each alone") {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto dev = open_device(s.path, 4, 128);
    const ModelConfig& c = dev->model_config();
    Blocks blocks(128);
    std::vector<PrefillSeq> batch;
    std::vector<std::vector<int32_t>> full;
    for (uint32_t i = 0; i < 8; ++i) {
      uint32_t len = 1 + (i * 5) % 13;  // 1, 6, 11, 3, 8, 13, 5, 10
      full.push_back(random_tokens(c, len + 4, 100 + i));
      batch.push_back({i, blocks.take(blocks_for(len + 4, 4)), 0,
                       {full[i].begin(), full[i].begin() + len}});
    }
    auto out = dev->prefill(batch);
    REQUIRE(out.ok());
    REQUIRE(out->seqs.size() == 8);
    // Decode batch: sequence i verifies i % 4 draft tokens in the same pass.
    std::vector<DecodeSeq> dec;
    for (uint32_t i = 0; i < 8; ++i) {
      uint32_t len = uint32_t(batch[i].tokens.size());
      CHECK(out->seqs[i].seq_id == i);
      CHECK(out->seqs[i].rows_count == 1);
      CHECK(close(row(out->seqs[i], 0, c.vocab_size), prefill_last(*dev, blocks, batch[i].tokens),
                  1e-4));
      dec.push_back({i, batch[i].block_table, len,
                     {full[i].begin() + len, full[i].begin() + len + 1 + i % 4}});
    }
    auto step = dev->decode(dec);
    REQUIRE(step.ok());
    for (uint32_t i = 0; i < 8; ++i) {
      CAPTURE(i);
      REQUIRE(step->seqs[i].rows_count == dec[i].tokens.size());
      for (uint32_t r = 0; r < step->seqs[i].rows_count; ++r) {
        auto alone = prefill_last(*dev, blocks, {full[i].begin(), full[i].begin() +
                                                     dec[i].start_pos + r + 1});
        CHECK(close(row(step->seqs[i], r, c.vocab_size), alone, 1e-4));
      }
    }
  }
}

TEST_CASE("cpu device: KV blocks copied to another device continue identically") {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto a = open_device(s.path, 4, 64);
    auto b = open_device(s.path, 4, 64);
    REQUIRE(a->kv_layout() == b->kv_layout());
    const ModelConfig& c = a->model_config();
    auto toks = random_tokens(c, 17, 77);
    Blocks blocks_a(64, 1), blocks_b(64, 2);
    auto table_a = blocks_a.take(5), table_b = blocks_b.take(5);
    PrefillSeq p{9, table_a, 0, {toks.begin(), toks.begin() + 13}};
    REQUIRE(a->prefill(std::span(&p, 1)).ok());
    uint32_t used = blocks_for(13, 4);
    std::vector<std::byte> buf(used * a->kv_layout().block_bytes());
    REQUIRE(a->copy_blocks_out(std::span(table_a).first(used), buf).ok());
    REQUIRE(b->copy_blocks_in(std::span(table_b).first(used), buf).ok());
    for (uint32_t pos = 13; pos < 17; ++pos) {
      DecodeSeq da{9, table_a, pos, {toks[pos]}}, db{9, table_b, pos, {toks[pos]}};
      auto ra = a->decode(std::span(&da, 1));
      auto rb = b->decode(std::span(&db, 1));
      REQUIRE(ra.ok());
      REQUIRE(rb.ok());
      CHECK(close(rb->seqs[0].logits, ra->seqs[0].logits, 1e-6));
    }
    // The region exposes the same bytes the copy reads.
    MemoryRegion region = a->kv_region();
    REQUIRE(region.length_bytes == a->kv_layout().pool_bytes());
    CHECK(reinterpret_cast<uintptr_t>(region.base) % 4096 == 0);
    CHECK(std::memcmp(region.base + a->kv_layout().offset_bytes(table_a[0], 0, KvPart::k),
                      buf.data(), a->kv_layout().block_bytes()) == 0);
  }
}

// Row invariance is the small kernels' promise (small_gemm.hpp), not BLAS's: skipped (and
// counted as skipped) on the portable path.
TEST_CASE(
    "cpu device: a pass of 4 sequences x 5 rows (past one 8-row block) gives each row "
    "what a one-row pass gives, bit for bit" *
    doctest::skip(!small_kernels())) {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto dev = open_device(s.path);
    const ModelConfig& c = dev->model_config();
    auto toks = random_tokens(c, 16, 47);
    Blocks blocks(96);
    constexpr uint32_t seqs = 4, rows = 5;
    std::vector<std::vector<uint32_t>> many, single;
    for (uint32_t q = 0; q < seqs; ++q) {
      many.push_back(blocks.take(4));
      single.push_back(blocks.take(4));
      for (const auto& t : {many.back(), single.back()}) {
        PrefillSeq p{q, t, 0, {toks.begin() + q, toks.begin() + q + 6}};
        REQUIRE(dev->prefill(std::span(&p, 1)).ok());
      }
    }
    std::vector<DecodeSeq> batch;
    for (uint32_t q = 0; q < seqs; ++q) {
      batch.push_back({q, many[q], 6, {toks.begin() + 6 + q, toks.begin() + 6 + q + rows}});
    }
    auto pass = dev->decode(batch);
    REQUIRE_MESSAGE(pass.ok(), pass.error().describe());
    for (uint32_t q = 0; q < seqs; ++q) {
      REQUIRE(pass->seqs[q].rows_count == rows);
      for (uint32_t i = 0; i < rows; ++i) {
        DecodeSeq one{q, single[q], 6 + i, {toks[6 + q + i]}};
        auto step = dev->decode(std::span(&one, 1));
        REQUIRE(step.ok());
        CHECK(row(pass->seqs[q], i, c.vocab_size) == step->seqs[0].logits);
      }
    }
  }
}

TEST_CASE("cpu device: verifying k draft tokens in one pass equals k single steps") {
  for (Subject& s : subjects()) {
    CAPTURE(s.name);
    auto dev = open_device(s.path);
    const ModelConfig& c = dev->model_config();
    auto toks = random_tokens(c, 16, 31);
    Blocks blocks(96);
    auto t1 = blocks.take(4), t2 = blocks.take(4);
    for (const auto& t : {t1, t2}) {
      PrefillSeq p{3, t, 0, {toks.begin(), toks.begin() + 10}};
      REQUIRE(dev->prefill(std::span(&p, 1)).ok());
    }
    const uint32_t k = 5;
    DecodeSeq multi{3, t1, 10, {toks.begin() + 10, toks.begin() + 11 + k}};
    auto one_pass = dev->decode(std::span(&multi, 1));
    REQUIRE(one_pass.ok());
    REQUIRE(one_pass->seqs[0].rows_count == k + 1);
    const bool row_invariant = small_kernels();
    for (uint32_t i = 0; i <= k; ++i) {
      DecodeSeq single{3, t2, 10 + i, {toks[10 + i]}};
      auto step = dev->decode(std::span(&single, 1));
      REQUIRE(step.ok());
      CHECK(close(row(one_pass->seqs[0], i, c.vocab_size), step->seqs[0].logits, 1e-4));
      // Up to 8 rows the small kernels compute a row the same way whatever the pass holds:
      // bit-identical logits, so greedy with speculation is exactly greedy without.
      if (row_invariant) CHECK(row(one_pass->seqs[0], i, c.vocab_size) == step->seqs[0].logits);
    }
    // argmax_only: the same pass returns each row's argmax instead of its logits.
    DecodeSeq again{3, t1, 10, {toks.begin() + 10, toks.begin() + 11 + k}, true};
    auto argmax = dev->decode(std::span(&again, 1));
    REQUIRE(argmax.ok());
    REQUIRE(argmax->seqs[0].rows_count == k + 1);
    CHECK(argmax->seqs[0].logits.empty());
    REQUIRE(argmax->seqs[0].tokens.size() == k + 1);
    for (uint32_t i = 0; i <= k; ++i) {
      auto r = row(one_pass->seqs[0], i, c.vocab_size);
      auto best = static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin());
      CHECK(argmax->seqs[0].tokens[i] == best);
    }
    CHECK(argmax->seqs[0].scored.empty());
    // With logprobs: each row scored beside the device exactly as the host's greedy sampler
    // scores it from the full row (Sampler::score), so the logits never cross the seam.
    // The inputs after the first are the rows' own argmaxes (all drafts accepted), so every
    // row is emitted and scored; with a wrong draft, scoring stops at the row it fails.
    std::vector<int32_t> accepted_run{toks[10]};
    while (accepted_run.size() < k + 1) {  // greedy continuation, one pass per token
      DecodeSeq grow{3, t2, 10, accepted_run, true};
      auto g = dev->decode(std::span(&grow, 1));
      REQUIRE(g.ok());
      accepted_run.push_back(g->seqs[0].tokens.back());
    }
    DecodeSeq verify{3, t2, 10, accepted_run};
    auto full = dev->decode(std::span(&verify, 1));
    REQUIRE(full.ok());
    DecodeSeq scored{3, t2, 10, accepted_run, true, 5};
    auto with_logprobs = dev->decode(std::span(&scored, 1));
    REQUIRE(with_logprobs.ok());
    CHECK(with_logprobs->seqs[0].logits.empty());
    REQUIRE(with_logprobs->seqs[0].scored.size() == k + 1);
    DecodeSeq wrong = scored;
    wrong.tokens[2] = (wrong.tokens[2] + 1) % int32_t(c.vocab_size);  // row 1's draft misses
    auto cut = dev->decode(std::span(&wrong, 1));
    REQUIRE(cut.ok());
    CHECK(cut->seqs[0].scored.size() == 2);
    tandem::devices::SamplingParams greedy;
    greedy.temperature = 0.0f;
    greedy.logprobs = true;
    greedy.logprobs_top_n = 5;
    tandem::devices::Sampler host(greedy);
    for (uint32_t i = 0; i <= k; ++i) {
      auto r = row(full->seqs[0], i, c.vocab_size);
      auto want = host.score(r, {}, with_logprobs->seqs[0].tokens[i]);
      REQUIRE(want.ok());
      const auto& got = with_logprobs->seqs[0].scored[i];
      CHECK(got.token == with_logprobs->seqs[0].tokens[i]);
      CHECK(got.logprob == want->logprob);
      CHECK(got.logprob <= 0.0f);
      REQUIRE(got.top.size() == 5);
      CHECK(got.top == want->top);
      CHECK(got.top[0].token == got.token);
    }
  }
}

namespace {
tandem::Error load_error(const std::string& path) {
  DeviceSpec spec;
  spec.model_path = path;
  spec.blocks_total = 8;
  auto dev = make_device(spec);
  REQUIRE_FALSE(dev.ok());
  MESSAGE(dev.error().describe());
  return dev.error();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("cpu device: bad model files give clear errors") {
  std::string dir = temp_dir("bad");
  using tandem::ErrorKind;
  CHECK(load_error(dir + "/nope.bin").kind == ErrorKind::not_found);
  CHECK(load_error(dir + "/empty-dir-without-config").kind == ErrorKind::not_found);

  std::string stories = read_bytes(stories_dir() + "/stories15M.bin");
  REQUIRE(stories.size() == 60816028u);
  write_bytes(dir + "/truncated.bin", stories.substr(0, stories.size() / 2));
  auto e = load_error(dir + "/truncated.bin");
  CHECK(e.kind == ErrorKind::invalid);
  CHECK(e.message.find("truncated") != std::string::npos);
  write_bytes(dir + "/tiny.bin", "abc");
  CHECK(load_error(dir + "/tiny.bin").kind == ErrorKind::invalid);
  std::string garbage = stories.substr(0, 4096);
  for (size_t i = 0; i < 28; ++i) garbage[i] = char(0xff);  // negative sizes
  write_bytes(dir + "/garbage.bin", garbage);
  CHECK(load_error(dir + "/garbage.bin").message.find("header") != std::string::npos);

  // HF directories built from a valid random model, then broken one way each.
  ModelConfig c = gqa_config();
  auto tensors = reftest::random_tensors(c, 5, false);
  auto hf = [&](const std::string& name) {
    std::string d = dir + "/" + name;
    reftest::write_hf_dir(d, c, tensors);
    return d;
  };
  std::string d = hf("unknown-arch");
  auto cfg = reftest::hf_config_json(c);
  cfg["model_type"] = "mamba";
  std::ofstream(d + "/config.json") << cfg.dump();
  e = load_error(d);
  CHECK(e.kind == ErrorKind::unimplemented);
  CHECK(e.message.find("mamba") != std::string::npos);

  d = hf("bad-json");
  std::ofstream(d + "/config.json") << "{ not json";
  CHECK(load_error(d).kind == ErrorKind::invalid);

  d = hf("missing-key");
  cfg = reftest::hf_config_json(c);
  cfg.erase("hidden_size");
  std::ofstream(d + "/config.json") << cfg.dump();
  CHECK(load_error(d).message.find("hidden_size") != std::string::npos);

  d = hf("truncated-st");
  std::string st = read_bytes(d + "/model.safetensors");
  write_bytes(d + "/model.safetensors", st.substr(0, st.size() - 100));
  e = load_error(d);
  CHECK(e.kind == ErrorKind::invalid);
  CHECK(e.message.find("outside") != std::string::npos);

  d = hf("bad-header-len");
  st = read_bytes(d + "/model.safetensors");
  st[7] = char(0x7f);  // header length far beyond the file
  write_bytes(d + "/model.safetensors", st);
  CHECK(load_error(d).message.find("header length") != std::string::npos);

  d = hf("missing-tensor");
  auto fewer = tensors;
  fewer.erase("model.layers.1.mlp.up_proj.weight");
  reftest::write_safetensors(d + "/model.safetensors", c, fewer);
  CHECK(load_error(d).message.find("model.layers.1.mlp.up_proj.weight") != std::string::npos);

  d = hf("bad-dtype");
  st = read_bytes(d + "/model.safetensors");
  auto pos = st.find("\"F32\"");
  REQUIRE(pos != std::string::npos);
  st.replace(pos, 5, "\"I32\"");
  write_bytes(d + "/model.safetensors", st);
  e = load_error(d);
  CHECK(e.kind == ErrorKind::unimplemented);
  CHECK(e.message.find("I32") != std::string::npos);
}

TEST_CASE("cpu device: BF16 safetensors load to the same model as F32") {
  ModelConfig c = minimax_config();
  auto tensors = reftest::random_tensors(c, 17, true);
  for (auto& [name, v] : tensors) {  // make every value exactly representable in bf16
    for (auto& x : v) {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      b &= 0xffff0000u;
      std::memcpy(&x, &b, 4);
    }
  }
  std::string d32 = temp_dir("f32"), d16 = temp_dir("bf16");
  reftest::write_hf_dir(d32, c, tensors, false);
  reftest::write_hf_dir(d16, c, tensors, true);
  auto a = open_device(d32), b = open_device(d16);
  CHECK(b->model_config().weight_dtype == DType::bf16);
  auto toks = random_tokens(c, 9, 1);
  Blocks ba(96), bb(96);
  CHECK(close(prefill_last(*b, bb, toks), prefill_last(*a, ba, toks), 0.0));
}

TEST_CASE("cpu device: invalid batches are errors, not crashes") {
  auto dev = open_device(subjects()[1].path, 4, 16);
  using tandem::ErrorKind;
  std::vector<PrefillSeq> none;
  CHECK(dev->prefill(none).error().kind == ErrorKind::invalid);
  std::vector<DecodeSeq> none_d;
  CHECK(dev->decode(none_d).error().kind == ErrorKind::invalid);
  auto bad = [&](PrefillSeq s, const std::string& needle) {
    auto r = dev->prefill(std::span(&s, 1));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().kind == ErrorKind::invalid);
    CHECK_MESSAGE(r.error().message.find(needle) != std::string::npos, r.error().message);
  };
  bad({1, {0, 1}, 0, {}}, "no tokens");
  bad({1, {0, 1}, 0, {1, 2, 61}}, "token id 61");
  bad({1, {0, 1}, 0, {1, -1}}, "token id -1");
  bad({1, {0, 16}, 0, {1, 2, 3, 4, 5}}, "block id 16");
  bad({1, {0}, 0, {1, 2, 3, 4, 5}}, "block table");
  std::vector<uint32_t> many(30);
  std::iota(many.begin(), many.end(), 0u);
  for (auto& b : many) b %= 16;
  bad({1, many, 95, {1, 2}}, "max_position");
  std::vector<std::byte> buf(dev->kv_layout().block_bytes());
  std::vector<uint32_t> one{3}, oob{16}, two{1, 2};
  CHECK(dev->copy_blocks_out(one, buf).ok());
  CHECK(dev->copy_blocks_out(oob, buf).error().kind == ErrorKind::invalid);
  CHECK(dev->copy_blocks_in(two, buf).error().kind == ErrorKind::invalid);
}
