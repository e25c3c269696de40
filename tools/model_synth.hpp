// `tandem model synth`: a small HF-style model directory with deterministic random weights.
//
// Writes into out_dir (created if missing; existing files of the same names are replaced):
//   config.json            HF Llama (model_type "llama") or MiniMax-M2 ("minimax_m2") config
//   model.safetensors      HF tensor names (see docs/model-synth.md); with shards N > 1
//                          instead model-0000i-of-0000N.safetensors + model.safetensors.index.json
//                          (devices/safetensors_writer.hpp write_checkpoint)
//   tokenizer.json         byte-level BPE: 256 byte tokens, merges learned from a built-in
//                          text sample, special tokens last (valid HF tokenizers format)
//   tokenizer_config.json  bos/eos tokens, model_max_length
// Same options (incl. seed) -> byte-identical files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::tools {

struct SynthOptions {
  devices::Arch arch = devices::Arch::llama;
  uint32_t layers = 2;
  uint32_t hidden = 64;
  uint32_t heads = 4;
  uint32_t kv_heads = 2;
  uint32_t head_dim = 16;
  uint32_t ffn = 128;            // llama: intermediate_size; minimax: each expert's width
  uint32_t experts = 4;          // minimax only
  uint32_t experts_per_token = 2;
  uint32_t rotary_dim = 0;       // 0: head_dim (llama), head_dim / 2 (minimax)
  uint32_t vocab = 512;          // >= 256 byte tokens + the arch's special tokens
  uint32_t max_position = 256;
  uint64_t seed = 0;
  devices::DType dtype = devices::DType::f32;  // f32, bf16 or f16
  uint32_t shards = 1;  // safetensors files; >1: HF sharded layout; <= the model's tensor count
};

// The ModelConfig the directory describes (for tests and for the loader to compare).
// Errors (invalid): an option out of range, named by its flag (e.g. "--kv-heads").
Result<devices::ModelConfig> synth_config(const SynthOptions& options);

// Errors: invalid (as synth_config), failed (cannot create or write a file; names the path).
Status synth_model(const SynthOptions& options, const std::string& out_dir);

// `tandem model synth --arch eagle3 --target DIR`: an EAGLE-3 draft head for `target` in
// the HF layout devices/cpu/eagle3.hpp loads (config.json + model.safetensors with fc,
// midlayer.*, norm, lm_head and d2t; no embedding: the target's is shared). Weights are
// random (seeded): its drafts are valid tokens but seldom right, which exercises the whole
// path; a trained head is needed for acceptance.
struct Eagle3SynthOptions {
  uint32_t draft_vocab = 0;   // 0: the target's vocabulary / 4 (at least 1); <= vocab
  uint32_t ffn = 0;           // 0: 2 x the target's hidden
  uint64_t seed = 0;
  devices::DType dtype = devices::DType::f32;
};
// The draft vocabulary: draft id i -> target id floor(i * vocab / draft_vocab) (d2t holds
// the differences). Errors: invalid (draft_vocab above the vocabulary, named by flag), failed
// (cannot write).
Status synth_eagle3(const devices::ModelConfig& target, const Eagle3SynthOptions& options,
                    const std::string& out_dir);

struct AddedToken {
  std::string content;
  bool special = true;  // false: an added token that decodes as text (e.g. <think>)
};
// The arch's added tokens (they take the last ids): llama <s>, </s>; minimax-m2 ]~!b[,
// ]~b], [e~[, <think>, </think>, <minimax:tool_call>, </minimax:tool_call>.
std::vector<AddedToken> synth_added_tokens(devices::Arch arch);

// The tokenizer.json text for `vocab` ids: 256 byte tokens (id = byte value), then merges,
// then reserved specials filling any gap, then `added` (the last ids). Deterministic.
// Precondition (asserted): vocab >= 256 + added.size().
std::string synth_tokenizer_json(uint32_t vocab, const std::vector<AddedToken>& added);

}  // namespace tandem::tools
