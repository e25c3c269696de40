// A compiled model directory for the rbln backend, laid out as the public RBLN stack lays it out
// (optimum-rbln / vllm-rbln): one graph for prefill (batch 1, chunked) and one per decode batch
// size ("bucket"), each a `.rbln` file, beside a `rbln_config.json` that says what they were
// compiled for:
//
//   rbln_config.json   {"model_name": "...", "compiler_version": "...",
//                       "model": {"vocab_size", "hidden", "layers", "heads", "kv_heads",
//                                 "head_dim", "max_position", "bos_id", "eos_id"},
//                       "kvcache_block_size", "kvcache_num_blocks", "kv_element_bytes",
//                       "max_seq_len", "prefill_chunk_size", "decoder_batch_sizes": [..],
//                       "tensor_parallel_size",
//                       "pipeline_parallel_size", "pipeline_stage_layers": [..],
//                       "data_parallel_size", "verify_tokens"}
//   prefill.rbln        inputs: input_ids[chunk], cache_position[chunk], block_tables[blocks],
//                       query_position[1], kv_cache; output: logits[vocab] (the query row)
//   decoder_batch_B.rbln inputs: input_ids[B], cache_position[B], block_tables[B x blocks],
//                       kv_cache; output: logits[B x vocab]
//   verify_batch_B.rbln  with "verify_tokens" T >= 2 (Tandem's convention: speculative
//                       verification), one per bucket: inputs input_ids[B x T],
//                       cache_position[B x T], block_tables[B x blocks], kv_cache; output
//                       logits[B x T x vocab]. Row r holds a sequence's last token and its
//                       drafts at consecutive positions in its first slots; a slot it does not
//                       use has cache_position -1 (the graph writes no KV for it and its logits
//                       row is not read). Logits row (r, i) predicts the token after slot i.
//
// A pipelined prefill artifact (pipeline_parallel_size P > 1, Tandem's convention: the public
// stack's pipeline-stage format is not published) has instead of prefill.rbln one graph per
// stage, and no decode graphs (decode runs data-parallel: one instance per device):
//   prefill_stage_S.rbln inputs: stage 0 input_ids[chunk], later stages hidden[chunk x hidden]
//                       (fp32, the previous stage's output); then cache_position, block_tables,
//                       query_position, kv_cache (the stage's layers only, block-major);
//                       output: hidden[chunk x hidden], the last stage logits[vocab]
// Stage S holds pipeline_stage_layers[S] consecutive layers (default: an equal split) and runs
// on the instance's devices [S x tensor_parallel_size, (S + 1) x tensor_parallel_size).
//
// A data-parallel artifact (data_parallel_size D > 1, Tandem's convention too) has the usual
// graphs, opened once per rank on the instance's devices [R x tensor_parallel_size, ...); the
// ranks run every graph in lockstep (an expert-parallel step exchanges tokens between them inside
// the run), each on its own sequences, an idle rank on a padding input.
//
// All index inputs are int32, logits fp32; `blocks` = max_seq_len / kvcache_block_size. The
// keys are the ones optimum-rbln writes where it has one (its `rbln_config`), plus the model's
// shape (so a node needs no second file) and the compiler version (which the public stack's
// own cache key leaves out). What the real compiler writes beside its graphs has not been seen
// here (docs/rbln.md: Unverified).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices::rbln {

struct RblnArtifact {
  std::string dir;
  std::string model_name;
  std::string compiler_version;
  ModelConfig model;          // the fields above; the rest at their defaults
  uint32_t block_tokens = 0;  // kvcache_block_size
  uint32_t kv_blocks = 0;     // kvcache_num_blocks, the dummy block included
  uint32_t kv_element_bytes = 2;
  uint32_t max_seq_len = 0;
  uint32_t prefill_chunk = 0;     // prefill_chunk_size
  std::vector<uint32_t> buckets;  // decoder_batch_sizes, ascending, distinct
  uint32_t devices = 1;           // tensor_parallel_size: devices per stage
  uint32_t stages = 1;            // pipeline_parallel_size
  uint32_t ranks = 1;             // data_parallel_size
  std::vector<uint32_t> stage_layers;  // layers per stage, summing to model.layers
  uint32_t verify_tokens = 0;          // > 0: verify_batch_B graphs taking this many per row

  uint32_t table_blocks() const { return max_seq_len / block_tokens; }
  uint32_t devices_total() const { return devices * stages * ranks; }
  uint32_t stage_first_layer(uint32_t stage) const;
  std::string prefill_graph() const;                // DIR/prefill.rbln
  std::string stage_graph(uint32_t stage) const;    // DIR/prefill_stage_S.rbln
  std::string decode_graph(uint32_t bucket) const;  // DIR/decoder_batch_B.rbln
  std::string verify_graph(uint32_t bucket) const;  // DIR/verify_batch_B.rbln
  // The smallest bucket >= rows; 0 when rows exceeds the largest.
  uint32_t bucket_for(uint32_t rows) const;
};

// Reads DIR/rbln_config.json and checks it is self-consistent (sizes > 0, max_seq_len a multiple
// of the block size, the chunk a multiple of 64 as the public stack requires, buckets ascending)
// and that every graph file exists. Errors: not_found (no directory, config or graph file,
// naming the path), invalid (naming the key and value).
Result<RblnArtifact> load_artifact(const std::string& dir);
// The checks of load_artifact on rbln_config.json's text alone (no file is looked at); `dir`
// names the file in errors and is the artifact's dir. Never throws, whatever the bytes.
Result<RblnArtifact> parse_artifact_config(std::string_view text, const std::string& dir);

// The rbln_config.json that load_artifact reads back as `artifact` (`dir` is not written).
nlohmann::json artifact_config_json(const RblnArtifact& artifact);

// What the manifest asks of the artifact.
struct ArtifactExpect {
  std::string model_name;  // [model] name; also accepted: any served name
  std::vector<std::string> served_names;
  uint32_t block_tokens = 0;      // [model] block_tokens
  uint32_t max_model_tokens = 0;  // [model] max_model_tokens
  uint32_t devices = 1;           // the executor's devices = [...] count (1 when empty)
  uint32_t decode_seqs_max = 0;   // [decode] seqs_max: the largest bucket must hold it
  uint32_t kv_blocks = 0;         // the executor's kv_blocks (+ 1 dummy must fit)
  // A speculating decode instance runs on the executor: the verify graphs must take the last
  // token plus [speculative] draft_tokens_max drafts per sequence (0: no speculation).
  uint32_t draft_tokens_max = 0;
};

// invalid naming both values at the first mismatch: "artifact DIR: kvcache_block_size 16,
// manifest [model] block_tokens 32".
Status check_artifact(const RblnArtifact& artifact, const ArtifactExpect& expect);

}  // namespace tandem::devices::rbln
