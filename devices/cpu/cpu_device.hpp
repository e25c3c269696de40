// tandem/devices/cpu: the reference backend, a real transformer forward on the host.
//
// Llama family (Llama, Mistral, Qwen2 incl. q/k/v biases, llama2.c checkpoints) and
// MiniMax-M2-style layers (QK RMSNorm, partial rotary, sigmoid-routed MoE with a selection
// bias, no shared expert). Compute is fp32: matmuls through OpenBLAS (sgemm for multi-token
// passes on `threads` threads, sgemv for one-token passes on `single_token_threads`),
// attention and the elementwise ops in plain loops on the calling thread. OpenBLAS's thread
// count is process-wide: the device sets it at the start of each pass, so several devices
// in one process must not run passes concurrently. KV pool: fp32 (element_bytes 4), page-aligned anonymous memory, zero-filled.
//
// Cost per pass: one weight sweep (all layers) per pass plus attention reading start_pos KV
// rows per new token. Not thread-safe: one caller at a time.
#pragma once

#include <memory>
#include <string>

#include "devices/cpu/weights.hpp"
#include "devices/device.hpp"

namespace tandem::devices::cpu {

struct CpuDeviceOptions {
  uint32_t block_tokens = 16;
  uint32_t blocks_total = 0;  // 0: derive from kv_bytes_max
  uint64_t kv_bytes_max = 0;
  uint32_t threads = 0;       // BLAS threads for multi-token passes; 0 = all cores
  // BLAS threads for a pass of exactly one token (batch-1 decode: sgemv, bandwidth-bound);
  // 0 = same as `threads`. Default 1: one core streams the weights as fast as two here, and
  // a 2-thread sgemv pays a thread handoff per projection (~45 per step), which costs a
  // scheduler slice each time the cores are shared (docs/benchmarks.md#device).
  uint32_t single_token_threads = 1;
  // An EAGLE-3 head directory (eagle3.hpp) loaded beside the target; empty: none.
  std::string draft_model_path;
};

// Builds a device from loaded weights. Errors: invalid (block_tokens 0, no KV size given,
// pool too large to allocate -> failed).
Result<std::unique_ptr<Device>> make_cpu_device(ModelWeights weights,
                                                const CpuDeviceOptions& options);

// Loads spec.model_path with load_model() and builds the device.
Result<std::unique_ptr<Device>> make_cpu_device(const DeviceSpec& spec);

// One pipeline stage of a prefill pass: layers [layer_first, layer_end) of `seq` (whose earlier
// positions' KV of those layers is in the pool), from the token embeddings when layer_first is
// 0, else from `hidden_in` (tokens x hidden, the previous stage's output). The KV of those
// layers is written as a whole pass writes it. Output: the residual stream after layer_end - 1
// (tokens x hidden), or, for the last stage, the logits of the last token. For the conformance
// fake's pipeline-stage graphs (tests/rbln_fake). Errors: invalid (a layer range outside the
// model, a hidden size that is not tokens x hidden, the checks of a prefill pass).
struct StageOutput {
  std::vector<float> hidden;  // layer_end < layers
  std::vector<float> logits;  // layer_end == layers: vocab values
};
Result<StageOutput> run_stage(Device& cpu_device, const PrefillSeq& seq, uint32_t layer_first,
                              uint32_t layer_end, std::span<const float> hidden_in);

// Weight bytes one single-token decode step reads (the memory-bandwidth bound's numerator).
uint64_t weight_bytes_per_token(const Device& cpu_device);

// OpenBLAS kernel choice. Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels from the
// CPU model at load; a CPU model it does not know (e.g. family 6 model 207, Emerald Rapids,
// in a VM) falls back to "Prescott", SSE3-only kernels ~4x slower than AVX2 ones. When the
// operator has not set OPENBLAS_CORETYPE and the library reports Prescott on a CPU with
// AVX2+FMA, this re-runs OpenBLAS's own dynamic selection with OPENBLAS_CORETYPE set to
// SkylakeX (AVX-512 F/BW/DQ/VL present) or Haswell (AVX2+FMA). Runs once per process
// (make_cpu_device calls it before any BLAS call); later calls only report.
// Returns a one-line description, e.g. "OpenBLAS core SkylakeX (was Prescott: unknown CPU)".
std::string select_blas_kernels();

}  // namespace tandem::devices::cpu
