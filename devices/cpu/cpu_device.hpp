// tandem/devices/cpu: the reference backend, a real transformer forward on the host.
//
// Llama family (Llama, Mistral, Qwen2 incl. q/k/v biases, llama2.c checkpoints) and
// MiniMax-M2-style layers (QK RMSNorm, partial rotary, sigmoid-routed MoE with a selection
// bias, no shared expert). Compute is fp32: matmuls through OpenBLAS sgemm (its own thread
// pool, `threads` wide), attention and the elementwise ops in plain loops on the calling
// thread. KV pool: fp32 (element_bytes 4), page-aligned anonymous memory, zero-filled.
//
// Cost per pass: one weight sweep (all layers) per pass plus attention reading start_pos KV
// rows per new token. Not thread-safe: one caller at a time.
#pragma once

#include <memory>

#include "devices/cpu/weights.hpp"
#include "devices/device.hpp"

namespace tandem::devices::cpu {

struct CpuDeviceOptions {
  uint32_t block_tokens = 16;
  uint32_t blocks_total = 0;  // 0: derive from kv_bytes_max
  uint64_t kv_bytes_max = 0;
  uint32_t threads = 0;       // 0 = leave OpenBLAS's default (all cores)
};

// Builds a device from loaded weights. Errors: invalid (block_tokens 0, no KV size given,
// pool too large to allocate -> failed).
Result<std::unique_ptr<Device>> make_cpu_device(ModelWeights weights,
                                                const CpuDeviceOptions& options);

// Loads spec.model_path with load_model() and builds the device.
Result<std::unique_ptr<Device>> make_cpu_device(const DeviceSpec& spec);

// Weight bytes one single-token decode step reads (the memory-bandwidth bound's numerator).
uint64_t weight_bytes_per_token(const Device& cpu_device);

}  // namespace tandem::devices::cpu
