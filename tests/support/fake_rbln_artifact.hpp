// Writes a compiled-model directory (devices/rbln/rbln_artifact.hpp) for the conformance fake
// (tests/rbln_fake/fake_graph.hpp): rbln_config.json with the model's shape read from its
// weights, and one placeholder `.rbln` file per graph (the fake computes with the cpu
// transformer; the graph files only have to exist).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "devices/cpu/weights.hpp"
#include "devices/rbln/rbln_artifact.hpp"

namespace tandem::testing {

struct FakeRblnArtifact {
  std::string model_path;  // llama2.c .bin or HF directory
  std::string model_name = "stories15M";
  std::string compiler_version = "fake-0.1";
  uint32_t block_tokens = 16;
  uint32_t kv_blocks = 129;  // the dummy block included
  uint32_t max_seq_len = 256;
  uint32_t prefill_chunk = 64;
  std::vector<uint32_t> buckets{1, 2, 4, 8};
  uint32_t devices = 1;
  // > 1: a pipelined prefill artifact: prefill_stage_S.rbln graphs, no decode graphs (buckets
  // are not written); stage_layers empty: an equal split.
  uint32_t stages = 1;
  std::vector<uint32_t> stage_layers;
  uint32_t ranks = 1;                               // data_parallel_size
  uint32_t verify_tokens = 0;  // > 0: verify_batch_B graphs of this many tokens per row
  nlohmann::json extra = nlohmann::json::object();  // merged last (fault switches, overrides)
};

// Writes the directory `dir` (created) and returns it. Throws std::runtime_error when the model
// cannot be read.
inline std::string write_fake_rbln_artifact(const std::filesystem::path& dir,
                                            const FakeRblnArtifact& a) {
  auto weights = devices::cpu::load_model(a.model_path);
  if (!weights.ok()) throw std::runtime_error(weights.error().describe());
  std::filesystem::create_directories(dir);
  devices::rbln::RblnArtifact art;
  art.model_name = a.model_name;
  art.compiler_version = a.compiler_version;
  art.model = weights->config;
  art.block_tokens = a.block_tokens;
  art.kv_blocks = a.kv_blocks;
  art.kv_element_bytes = 4;  // the fake computes with the cpu pool's fp32
  art.max_seq_len = a.max_seq_len;
  art.prefill_chunk = a.prefill_chunk;
  art.buckets = a.buckets;
  art.devices = a.devices;
  art.stages = a.stages;
  art.ranks = a.ranks;
  art.verify_tokens = a.verify_tokens;
  art.stage_layers = a.stage_layers;
  if (art.stages > 1 && art.stage_layers.empty() && art.model.layers % art.stages == 0) {
    art.stage_layers.assign(art.stages, art.model.layers / art.stages);
  }
  nlohmann::json j = devices::rbln::artifact_config_json(art);
  j["fake_model_path"] = a.model_path;
  j.merge_patch(a.extra);
  std::ofstream(dir / "rbln_config.json") << j.dump(2);
  if (a.stages > 1) {
    for (uint32_t s = 0; s < a.stages; ++s) {
      std::ofstream(dir / ("prefill_stage_" + std::to_string(s) + ".rbln")) << "fake graph\n";
    }
    return dir.string();
  }
  std::ofstream(dir / "prefill.rbln") << "fake graph\n";
  for (uint32_t b : a.buckets) {
    std::ofstream(dir / ("decoder_batch_" + std::to_string(b) + ".rbln")) << "fake graph\n";
    if (a.verify_tokens > 0) {
      std::ofstream(dir / ("verify_batch_" + std::to_string(b) + ".rbln")) << "fake graph\n";
    }
  }
  return dir.string();
}

}  // namespace tandem::testing
