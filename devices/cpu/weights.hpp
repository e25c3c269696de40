// tandem/devices/cpu: model weights in fp32, loaded from a llama2.c checkpoint or an HF
// directory (config.json + *.safetensors, single or sharded).
//
// Storage: every weight is fp32 in memory. fp32 tensors are used in place from a read-only
// mmap of the file (no copy) when 4-byte aligned; BF16/F16 tensors are converted to fp32
// once, at load (so load needs 2x the checkpoint size in RAM for half-precision models).
// Matrices are row-major [out, in] (PyTorch/llama2.c convention): y = W x.
//
// Errors (never a crash): not_found (missing file/dir), invalid (bad header, truncated file,
// offsets outside the file, shape mismatch, missing tensor, bad config.json), unimplemented
// (unknown architecture, unsupported dtype such as F8, rope_scaling).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "devices/device.hpp"

namespace tandem::devices::cpu {

// A read-only mapping of a whole file. Move-only resource; unmaps on destruction.
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(const std::byte* data, uint64_t size_bytes, std::string path);
  const std::byte* data_;
  uint64_t size_bytes_;
  std::string path_;
};

struct ExpertWeights {
  const float* w1 = nullptr;  // gate [moe_intermediate, hidden]
  const float* w2 = nullptr;  // down [hidden, moe_intermediate]
  const float* w3 = nullptr;  // up   [moe_intermediate, hidden]
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [hidden]
  const float* wq = nullptr;         // [heads*head_dim, hidden]
  const float* wk = nullptr;         // [kv_heads*head_dim, hidden]
  const float* wv = nullptr;         // [kv_heads*head_dim, hidden]
  const float* wo = nullptr;         // [hidden, heads*head_dim]
  const float* bq = nullptr;         // optional biases (Qwen2)
  const float* bk = nullptr;
  const float* bv = nullptr;
  // qk_norm: q_norm has head_dim elements (per-head norm, shared by heads) or
  // heads*head_dim (one norm over the whole projection, MiniMax-M2); same for k_norm.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  uint32_t q_norm_elems = 0;
  uint32_t k_norm_elems = 0;
  const float* ffn_norm = nullptr;   // [hidden]
  const float* w1 = nullptr;         // dense gate [intermediate, hidden]
  const float* w2 = nullptr;         // dense down [hidden, intermediate]
  const float* w3 = nullptr;         // dense up   [intermediate, hidden]
  const float* router = nullptr;     // MoE [experts, hidden]
  const float* router_bias = nullptr;  // MoE [experts], selection only
  std::vector<ExpertWeights> experts;
};

// The storage weight pointers point into: file mappings (fp32 tensors used in place) and
// converted copies. Moving it keeps the pointers valid.
struct WeightStorage {
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<std::vector<float>> owned;
};

struct ModelWeights {
  ModelConfig config;
  const float* embed = nullptr;       // [vocab, hidden]
  const float* final_norm = nullptr;  // [hidden]
  const float* lm_head = nullptr;     // [vocab, hidden]; == embed when tied
  std::vector<LayerWeights> layers;
  uint64_t bytes_per_token = 0;  // fp32 bytes a one-token step reads (MoE: router + top-k)
  WeightStorage storage;  // what the pointers above point into
};

// llama2.c checkpoint (7 int32 header: dim, hidden_dim, layers, heads, kv_heads, vocab, seq_len;
// vocab < 0 means an untied classifier follows). RoPE interleaved, theta 10000, eps 1e-5.
Result<ModelWeights> load_llama2c(const std::string& path);

// HF directory. Architectures: llama, mistral, qwen2 (model_type), minimax_m2.
// RoPE rotate_half. Tensor dtypes F32, BF16, F16.
// Weights: model.safetensors, or (when model.safetensors.index.json exists) the shards its
// weight_map names, each tensor taken from the shard the index puts it in. Errors as above,
// plus: not_found/failed naming the index and the shard that cannot be opened; invalid for a
// malformed index (naming it) or a tensor the index places in a shard that lacks it (naming
// index, tensor and shard).
Result<ModelWeights> load_hf_dir(const std::string& dir);

// Dispatches on what the path is: a directory -> HF, a file -> llama2.c.
Result<ModelWeights> load_model(const std::string& path);

// Reads config.json alone (no tensors). Exposed for tests and `tandem model` tools.
Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& file);

// The model's shape and a fingerprint of its files, without reading a tensor: an HF directory's
// config.json (fingerprint: its text plus every *.safetensors file's name and size), a llama2.c
// file's header (or the one .bin beside tokenizer.bin in a directory; fingerprint: the header
// and the file's size). For compile-cache keys (devices/rbln/rbln_compile.hpp).
struct ModelShape {
  ModelConfig config;
  std::string fingerprint;  // bytes to hash, not printable
};
Result<ModelShape> read_model_shape(const std::string& path);

}  // namespace tandem::devices::cpu
