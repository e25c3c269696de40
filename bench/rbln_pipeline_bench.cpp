#include "bench/rbln_pipeline_bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "devices/device.hpp"
#include "devices/rbln/rbln_artifact.hpp"
#include "tools/model_synth.hpp"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kSeqs = 8, kTokens = 128, kChunk = 64, kBlock = 16;

// A fake compiled directory of `stages` stages (1: the one-graph layout) for the model at
// `model_dir` (ModelConfig `config`), every run delayed by `delay_ms` (scaled per stage).
std::string write_artifact(const fs::path& dir, const std::string& model_dir,
                           const devices::ModelConfig& config, uint32_t stages, uint32_t delay_ms) {
  fs::create_directories(dir);
  devices::rbln::RblnArtifact art;
  art.model_name = "bench";
  art.compiler_version = "fake";
  art.model = config;
  art.block_tokens = kBlock;
  art.kv_blocks = kSeqs * (kTokens / kBlock) + 1;
  art.kv_element_bytes = 4;
  art.max_seq_len = config.max_position;
  art.prefill_chunk = kChunk;
  art.buckets = {1};
  art.stages = stages;
  if (stages > 1) art.stage_layers.assign(stages, config.layers / stages);
  nlohmann::json j = devices::rbln::artifact_config_json(art);
  j["fake_model_path"] = model_dir;
  j["fake_run_delay_ms"] = delay_ms;
  std::ofstream(dir / "rbln_config.json") << j.dump(2);
  if (stages == 1) {
    std::ofstream(dir / "prefill.rbln") << "fake\n";
    std::ofstream(dir / "decoder_batch_1.rbln") << "fake\n";
  }
  for (uint32_t s = 0; stages > 1 && s < stages; ++s) {
    std::ofstream(dir / ("prefill_stage_" + std::to_string(s) + ".rbln")) << "fake\n";
  }
  return dir.string();
}

}  // namespace

int run_rbln_pipeline_bench(cli::Args args) {
  cli::Flags flags("tandem bench rbln-pipeline --library LIB",
                   "A pipelined rbln prefill's wavefront against one graph, on the conformance "
                   "fake (stage time stands in for device time).");
  flags.flag("library", "PATH", "the conformance fake (build/tests/librbln_fake.so)", "")
      .flag("delay-ms", "N", "one whole-model graph run's stand-in device time", "40")
      .flag("repeat", "N", "passes per depth; the median is printed", "3");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  if (flags.get("library").empty()) {
    std::fprintf(stderr, "tandem bench rbln-pipeline: --library is required\n");
    return 2;
  }
  auto delay_ms = flags.get_int("delay-ms"), repeats = flags.get_int("repeat");
  if (!delay_ms || !repeats) return 2;
  if (*delay_ms < 1 || *delay_ms > 10000 || *repeats < 1 || *repeats > 99) {
    std::fprintf(stderr,
                 "tandem bench rbln-pipeline: --delay-ms in [1, 10000], --repeat in "
                 "[1, 99]\n");
    return 2;
  }
  const auto delay = static_cast<uint32_t>(*delay_ms);
  const auto repeat = static_cast<uint32_t>(*repeats);
  fs::path root = fs::temp_directory_path() / ("tandem-bench-rbln-" + std::to_string(::getpid()));
  fs::remove_all(root);
  tools::SynthOptions synth;
  synth.layers = 12;
  synth.max_position = 1024;
  auto config = tools::synth_config(synth);
  if (!config.ok() || !tools::synth_model(synth, (root / "model").string()).ok()) {
    std::fprintf(stderr, "tandem bench rbln-pipeline: cannot synthesize the model in %s\n",
                 root.c_str());
    return 1;
  }
  const uint32_t items = kSeqs * (kTokens / kChunk);
  std::printf(
      "pipelined prefill on the rbln conformance fake: %u sequences x %u tokens = %u "
      "chunks of %u, %u layers, %u ms per whole-model run, median of %u\n",
      kSeqs, kTokens, items, kChunk, synth.layers, delay, repeat);
  std::printf("%-7s %10s %11s %12s %12s %11s %11s\n", "stages", "measured s", "compute s",
              "difference s", "wavefront s", "diff/ideal", "vs 1 stage");
  double one_graph = 0;
  for (uint32_t stages : {1u, 2u, 3u, 4u, 6u}) {
    // The pass with the stand-in device time, and without it (the fake's own compute, which it
    // serializes: one cpu transformer per directory).
    double median_s[2] = {0, 0};
    for (int with_delay = 1; with_delay >= 0; --with_delay) {
      devices::DeviceSpec spec;
      spec.kind = config::DeviceKind::rbln;
      spec.block_tokens = kBlock;
      spec.blocks_total = kSeqs * (kTokens / kBlock);
      spec.rbln.library = flags.get("library");
      spec.rbln.artifacts =
          write_artifact(root / ("pp" + std::to_string(stages) + "-" + std::to_string(with_delay)),
                         (root / "model").string(), *config, stages, with_delay ? delay : 0);
      spec.rbln.model_name = "bench";
      spec.rbln.max_model_tokens = kTokens;
      spec.rbln.run_timeout_ms = 60000;
      for (uint32_t d = 0; d < stages; ++d) spec.rbln.device_ids.push_back(d);
      auto device = devices::make_device(spec);
      if (!device.ok()) {
        std::fprintf(stderr, "tandem bench rbln-pipeline: %s\n", device.error().describe().c_str());
        return 1;
      }
      std::vector<devices::PrefillSeq> batch;
      for (uint32_t i = 0; i < kSeqs; ++i) {
        devices::PrefillSeq s;
        s.seq_id = i;
        for (uint32_t b = 0; b < kTokens / kBlock; ++b) {
          s.block_table.push_back(i * (kTokens / kBlock) + b);
        }
        for (uint32_t t = 0; t < kTokens; ++t) {
          s.tokens.push_back(static_cast<int32_t>(3 + (i * 7 + t) % 250));
        }
        batch.push_back(std::move(s));
      }
      std::vector<double> seconds;
      for (uint32_t r = 0; r < repeat; ++r) {
        auto started = Clock::now();
        auto out = (*device)->prefill(batch);
        seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
        if (!out.ok()) {
          std::fprintf(stderr, "tandem bench rbln-pipeline: %s\n", out.error().describe().c_str());
          return 1;
        }
      }
      std::sort(seconds.begin(), seconds.end());
      median_s[with_delay] = seconds[seconds.size() / 2];
    }
    const double measured = median_s[1], compute = median_s[0], difference = measured - compute;
    const double ideal = (items + stages - 1) * (delay / 1000.0) / stages;
    if (stages == 1) one_graph = measured;
    std::printf("%-7u %10.3f %11.3f %12.3f %12.3f %11.2f %11.2f\n", stages, measured, compute,
                difference, ideal, difference / ideal, measured / one_graph);
  }
  fs::remove_all(root);
  return 0;
}

}  // namespace tandem::bench
