// The rbln Device backend (devices/rbln/rbln_device.hpp) on the conformance fake, whose graphs
// are computed by the cpu transformer: greedy tokens equal the cpu device's at every batch size
// 1..8 (bucket padding) and across prefill chunks; the compiled directory checked against the
// manifest (each mismatch naming both values); and every error path (missing library or symbol,
// missing graph, a failing run with its message, a run that never completes, drafts) an error,
// never a crash.
#include <dlfcn.h>
#include <doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "devices/cpu/cpu_device.hpp"
#include "devices/device.hpp"
#include "devices/rbln/rbln_api.hpp"
#include "devices/rbln/rbln_artifact.hpp"
#include "tests/support/fake_rbln_artifact.hpp"

using namespace tandem;
using namespace tandem::devices;
namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name, " is not set (meson sets it)");
  return v;
}

std::string model_path() {
  return env("TANDEM_SOURCE_ROOT") + "/models/stories15M/stories15M.bin";
}

fs::path scratch(const std::string& tag) {
  auto dir =
      fs::temp_directory_path() / ("tandem-rbln-dev-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

testing::FakeRblnArtifact artifact() {
  testing::FakeRblnArtifact a;
  a.model_path = model_path();
  return a;
}

// The step timeout of the tests whose graph hangs: long enough that the runs before the hung
// one complete in time under ASan on two loaded cores (a 64-token chunk took over 200 ms there,
// and the wrong run timed out first), short enough to wait for.
constexpr uint32_t kHangTimeoutMs = 2000;

DeviceSpec rbln_spec(const std::string& dir, const std::string& library = "") {
  DeviceSpec spec;
  spec.kind = config::DeviceKind::rbln;
  spec.block_tokens = 16;
  spec.blocks_total = 128;
  spec.rbln.library = library.empty() ? env("RBLN_FAKE_LIB") : library;
  spec.rbln.artifacts = dir;
  spec.rbln.model_name = "stories15M";
  spec.rbln.max_model_tokens = 256;
  spec.rbln.decode_seqs_max = 8;
  spec.rbln.run_timeout_ms = 20000;
  return spec;
}

DeviceSpec device_kv_spec(const std::string& dir, const std::string& library = "") {
  DeviceSpec spec = rbln_spec(dir, library);
  spec.rbln.kv_on_device = true;
  return spec;
}

DeviceSpec cpu_spec() {
  DeviceSpec spec;
  spec.kind = config::DeviceKind::cpu;
  spec.model_path = model_path();
  spec.block_tokens = 16;
  spec.blocks_total = 128;
  spec.threads = 1;
  return spec;
}

int32_t argmax(const std::vector<float>& row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

// Greedy generation of `steps` tokens for every prompt together (one prefill pass, then one
// decode pass per step with every sequence), blocks handed out in order.
std::vector<std::vector<int32_t>> generate(Device& device,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           uint32_t steps) {
  const uint32_t bt = device.kv_layout().block_tokens;
  std::vector<std::vector<uint32_t>> tables(prompts.size());
  uint32_t next_block = 0;
  std::vector<PrefillSeq> pre;
  for (size_t i = 0; i < prompts.size(); ++i) {
    uint32_t need = (static_cast<uint32_t>(prompts[i].size()) + steps + bt - 1) / bt;
    for (uint32_t b = 0; b < need; ++b) tables[i].push_back(next_block++);
    pre.push_back({i, tables[i], 0, prompts[i], {}});
  }
  REQUIRE(next_block <= device.kv_layout().blocks_total);
  auto first = device.prefill(pre);
  REQUIRE_MESSAGE(first.ok(), first.error().describe());
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) out[i].push_back(argmax(first->seqs[i].logits));
  for (uint32_t s = 1; s < steps; ++s) {
    std::vector<DecodeSeq> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      DecodeSeq d;
      d.seq_id = i;
      d.block_table = tables[i];
      d.start_pos = static_cast<uint32_t>(prompts[i].size()) + s - 1;
      d.tokens = {out[i].back()};
      batch.push_back(std::move(d));
    }
    auto step = device.decode(batch);
    REQUIRE_MESSAGE(step.ok(), step.error().describe());
    REQUIRE(step->seqs.size() == prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      CHECK(step->seqs[i].seq_id == i);
      REQUIRE(step->seqs[i].rows_count == 1);
      out[i].push_back(argmax(step->seqs[i].logits));
    }
  }
  return out;
}

std::vector<int32_t> prompt(uint32_t seed, size_t length) {
  std::vector<int32_t> p{1};
  for (size_t i = 1; i < length; ++i)
    p.push_back(static_cast<int32_t>(100 + (seed * 131 + i * 17) % 3000));
  return p;
}

}  // namespace

TEST_CASE("rbln device: greedy tokens equal the cpu device's at every batch size 1..8") {
  auto dir = testing::write_fake_rbln_artifact(scratch("greedy"), artifact());
  auto rbln = make_device(rbln_spec(dir));
  REQUIRE_MESSAGE(rbln.ok(), rbln.error().describe());
  auto cpu = make_device(cpu_spec());
  REQUIRE(cpu.ok());
  CHECK((*rbln)->model_config().vocab_size == (*cpu)->model_config().vocab_size);
  CHECK((*rbln)->kv_layout() == (*cpu)->kv_layout());
  for (uint32_t n = 1; n <= 8; ++n) {
    std::vector<std::vector<int32_t>> prompts;
    for (uint32_t i = 0; i < n; ++i) prompt(n * 10 + i, 5 + 3 * i).swap(prompts.emplace_back());
    auto a = generate(**rbln, prompts, 12);
    auto b = generate(**cpu, prompts, 12);
    CHECK_MESSAGE(a == b, "batch of ", n);
  }
}

TEST_CASE("rbln device: a prompt longer than the prefill chunk runs in chunks, same tokens") {
  auto dir = testing::write_fake_rbln_artifact(scratch("chunks"), artifact());
  auto rbln = make_device(rbln_spec(dir));
  REQUIRE_MESSAGE(rbln.ok(), rbln.error().describe());
  auto cpu = make_device(cpu_spec());
  REQUIRE(cpu.ok());
  std::vector<std::vector<int32_t>> prompts{prompt(7, 150), prompt(8, 64), prompt(9, 65)};
  CHECK(generate(**rbln, prompts, 8) == generate(**cpu, prompts, 8));
}

TEST_CASE("rbln device: the compiled directory is checked against the manifest") {
  auto dir = testing::write_fake_rbln_artifact(scratch("check"), artifact());
  auto expect_error = [](const DeviceSpec& spec, const std::string& text) {
    auto d = make_device(spec);
    REQUIRE_FALSE(d.ok());
    CHECK_MESSAGE(d.error().message.find(text) != std::string::npos, d.error().message);
  };
  DeviceSpec s = rbln_spec(dir);
  s.block_tokens = 32;
  expect_error(s, "kvcache_block_size 16, manifest [model] block_tokens 32");
  s = rbln_spec(dir);
  s.rbln.max_model_tokens = 512;
  expect_error(s, "max_seq_len 256, manifest [model] max_model_tokens 512");
  s = rbln_spec(dir);
  s.rbln.device_ids = {0, 1};
  expect_error(s, "tensor_parallel_size 1, manifest instance devices count 2");
  s = rbln_spec(dir);
  s.rbln.decode_seqs_max = 16;
  expect_error(s, "largest decoder_batch_sizes bucket 8, manifest [decode] seqs_max 16");
  s = rbln_spec(dir);
  s.blocks_total = 129;
  expect_error(s, "kvcache_num_blocks 129, manifest executor kv_blocks 129");
  s = rbln_spec(dir);
  s.rbln.model_name = "other";
  expect_error(s, "model_name 'stories15M', manifest [model] name 'other'");
  s.rbln.served_names = {"stories15M"};
  CHECK(make_device(s).ok());  // a served name matches too

  fs::remove(fs::path(dir) / "decoder_batch_4.rbln");
  expect_error(rbln_spec(dir), "compiled graph " + dir + "/decoder_batch_4.rbln is missing");
  expect_error(rbln_spec("/nonexistent/compiled"), "no compiled model directory at /nonexistent");

  auto bad = artifact();
  bad.prefill_chunk = 100;
  expect_error(rbln_spec(testing::write_fake_rbln_artifact(scratch("chunk"), bad)),
               "prefill_chunk_size 100 is not a multiple of 64");
  bad = artifact();
  bad.buckets = {4, 2};
  expect_error(rbln_spec(testing::write_fake_rbln_artifact(scratch("order"), bad)),
               "decoder_batch_sizes must ascend, 2 follows 4");
}

TEST_CASE("rbln device: a missing library or symbol, a failing run, a run that never completes") {
  auto dir = testing::write_fake_rbln_artifact(scratch("errors"), artifact());
  auto no_lib = make_device(rbln_spec(dir, "/nonexistent/librbln_runtime.so"));
  REQUIRE_FALSE(no_lib.ok());
  CHECK(no_lib.error().message.find("cannot load /nonexistent/librbln_runtime.so") == 0);
  auto no_sym = make_device(rbln_spec(dir, env("RBLN_FAKE_LIB_NO_WAIT")));
  REQUIRE_FALSE(no_sym.ok());
  CHECK(no_sym.error().message.find("has no symbol rbln_async_wait") != std::string::npos);

  auto failing = artifact();
  failing.extra = {{"fake_fail_graph", "decoder_batch_2"}};
  auto fdir = testing::write_fake_rbln_artifact(scratch("fail"), failing);
  auto device = make_device(rbln_spec(fdir));
  REQUIRE_MESSAGE(device.ok(), device.error().describe());
  std::vector<PrefillSeq> pre{{1, {0}, 0, {1, 200, 300}, {}}, {2, {1}, 0, {1, 201}, {}}};
  REQUIRE((*device)->prefill(pre).ok());
  std::vector<DecodeSeq> dec(2);
  dec[0] = {1, {0}, 3, {400}};
  dec[1] = {2, {1}, 2, {401}};
  auto failed = (*device)->decode(dec);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().kind == ErrorKind::failed);
  CHECK_MESSAGE(failed.error().message.find("decoder_batch_2 (2 rows)") != std::string::npos,
                failed.error().message);
  CHECK(failed.error().message.find("the device failed the run (fake_fail_graph)") !=
        std::string::npos);
  // The device is still usable: a one-row step uses another graph.
  auto one = (*device)->decode(std::span<const DecodeSeq>(dec.data(), 1));
  CHECK_MESSAGE(one.ok(), one.error().describe());

  auto hanging = artifact();
  hanging.extra = {{"fake_hang_graph", "decoder_batch_1"}};
  auto hdir = testing::write_fake_rbln_artifact(scratch("hang"), hanging);
  DeviceSpec hs = rbln_spec(hdir);
  hs.rbln.run_timeout_ms = kHangTimeoutMs;
  auto hung = make_device(hs);
  REQUIRE(hung.ok());
  REQUIRE((*hung)->prefill(std::span<const PrefillSeq>(pre.data(), 1)).ok());
  auto timed = (*hung)->decode(std::span<const DecodeSeq>(dec.data(), 1));
  REQUIRE_FALSE(timed.ok());
  CHECK(timed.error().kind == ErrorKind::timed_out);
  CHECK(timed.error().message.find("did not complete within 2000 ms") != std::string::npos);
  // Poisoned: the runtime may still write what it was given; no more runs.
  auto after = (*hung)->prefill(std::span<const PrefillSeq>(pre.data(), 1));
  REQUIRE_FALSE(after.ok());
  CHECK(after.error().message.find("decoder_batch_1 (1 rows) run") != std::string::npos);
  CHECK(after.error().message.find("takes no more runs") != std::string::npos);
}

TEST_CASE("rbln device: drafts, bad tokens and block ids are refused before any run") {
  auto dir = testing::write_fake_rbln_artifact(scratch("refuse"), artifact());
  auto device = make_device(rbln_spec(dir));
  REQUIRE(device.ok());
  std::vector<DecodeSeq> dec(1);
  dec[0] = {1, {0}, 3, {400, 401}};
  auto drafts = (*device)->decode(dec);
  REQUIRE_FALSE(drafts.ok());
  CHECK_MESSAGE(drafts.error().message.find("has 2 tokens; the artifact has no verify graphs") !=
                    std::string::npos,
                drafts.error().message);
  dec[0] = {1, {128}, 3, {400}};
  auto block = (*device)->decode(dec);
  REQUIRE_FALSE(block.ok());
  CHECK(block.error().message.find("block id 128 >= blocks_total 128") != std::string::npos);
  dec[0] = {1, {0}, 3, {40000}};
  auto token = (*device)->decode(dec);
  REQUIRE_FALSE(token.ok());
  CHECK(token.error().message.find("token id 40000 outside [0, 32000)") != std::string::npos);
  std::vector<PrefillSeq> pre{{1, {0}, 250, std::vector<int32_t>(10, 5), {}}};
  auto long_prompt = (*device)->prefill(pre);
  REQUIRE_FALSE(long_prompt.ok());
  CHECK(long_prompt.error().message.find("exceed max_position 256") != std::string::npos);
}

namespace {

// Greedy generation with speculative verification: each step, sequence i proposes up to
// `drafts_max` drafts, the next tokens of `reference` (its greedy continuation) with the one at
// (step + i) % (drafts_max + 1) replaced by a wrong token, and a draft count of
// (step + 2i) % (drafts_max + 1) (0: a plain row in the verify graph's batch, or the decode graph
// when the whole step has none). A draft is accepted while it equals the argmax of the row before
// it; the row after the last accepted one gives the bonus token. Returns each sequence's tokens
// and counts the accepted drafts.
std::vector<std::vector<int32_t>> speculate(Device& device,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<std::vector<int32_t>>& reference,
                                            uint32_t drafts_max, size_t& accepted) {
  const uint32_t bt = device.kv_layout().block_tokens;
  const uint32_t steps = static_cast<uint32_t>(reference[0].size());
  std::vector<std::vector<uint32_t>> tables(prompts.size());
  uint32_t next_block = 0;
  std::vector<PrefillSeq> pre;
  for (size_t i = 0; i < prompts.size(); ++i) {
    uint32_t need = (static_cast<uint32_t>(prompts[i].size()) + steps + drafts_max + bt) / bt;
    for (uint32_t b = 0; b < need; ++b) tables[i].push_back(next_block++);
    pre.push_back({i, tables[i], 0, prompts[i], {}});
  }
  REQUIRE(next_block <= device.kv_layout().blocks_total);
  auto first = device.prefill(pre);
  REQUIRE_MESSAGE(first.ok(), first.error().describe());
  const uint32_t vocab = device.model_config().vocab_size;
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) out[i].push_back(argmax(first->seqs[i].logits));
  for (uint32_t step = 0;; ++step) {
    std::vector<DecodeSeq> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t have = out[i].size();
      if (have >= steps) continue;
      DecodeSeq d;
      d.seq_id = i;
      d.block_table = tables[i];
      d.start_pos = static_cast<uint32_t>(prompts[i].size() + have - 1);
      d.tokens = {out[i].back()};
      const size_t count = (step + 2 * i) % (drafts_max + 1);
      for (size_t k = 0; k < count && have + k < steps; ++k) {
        int32_t t = reference[i][have + k];
        if (k == (step + i) % (drafts_max + 1)) t = (t + 1) % static_cast<int32_t>(vocab);
        d.tokens.push_back(t);
      }
      batch.push_back(std::move(d));
    }
    if (batch.empty()) break;
    auto pass = device.decode(batch);
    REQUIRE_MESSAGE(pass.ok(), pass.error().describe());
    REQUIRE(pass->seqs.size() == batch.size());
    for (size_t b = 0; b < batch.size(); ++b) {
      const SeqOutput& so = pass->seqs[b];
      const DecodeSeq& d = batch[b];
      REQUIRE(so.seq_id == d.seq_id);
      REQUIRE(so.rows_count == d.tokens.size());
      REQUIRE(so.logits.size() == size_t{so.rows_count} * vocab);
      auto& seq = out[d.seq_id];
      for (uint32_t row = 0; row < so.rows_count && seq.size() < steps; ++row) {
        std::vector<float> r(so.logits.begin() + size_t{row} * vocab,
                             so.logits.begin() + size_t{row + 1} * vocab);
        const int32_t want = argmax(r);
        seq.push_back(want);
        if (row + 1 >= d.tokens.size() || d.tokens[row + 1] != want) break;
        ++accepted;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE(
    "rbln device: speculative verification through the verify graphs gives the cpu device's "
    "greedy tokens at every batch size 1..8, one graph set and data parallel over two ranks") {
  auto cpu = make_device(cpu_spec());
  REQUIRE(cpu.ok());
  auto spec_artifact = artifact();
  spec_artifact.verify_tokens = 5;  // [speculative] draft_tokens_max 4
  auto dir = testing::write_fake_rbln_artifact(scratch("verify"), spec_artifact);
  DeviceSpec one = rbln_spec(dir);
  one.rbln.draft_tokens_max = 4;
  auto rbln = make_device(one);
  REQUIRE_MESSAGE(rbln.ok(), rbln.error().describe());
  spec_artifact.ranks = 2;
  auto dp_dir = testing::write_fake_rbln_artifact(scratch("verify-dp"), spec_artifact);
  DeviceSpec two = device_kv_spec(dp_dir);
  two.rbln.device_ids = {0, 1};
  two.rbln.draft_tokens_max = 4;
  auto dp = make_device(two);
  REQUIRE_MESSAGE(dp.ok(), dp.error().describe());
  for (uint32_t n = 1; n <= 8; ++n) {
    std::vector<std::vector<int32_t>> prompts;
    for (uint32_t i = 0; i < n; ++i) prompt(n * 7 + i, 4 + 5 * i).swap(prompts.emplace_back());
    auto greedy = generate(**cpu, prompts, 14);
    size_t accepted = 0, accepted_dp = 0, accepted_cpu = 0;
    CHECK_MESSAGE(speculate(**rbln, prompts, greedy, 4, accepted) == greedy, "batch of ", n);
    CHECK_MESSAGE(speculate(**dp, prompts, greedy, 4, accepted_dp) == greedy, "DP2, batch of ", n);
    // The same drafts on the cpu device accept the same number: every row's argmax agrees.
    speculate(**cpu, prompts, greedy, 4, accepted_cpu);
    CHECK(accepted == accepted_cpu);
    CHECK(accepted_dp == accepted_cpu);
    CHECK(accepted > 0);
  }
}

TEST_CASE("rbln device: verify graphs are checked against [speculative] and refuse longer rows") {
  auto expect_error = [](const DeviceSpec& spec, const std::string& text) {
    auto d = make_device(spec);
    REQUIRE_FALSE(d.ok());
    CHECK_MESSAGE(d.error().message.find(text) != std::string::npos, d.error().message);
  };
  auto plain = testing::write_fake_rbln_artifact(scratch("verify-none"), artifact());
  DeviceSpec s = rbln_spec(plain);
  s.rbln.draft_tokens_max = 4;
  expect_error(s,
               "no verify graphs (verify_tokens absent), manifest [speculative] "
               "draft_tokens_max 4 (a verify step takes the last token and up to that many "
               "drafts per sequence, 5 tokens)");
  auto short_rows = artifact();
  short_rows.verify_tokens = 3;
  auto dir = testing::write_fake_rbln_artifact(scratch("verify-3"), short_rows);
  s = rbln_spec(dir);
  s.rbln.draft_tokens_max = 4;
  expect_error(s, "verify_tokens 3, manifest [speculative] draft_tokens_max 4");
  s.rbln.draft_tokens_max = 2;
  auto device = make_device(s);
  REQUIRE_MESSAGE(device.ok(), device.error().describe());
  std::vector<PrefillSeq> pre{{1, {0}, 0, {1, 200, 300}, {}}};
  REQUIRE((*device)->prefill(pre).ok());
  std::vector<DecodeSeq> dec{{1, {0}, 3, {400, 401, 402, 403}}};
  auto long_row = (*device)->decode(dec);
  REQUIRE_FALSE(long_row.ok());
  CHECK(long_row.error().kind == ErrorKind::invalid);
  CHECK_MESSAGE(long_row.error().message.find("has 4 tokens; the artifact's verify graphs take 3 "
                                              "per sequence") != std::string::npos,
                long_row.error().message);
  dec[0].tokens.pop_back();
  auto fits = (*device)->decode(dec);
  REQUIRE_MESSAGE(fits.ok(), fits.error().describe());
  CHECK(fits->seqs[0].rows_count == 3);

  fs::remove(fs::path(dir) / "verify_batch_2.rbln");
  expect_error(rbln_spec(dir), "compiled graph " + dir + "/verify_batch_2.rbln is missing");
  auto bad = artifact();
  bad.extra = {{"verify_tokens", 1}};
  expect_error(rbln_spec(testing::write_fake_rbln_artifact(scratch("verify-1"), bad)),
               "key 'verify_tokens' must be an integer >= 2, got 1");
  // The config alone: too many verify tokens, and verify graphs in a prefill-only pipeline.
  auto config = nlohmann::json::parse(std::ifstream(fs::path(dir) / "rbln_config.json"));
  config["verify_tokens"] = 65;
  auto many = rbln::parse_artifact_config(config.dump(), "d");
  REQUIRE_FALSE(many.ok());
  CHECK_MESSAGE(many.error().message == "d/rbln_config.json: verify_tokens 65 exceeds 64",
                many.error().message);
  config["verify_tokens"] = 5;
  auto round_trip = rbln::parse_artifact_config(config.dump(), "d");
  REQUIRE_MESSAGE(round_trip.ok(), round_trip.error().describe());
  CHECK(round_trip->verify_tokens == 5);
  CHECK(round_trip->verify_graph(2) == "d/verify_batch_2.rbln");
  config.erase("decoder_batch_sizes");
  config["pipeline_parallel_size"] = 2;
  auto staged = rbln::parse_artifact_config(config.dump(), "d");
  REQUIRE_FALSE(staged.ok());
  CHECK_MESSAGE(
      staged.error().message.find("pipeline_parallel_size 2 with verify_tokens: a "
                                  "pipelined artifact is prefill-only") != std::string::npos,
      staged.error().message);

  // A verify graph that fails: its run's error names it, and the decode graphs still run.
  auto failing = artifact();
  failing.verify_tokens = 3;
  failing.extra = {{"fake_fail_graph", "verify_batch_1"}};
  auto fdir = testing::write_fake_rbln_artifact(scratch("verify-fail"), failing);
  auto f = make_device(rbln_spec(fdir));
  REQUIRE(f.ok());
  REQUIRE((*f)->prefill(pre).ok());
  auto failed = (*f)->decode(dec);
  REQUIRE_FALSE(failed.ok());
  CHECK_MESSAGE(failed.error().message.find("verify_batch_1 (1 rows)") != std::string::npos,
                failed.error().message);
  dec[0].tokens = {400};
  CHECK((*f)->decode(dec).ok());
}

TEST_CASE("rbln device, KV in device memory: same tokens as cpu; the host pool is its copy") {
  auto dir = testing::write_fake_rbln_artifact(scratch("devkv"), artifact());
  auto rbln = make_device(device_kv_spec(dir));
  REQUIRE_MESSAGE(rbln.ok(), rbln.error().describe());
  auto cpu = make_device(cpu_spec());
  REQUIRE(cpu.ok());
  std::vector<std::vector<int32_t>> prompts{prompt(7, 150), prompt(8, 5), prompt(9, 33)};
  CHECK(generate(**rbln, prompts, 10) == generate(**cpu, prompts, 10));
  // Every byte prefill and decode wrote reached the host pool (write-through), so it equals the
  // pool of an rbln device whose graphs wrote the host pool directly.
  auto host_kv = make_device(rbln_spec(dir));
  REQUIRE(host_kv.ok());
  generate(**host_kv, prompts, 10);
  const KvLayout& layout = (*rbln)->kv_layout();
  const uint64_t used = 16 * layout.block_bytes();  // the blocks generate() handed out
  std::byte* staged = (*rbln)->kv_region().base;
  std::byte* direct = (*host_kv)->kv_region().base;
  CHECK(std::memcmp(staged, direct, used) == 0);
  CHECK(std::count(staged, staged + used, std::byte{0}) < static_cast<std::ptrdiff_t>(used / 2));
  std::vector<std::byte> out(2 * layout.block_bytes());
  std::vector<uint32_t> blocks{3, 12};
  REQUIRE((*rbln)->copy_blocks_out(blocks, out).ok());
  CHECK(std::memcmp(out.data(), direct + 3 * layout.block_bytes(), layout.block_bytes()) == 0);
  CHECK(std::memcmp(out.data() + layout.block_bytes(), direct + 12 * layout.block_bytes(),
                    layout.block_bytes()) == 0);

  // A pool nobody reads by RMA (a decode-only executor) is not staged back after passes: the
  // host pool stays as it was, the tokens are the same, and copy_blocks_out still reads the
  // device's bytes.
  DeviceSpec quiet = device_kv_spec(dir);
  quiet.rbln.pool_read_remotely = false;
  auto unstaged = make_device(quiet);
  REQUIRE(unstaged.ok());
  CHECK(generate(**unstaged, prompts, 10) == generate(**cpu, prompts, 10));
  std::byte* untouched = (*unstaged)->kv_region().base;
  CHECK(std::count(untouched, untouched + used, std::byte{0}) == static_cast<std::ptrdiff_t>(used));
  REQUIRE((*unstaged)->copy_blocks_out(blocks, out).ok());
  CHECK(std::memcmp(out.data(), direct + 3 * layout.block_bytes(), layout.block_bytes()) == 0);
}

TEST_CASE("rbln device, KV in device memory: blocks written into the host pool are imported") {
  auto dir = testing::write_fake_rbln_artifact(scratch("import"), artifact());
  auto prefill = make_device(device_kv_spec(dir));
  auto decode = make_device(device_kv_spec(dir));
  REQUIRE((prefill.ok() && decode.ok()));
  auto cpu = make_device(cpu_spec());
  REQUIRE(cpu.ok());
  const std::vector<int32_t> p = prompt(3, 40);  // 3 blocks of 16
  std::vector<PrefillSeq> pre{{1, {4, 5, 6}, 0, p, {}}};
  auto first = (*prefill)->prefill(pre);
  REQUIRE(first.ok());
  auto reference = (*cpu)->prefill(pre);
  REQUIRE(reference.ok());
  // The P/D pull: prefill's host pool blocks 4..6 land in decode's blocks 20..22 by RMA.
  const uint64_t bb = (*prefill)->kv_layout().block_bytes();
  for (uint32_t i = 0; i < 3; ++i) {
    std::memcpy((*decode)->kv_region().base + (20 + i) * bb,
                (*prefill)->kv_region().base + (4 + i) * bb, bb);
  }
  DecodeSeq d;
  d.seq_id = 1;
  d.block_table = {20, 21, 22};
  d.start_pos = 40;
  d.tokens = {argmax(first->seqs[0].logits)};
  std::vector<DecodeSeq> cpu_batch{d};
  cpu_batch[0].block_table = {4, 5, 6};
  auto want = (*cpu)->decode(cpu_batch);
  REQUIRE(want.ok());
  // Not imported: the device computes on its own (0xA5) bytes, and the row differs.
  std::vector<DecodeSeq> batch{d};
  auto stale = (*decode)->decode(batch);
  REQUIRE(stale.ok());
  CHECK(stale->seqs[0].logits != want->seqs[0].logits);
  batch[0].imported = {20, 21, 22};
  auto fresh = (*decode)->decode(batch);
  REQUIRE(fresh.ok());
  CHECK(fresh->seqs[0].logits == want->seqs[0].logits);

  batch[0].imported = {128};
  auto bad = (*decode)->decode(batch);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("imports block 128 >= blocks_total 128") != std::string::npos);
}

TEST_CASE(
    "rbln device, KV in device memory: no device-memory calls, a device not on the host, a copy "
    "that fails") {
  auto dir = testing::write_fake_rbln_artifact(scratch("devkv-err"), artifact());
  auto missing = make_device(device_kv_spec(dir, env("RBLN_FAKE_LIB_NO_MEMORY")));
  REQUIRE_FALSE(missing.ok());
  CHECK_MESSAGE(missing.error().message.find("has no symbol rbln_malloc") != std::string::npos,
                missing.error().message);
  CHECK(missing.error().message.find("kv_memory = \"device\"") != std::string::npos);
  // The same library serves KV in host memory.
  CHECK(make_device(rbln_spec(dir, env("RBLN_FAKE_LIB_NO_MEMORY"))).ok());

  // The library reports 16 devices: device 16 is named before anything opens.
  DeviceSpec far = device_kv_spec(dir);
  far.rbln.device_ids = {16};
  auto beyond = make_device(far);
  REQUIRE_FALSE(beyond.ok());
  CHECK_MESSAGE(beyond.error().message.find("rbln device 16: this host has 16 RBLN devices "
                                            "(rbln_get_device_count)") == 0,
                beyond.error().message);

  auto device = make_device(device_kv_spec(dir));
  REQUIRE(device.ok());
  ::setenv("RBLN_FAKE_FAIL_MEMCPY_AFTER", "0", 1);
  std::vector<PrefillSeq> pre{{1, {0}, 0, {1, 200, 300}, {}}};
  auto failed = (*device)->prefill(pre);
  ::unsetenv("RBLN_FAKE_FAIL_MEMCPY_AFTER");
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().kind == ErrorKind::failed);
  CHECK_MESSAGE(failed.error().message.find("rbln_memcpy (device to host") != std::string::npos,
                failed.error().message);
  CHECK(failed.error().message.find("the device faulted during a copy") != std::string::npos);
  // The host pool and the device disagree on a block now: the device takes no more work.
  CHECK((*device)->lost().find("rbln_memcpy") != std::string::npos);
  CHECK_FALSE((*device)->prefill(pre).ok());
}

namespace {

testing::FakeRblnArtifact pipelined(uint32_t stages, std::vector<uint32_t> layers = {}) {
  testing::FakeRblnArtifact a = artifact();
  a.stages = stages;
  a.stage_layers = std::move(layers);
  return a;
}

DeviceSpec pipelined_spec(const std::string& dir, std::vector<uint32_t> devices) {
  DeviceSpec spec = rbln_spec(dir);
  spec.rbln.decode_seqs_max = 0;  // a prefill executor
  spec.rbln.device_ids = std::move(devices);
  return spec;
}

// The fake's count of graph runs submitted and not complete at once (not an RBLN call).
int64_t runs_in_flight_max(bool reset) {
  void* lib = ::dlopen(env("RBLN_FAKE_LIB").c_str(), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(lib != nullptr, "the fake is loaded by the device");
  auto fn = reinterpret_cast<int64_t (*)(int)>(::dlsym(lib, "rbln_fake_graph_runs_in_flight_max"));
  const bool exported = fn != nullptr;
  REQUIRE_MESSAGE(exported, "the fake exports rbln_fake_graph_runs_in_flight_max");
  int64_t seen = fn(reset ? 1 : 0);
  ::dlclose(lib);
  return seen;
}

// The fake's bytes copied by rbln_memcpy for `device` with `type` (0: host to device) since the
// last reset (not an RBLN call).
uint64_t memcpy_bytes(int device, int type, bool reset) {
  void* lib = ::dlopen(env("RBLN_FAKE_LIB").c_str(), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(lib != nullptr, "the fake is loaded by the device");
  auto fn = reinterpret_cast<uint64_t (*)(int, int, int)>(::dlsym(lib, "rbln_fake_memcpy_bytes"));
  const bool exported = fn != nullptr;
  REQUIRE_MESSAGE(exported, "the fake exports rbln_fake_memcpy_bytes");
  uint64_t bytes = fn(device, type, reset ? 1 : 0);
  ::dlclose(lib);
  return bytes;
}

std::vector<PrefillSeq> pipeline_batch() {
  // 150 tokens: three chunks of 64 through the stages; 5 and 64: one each.
  return {{1, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0, prompt(7, 150), {}},
          {2, {20}, 0, prompt(8, 5), {}},
          {3, {30, 31, 32, 33}, 0, prompt(9, 64), {}}};
}

}  // namespace

TEST_CASE("rbln device, pipelined prefill: the stages give the one-graph device's logits and KV") {
  auto whole_dir = testing::write_fake_rbln_artifact(scratch("pp-whole"), artifact());
  auto whole = make_device(rbln_spec(whole_dir));
  REQUIRE(whole.ok());
  auto cpu = make_device(cpu_spec());
  REQUIRE(cpu.ok());
  auto batch = pipeline_batch();
  auto want = (*whole)->prefill(batch);
  REQUIRE(want.ok());
  auto reference = (*cpu)->prefill(batch);
  REQUIRE(reference.ok());
  const KvLayout layout = (*whole)->kv_layout();  // a copy: `whole` is replaced below
  const uint64_t used = 40 * layout.block_bytes();

  struct Case {
    std::string name;
    uint32_t stages;
    std::vector<uint32_t> layers, devices;
    bool device_kv;
  };
  for (const Case& c :
       {Case{"PP2, host KV", 2, {}, {0, 1}, false},
        Case{"PP3 uneven (1, 2, 3 layers), device KV", 3, {1, 2, 3}, {4, 5, 6}, true},
        Case{"PP2 of TP2 (devices 8..11), device KV", 2, {}, {8, 9, 10, 11}, true}}) {
    CAPTURE(c.name);
    auto a = pipelined(c.stages, c.layers);
    if (c.devices.size() == 4) a.devices = 2;
    auto dir = testing::write_fake_rbln_artifact(scratch("pp" + std::to_string(c.stages)), a);
    DeviceSpec spec = pipelined_spec(dir, c.devices);
    spec.rbln.kv_on_device = c.device_kv;
    auto device = make_device(spec);
    REQUIRE_MESSAGE(device.ok(), device.error().describe());
    CHECK((*device)->kv_layout() == layout);  // P/D and tier 2 see one whole-model pool
    auto got = (*device)->prefill(batch);
    REQUIRE_MESSAGE(got.ok(), got.error().describe());
    REQUIRE(got->seqs.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(got->seqs[i].seq_id == batch[i].seq_id);
      CHECK(got->seqs[i].logits == want->seqs[i].logits);
      CHECK(argmax(got->seqs[i].logits) == argmax(reference->seqs[i].logits));
    }
    // Every stage's writes reached the whole pool the decode side pulls from.
    CHECK(std::memcmp((*device)->kv_region().base, (*whole)->kv_region().base, used) == 0);
    // A prefill continuing the first sequence (positions 150..160) reads the stages' own KV.
    std::vector<PrefillSeq> more{{1, batch[0].block_table, 150, prompt(10, 10), {}}};
    auto next = (*device)->prefill(more);
    auto next_want = (*whole)->prefill(more);
    REQUIRE((next.ok() && next_want.ok()));
    CHECK(next->seqs[0].logits == next_want->seqs[0].logits);
    // No decode graphs.
    std::vector<DecodeSeq> dec{{1, batch[0].block_table, 160, {400}}};
    auto refused = (*device)->decode(dec);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message.find("pipelined prefill (pipeline_parallel_size " +
                                       std::to_string(c.stages) + ")") != std::string::npos);
    // Re-run the whole-model device's continuation off the same state for the next case.
    auto w = make_device(rbln_spec(whole_dir));
    REQUIRE(w.ok());
    REQUIRE((*w)->prefill(batch).ok());
    whole = std::move(w);
  }
}

TEST_CASE("rbln device, pipelined prefill: the stages work on consecutive chunks at once") {
  auto a = pipelined(2);
  a.extra = {{"fake_run_delay_ms", 30}};
  auto dir = testing::write_fake_rbln_artifact(scratch("pp-overlap"), a);
  auto device = make_device(pipelined_spec(dir, {0, 1}));
  REQUIRE(device.ok());
  runs_in_flight_max(true);
  std::vector<PrefillSeq> one{pipeline_batch()[0]};  // three chunks: waves of 1, 2, 2, 1 runs
  REQUIRE((*device)->prefill(one).ok());
  CHECK(runs_in_flight_max(true) == 2);
  // The counter tells: one graph, one run at a time.
  auto whole_art = artifact();
  whole_art.extra = {{"fake_run_delay_ms", 30}};
  auto whole =
      make_device(rbln_spec(testing::write_fake_rbln_artifact(scratch("pp-serial"), whole_art)));
  REQUIRE(whole.ok());
  REQUIRE((*whole)->prefill(one).ok());
  CHECK(runs_in_flight_max(true) == 1);
}

TEST_CASE("rbln device, pipelined prefill: artifact checks, a failing stage, a hung stage") {
  auto expect_error = [](const DeviceSpec& spec, const std::string& text) {
    auto d = make_device(spec);
    REQUIRE_FALSE(d.ok());
    CHECK_MESSAGE(d.error().message.find(text) != std::string::npos, d.error().message);
  };
  auto dir = testing::write_fake_rbln_artifact(scratch("pp-check"), pipelined(2));
  expect_error(pipelined_spec(dir, {0}),
               "tensor_parallel_size 1 x pipeline_parallel_size 2 = 2 devices, manifest instance "
               "devices count 1");
  DeviceSpec decoding = pipelined_spec(dir, {0, 1});
  decoding.rbln.decode_seqs_max = 8;
  expect_error(decoding,
               "pipeline_parallel_size 2 (prefill-only graphs), manifest a decode instance runs on "
               "this executor");
  fs::remove(fs::path(dir) / "prefill_stage_1.rbln");
  expect_error(pipelined_spec(dir, {0, 1}),
               "compiled graph " + dir + "/prefill_stage_1.rbln is missing");
  auto uneven = pipelined(4);  // stories15M has 6 layers
  expect_error(
      pipelined_spec(testing::write_fake_rbln_artifact(scratch("pp-uneven"), uneven), {0, 1, 2, 3}),
      "6 layers do not split evenly into 4 pipeline stages");
  auto sum = pipelined(2, {2, 3});
  expect_error(pipelined_spec(testing::write_fake_rbln_artifact(scratch("pp-sum"), sum), {0, 1}),
               "pipeline_stage_layers sum to 5, the model has 6 layers");
  auto with_decode = pipelined(2);
  with_decode.extra = {{"decoder_batch_sizes", {1, 2}}};
  expect_error(
      pipelined_spec(testing::write_fake_rbln_artifact(scratch("pp-dec"), with_decode), {0, 1}),
      "pipelined artifact is prefill-only");

  auto failing = pipelined(3);
  failing.extra = {{"fake_fail_graph", "prefill_stage_1"}};
  auto device = make_device(
      pipelined_spec(testing::write_fake_rbln_artifact(scratch("pp-fail"), failing), {3, 4, 5}));
  REQUIRE(device.ok());
  auto batch = pipeline_batch();
  auto failed = (*device)->prefill(batch);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().kind == ErrorKind::failed);
  CHECK_MESSAGE(failed.error().message.find("prefill_stage_1 (seq 1, positions 0..64, device 4)") !=
                    std::string::npos,
                failed.error().message);
  CHECK((*device)->lost().empty());  // a failed run is the pass's error, not the device's

  auto hanging = pipelined(2);
  hanging.extra = {{"fake_hang_graph", "prefill_stage_1"}};
  DeviceSpec hs =
      pipelined_spec(testing::write_fake_rbln_artifact(scratch("pp-hang"), hanging), {0, 1});
  hs.rbln.run_timeout_ms = kHangTimeoutMs;
  auto hung = make_device(hs);
  REQUIRE(hung.ok());
  auto timed = (*hung)->prefill(batch);
  REQUIRE_FALSE(timed.ok());
  CHECK(timed.error().kind == ErrorKind::timed_out);
  CHECK((*hung)->lost().find("prefill_stage_1 (seq 1, positions 0..64, device 1) run") !=
        std::string::npos);
  CHECK_FALSE((*hung)->prefill(batch).ok());

  // Device KV: a stage's staging copy that fails names its device and loses the device.
  DeviceSpec staged =
      pipelined_spec(testing::write_fake_rbln_artifact(scratch("pp-copy"), pipelined(2)), {6, 7});
  staged.rbln.kv_on_device = true;
  auto copying = make_device(staged);
  REQUIRE(copying.ok());
  ::setenv("RBLN_FAKE_FAIL_MEMCPY_AFTER", "0", 1);
  auto lost = (*copying)->prefill(batch);
  ::unsetenv("RBLN_FAKE_FAIL_MEMCPY_AFTER");
  REQUIRE_FALSE(lost.ok());
  CHECK_MESSAGE(lost.error().message.find("rbln_memcpy (device to host, ") != std::string::npos,
                lost.error().message);
  CHECK(lost.error().message.find(", device 6) failed") != std::string::npos);
  CHECK_FALSE((*copying)->lost().empty());
}

TEST_CASE(
    "rbln device, pipelined prefill with device KV: blocks written into the host pool are "
    "imported") {
  auto dir = testing::write_fake_rbln_artifact(scratch("pp-import"), pipelined(2));
  DeviceSpec spec = pipelined_spec(dir, {0, 1});
  spec.rbln.kv_on_device = true;
  auto a = make_device(spec);
  auto b = make_device(spec);
  REQUIRE((a.ok() && b.ok()));
  const std::vector<int32_t> p = prompt(5, 48), tail = prompt(6, 8);
  std::vector<PrefillSeq> first{{1, {0, 1, 2, 3}, 0, p, {}}};
  REQUIRE((*a)->prefill(first).ok());
  std::vector<PrefillSeq> cont{{1, {0, 1, 2, 3}, 48, tail, {}}};
  auto want = (*a)->prefill(cont);
  REQUIRE(want.ok());
  // Tier 2 brings the first 48 positions' blocks into b's host pool as blocks 10..12.
  const uint64_t bb = (*a)->kv_layout().block_bytes();
  for (uint32_t i = 0; i < 3; ++i) {
    std::memcpy((*b)->kv_region().base + (10 + i) * bb, (*a)->kv_region().base + i * bb, bb);
  }
  std::vector<PrefillSeq> on_b{{1, {10, 11, 12, 13}, 48, tail, {}}};
  auto stale = (*b)->prefill(on_b);
  REQUIRE(stale.ok());
  CHECK(stale->seqs[0].logits != want->seqs[0].logits);  // the stages computed on 0xA5 bytes
  on_b[0].imported = {10, 11, 12};
  auto fresh = (*b)->prefill(on_b);
  REQUIRE(fresh.ok());
  CHECK(fresh->seqs[0].logits == want->seqs[0].logits);
}

TEST_CASE("rbln device, data parallel: ranks in lockstep give the cpu device's tokens") {
  auto cpu = make_device(cpu_spec());
  REQUIRE(cpu.ok());
  struct Case {
    std::string name;
    uint32_t ranks;
    std::vector<uint32_t> devices;
    bool device_kv;
  };
  for (const Case& c :
       {Case{"DP2, host KV", 2, {0, 1}, false}, Case{"DP4, device KV", 4, {4, 5, 6, 7}, true},
        Case{"DP2 of TP2, device KV", 2, {8, 9, 10, 11}, true}}) {
    CAPTURE(c.name);
    auto a = artifact();
    a.ranks = c.ranks;
    if (c.devices.size() == 4 && c.ranks == 2) a.devices = 2;
    auto dir = testing::write_fake_rbln_artifact(scratch("dp" + std::to_string(c.ranks)), a);
    DeviceSpec spec = rbln_spec(dir);
    spec.rbln.device_ids = c.devices;
    spec.rbln.kv_on_device = c.device_kv;
    auto device = make_device(spec);
    REQUIRE_MESSAGE(device.ok(), device.error().describe());
    // Every batch size 1..8 (uneven shares: the ranks pad to the widest share's bucket; idle
    // ranks run padding), prompts across prefill chunks.
    for (uint32_t n = 1; n <= 8; ++n) {
      std::vector<std::vector<int32_t>> prompts;
      for (uint32_t i = 0; i < n; ++i) {
        prompt(n * 10 + i, i == 0 ? 70 : 5 + 3 * i).swap(prompts.emplace_back());
      }
      CHECK_MESSAGE(generate(**device, prompts, 10) == generate(**cpu, prompts, 10), "batch of ",
                    n);
    }
  }
}

TEST_CASE(
    "rbln device, data parallel: the fake's ranks are collective, as an expert-parallel step's") {
  // What the lockstep above is for: on the NPUs a rank's step exchanges tokens with every other
  // rank, so no rank's run completes until all ranks run the same graph. The fake holds its
  // ranks to that (tests/rbln_fake/fake_graph.hpp); here through the runtime binding itself.
  auto a = artifact();
  a.ranks = 2;
  const fs::path dir = testing::write_fake_rbln_artifact(scratch("dp-collective"), a);
  auto api = devices::rbln::RblnApi::load(env("RBLN_FAKE_LIB"));
  REQUIRE(api.ok());
  auto open = [&](const char* graph, int device) {
    auto rt = devices::rbln::RblnRuntime::open(*api, (dir / graph).string(), graph, device);
    REQUIRE_MESSAGE(rt.ok(), rt.error().describe());
    return std::move(rt).value();
  };
  auto one0 = open("decoder_batch_1.rbln", 0), one1 = open("decoder_batch_1.rbln", 1);
  auto two1 = open("decoder_batch_2.rbln", 1);
  // Padding rows (token 0 at position 0, the dummy block), one buffer set per rank and bucket.
  const uint32_t table = a.max_seq_len / a.block_tokens, dummy = a.kv_blocks - 1;
  auto cpu = make_device(cpu_spec());  // for the shapes
  REQUIRE(cpu.ok());
  const uint64_t kv_bytes = uint64_t{a.kv_blocks} * (*cpu)->kv_layout().block_bytes();
  const size_t vocab = (*cpu)->model_config().vocab_size;
  struct Buffers {
    std::vector<int32_t> ids, pos, tables;
    std::vector<float> logits;
    std::vector<std::byte> kv;
  };
  auto buffers = [&](uint32_t bucket) {
    Buffers b{std::vector<int32_t>(bucket, 0), std::vector<int32_t>(bucket, 0),
              std::vector<int32_t>(size_t{bucket} * table, static_cast<int32_t>(dummy)),
              std::vector<float>(bucket * vocab), std::vector<std::byte>(kv_bytes)};
    return b;
  };
  auto submit = [](devices::rbln::RblnRuntime& rt, Buffers& b) {
    auto id =
        rt.submit({b.ids.data(), b.pos.data(), b.tables.data(), b.kv.data()}, {b.logits.data()});
    REQUIRE_MESSAGE(id.ok(), id.error().describe());
    return *id;
  };
  Buffers r0 = buffers(1), r1 = buffers(1), r1_two = buffers(2);
  // Rank 0 alone: its run waits for rank 1's, and completes once rank 1 runs too.
  const int64_t first = submit(one0, r0);
  auto alone = one0.wait(first, std::chrono::milliseconds(300));
  REQUIRE_FALSE(alone.ok());
  CHECK(alone.error().kind == ErrorKind::timed_out);
  const int64_t peer = submit(one1, r1);
  CHECK(one0.wait(first, std::chrono::milliseconds(20000)).ok());
  CHECK(one1.wait(peer, std::chrono::milliseconds(20000)).ok());
  // The next round with different graphs on the two ranks: both runs fail, naming both.
  const int64_t mixed0 = submit(one0, r0), mixed1 = submit(two1, r1_two);
  for (auto [rt, id] : {std::pair{&one0, mixed0}, std::pair{&two1, mixed1}}) {
    auto failed = rt->wait(id, std::chrono::milliseconds(20000));
    REQUIRE_FALSE(failed.ok());
    CHECK_MESSAGE(
        failed.error().message.find("collective mismatch in round 1:") != std::string::npos,
        failed.error().message);
    CHECK(failed.error().message.find("device 0 ran decoder_batch_1") != std::string::npos);
    CHECK(failed.error().message.find("device 1 ran decoder_batch_2") != std::string::npos);
  }
  // A third device on a directory of two ranks.
  auto third = open("decoder_batch_1.rbln", 2);
  Buffers r2 = buffers(1);
  const int64_t extra = submit(third, r2);
  auto refused = third.wait(extra, std::chrono::milliseconds(20000));
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.error().message.find("data_parallel_size is 2") != std::string::npos,
                refused.error().message);
}

TEST_CASE(
    "rbln device, data parallel: every rank runs every round; a rank's failure or hang names it") {
  auto a = artifact();
  a.ranks = 3;
  a.extra = {{"fake_run_delay_ms", 30}};
  auto dir = testing::write_fake_rbln_artifact(scratch("dp-lockstep"), a);
  DeviceSpec spec = rbln_spec(dir);
  spec.rbln.device_ids = {0, 1, 2};
  auto device = make_device(spec);
  REQUIRE(device.ok());
  runs_in_flight_max(true);
  // One sequence: the other two ranks run padding beside it, at once.
  std::vector<PrefillSeq> one{{3, {0, 1}, 0, prompt(1, 20), {}}};
  REQUIRE((*device)->prefill(one).ok());
  CHECK(runs_in_flight_max(true) == 3);
  std::vector<DecodeSeq> step{{3, {0, 1}, 20, {500}}};
  REQUIRE((*device)->decode(step).ok());
  CHECK(runs_in_flight_max(true) == 3);

  DeviceSpec wrong = rbln_spec(dir);
  wrong.rbln.device_ids = {0, 1};
  auto refused = make_device(wrong);
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.error().message.find("tensor_parallel_size 1 x data_parallel_size 3 = 3 "
                                             "devices, manifest instance devices count 2") !=
                    std::string::npos,
                refused.error().message);
  auto both = artifact();
  both.ranks = 2;
  both.stages = 2;
  auto bad = make_device(
      pipelined_spec(testing::write_fake_rbln_artifact(scratch("dp-pp"), both), {0, 1, 2, 3}));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("data_parallel_size 2 with pipeline_parallel_size 2") !=
        std::string::npos);

  auto failing = artifact();
  failing.ranks = 2;
  failing.extra = {{"fake_fail_graph", "decoder_batch_1"}};
  DeviceSpec fs_ = rbln_spec(testing::write_fake_rbln_artifact(scratch("dp-fail"), failing));
  fs_.rbln.device_ids = {6, 7};
  auto f = make_device(fs_);
  REQUIRE(f.ok());
  std::vector<PrefillSeq> two{{4, {0}, 0, prompt(2, 5), {}}, {5, {1}, 0, prompt(3, 5), {}}};
  REQUIRE((*f)->prefill(two).ok());
  std::vector<DecodeSeq> dec{{4, {0}, 5, {500}}, {5, {1}, 5, {501}}};
  auto failed = (*f)->decode(dec);
  REQUIRE_FALSE(failed.ok());
  CHECK_MESSAGE(failed.error().message.find("rbln decoder_batch_1 (rank 0, device 6): ") == 0,
                failed.error().message);
  CHECK((*f)->lost().empty());

  // A round that never completes: every rank's run is waited for, then the device is lost.
  auto hanging = artifact();
  hanging.ranks = 2;
  hanging.extra = {{"fake_hang_graph", "decoder_batch_2"}};
  DeviceSpec hs = rbln_spec(testing::write_fake_rbln_artifact(scratch("dp-hang"), hanging));
  hs.rbln.device_ids = {2, 3};
  hs.rbln.run_timeout_ms = kHangTimeoutMs;
  auto hung = make_device(hs);
  REQUIRE(hung.ok());
  REQUIRE((*hung)->prefill(two).ok());
  auto single = (*hung)->decode(dec);  // one row per rank: decoder_batch_1 completes
  REQUIRE(single.ok());
  std::vector<DecodeSeq> wide{{4, {0}, 6, {502}}, {6, {2}, 0, {503}}};  // both on rank 0
  auto timed = (*hung)->decode(wide);
  REQUIRE_FALSE(timed.ok());
  CHECK(timed.error().kind == ErrorKind::timed_out);
  CHECK_MESSAGE((*hung)->lost().find("decoder_batch_2 (rank 0, device 2) run") != std::string::npos,
                (*hung)->lost());
  CHECK_FALSE((*hung)->decode(dec).ok());
}

TEST_CASE(
    "rbln device, data parallel with device KV: imports reach the ranks that read them; blocks "
    "come back from theirs") {
  auto a = artifact();
  a.ranks = 2;
  auto dir = testing::write_fake_rbln_artifact(scratch("dp-import"), a);
  DeviceSpec spec = rbln_spec(dir);
  spec.rbln.device_ids = {0, 1};
  spec.rbln.kv_on_device = true;
  spec.rbln.pool_read_remotely = false;  // a decode executor: nothing staged back after passes
  auto cpu = make_device(cpu_spec());
  auto prefill = make_device(cpu_spec());
  auto decode = make_device(spec);
  REQUIRE((cpu.ok() && prefill.ok() && decode.ok()));
  // Two sequences (seq 6 on rank 0, seq 7 on rank 1), prefilled elsewhere; their blocks pulled
  // into decode's host pool and handed to the first pass as imports.
  const std::vector<int32_t> p6 = prompt(6, 40), p7 = prompt(7, 20);
  std::vector<PrefillSeq> pre{{6, {0, 1, 2}, 0, p6, {}}, {7, {3, 4}, 0, p7, {}}};
  auto first = (*prefill)->prefill(pre);
  REQUIRE(first.ok());
  const uint64_t bb = (*prefill)->kv_layout().block_bytes();
  std::memcpy((*decode)->kv_region().base, (*prefill)->kv_region().base, 5 * bb);
  std::vector<DecodeSeq> batch{{6, {0, 1, 2}, 40, {argmax(first->seqs[0].logits)}},
                               {7, {3, 4}, 20, {argmax(first->seqs[1].logits)}}};
  REQUIRE((*cpu)->prefill(pre).ok());
  auto want = (*cpu)->decode(batch);
  REQUIRE(want.ok());
  auto stale = (*decode)->decode(batch);
  REQUIRE(stale.ok());
  CHECK(stale->seqs[0].logits != want->seqs[0].logits);
  CHECK(stale->seqs[1].logits != want->seqs[1].logits);
  batch[0].imported = {0, 1, 2, 3, 4};  // on the first sequence, as the shells hand them over
  memcpy_bytes(0, 0, true);
  memcpy_bytes(1, 0, true);
  auto fresh = (*decode)->decode(batch);
  REQUIRE(fresh.ok());
  CHECK(fresh->seqs[0].logits == want->seqs[0].logits);
  CHECK(fresh->seqs[1].logits == want->seqs[1].logits);
  // Each imported block went only to the rank that reads it: blocks 0..2 to rank 0 (device 0),
  // 3 and 4 to rank 1 (device 1), not all five to both.
  CHECK(memcpy_bytes(0, 0, false) == 3 * (*decode)->kv_layout().block_bytes());
  CHECK(memcpy_bytes(1, 0, false) == 2 * (*decode)->kv_layout().block_bytes());
  // copy_blocks_out reads each block from the rank that computed on it: block 2 (seq 6's row 40
  // written on rank 0) and block 4 (seq 7's row 20, rank 1) equal the cpu pool's.
  std::vector<std::byte> out(2 * bb);
  std::vector<uint32_t> blocks{2, 4};
  REQUIRE((*decode)->copy_blocks_out(blocks, out).ok());
  CHECK(std::memcmp(out.data(), (*cpu)->kv_region().base + 2 * bb, bb) == 0);
  CHECK(std::memcmp(out.data() + bb, (*cpu)->kv_region().base + 4 * bb, bb) == 0);

  // A prefix computed on one rank, shared by a sequence of the other (the instance's prefix
  // cache knows no ranks): seq 8 (rank 0) prefills 40 tokens into blocks 10..12; seq 9 (rank 1)
  // reuses blocks 10 and 11 (positions 0..31) and goes on from position 32 in block 13, then
  // decodes. Its rank gets those blocks first (found live: otherwise it computes on 0xA5).
  const std::vector<int32_t> shared = prompt(8, 40), own = prompt(9, 12);
  std::vector<PrefillSeq> a_pre{{8, {10, 11, 12}, 0, shared, {}}};
  std::vector<PrefillSeq> b_pre{{9, {10, 11, 13}, 32, own, {}}};
  for (Device* d : {cpu->get(), decode->get()}) REQUIRE(d->prefill(a_pre).ok());
  auto b_want = (*cpu)->prefill(b_pre);
  auto b_got = (*decode)->prefill(b_pre);
  REQUIRE((b_want.ok() && b_got.ok()));
  CHECK(b_got->seqs[0].logits == b_want->seqs[0].logits);
  std::vector<DecodeSeq> b_dec{{9, {10, 11, 13}, 44, {argmax(b_want->seqs[0].logits)}}};
  auto d_want = (*cpu)->decode(b_dec);
  auto d_got = (*decode)->decode(b_dec);
  REQUIRE((d_want.ok() && d_got.ok()));
  CHECK(d_got->seqs[0].logits == d_want->seqs[0].logits);
}
