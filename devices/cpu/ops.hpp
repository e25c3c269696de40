// tandem/devices/cpu: the forward pass's building blocks, shared by the target transformer
// (cpu_device.cpp) and the EAGLE-3 draft head (eagle3.cpp). fp32, row-major [out, in] weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "devices/device.hpp"

namespace tandem::devices::cpu {

// C[M,N] = A[M,K] * W[N,K]^T + beta * C. Up to 64 rows go through small_gemm_nt (one sweep of
// W per 8 rows, row-invariant: small_gemm.hpp); else (or without AVX2) one row through sgemv,
// more through OpenBLAS sgemm.
void gemm_nt(const float* a, uint32_t m, uint32_t k, const float* w, uint32_t n, float* c,
             float beta = 0.0f);

void rmsnorm(float* out, const float* x, const float* weight, uint32_t n, float eps);

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

struct RopeShape {
  uint32_t head_dim = 0;
  uint32_t rotary_dim = 0;  // even, <= head_dim
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::rotate_half;
};

// Rotates the first rotary_dim dims of each of `heads_count` heads of `vec` at `pos`.
void rope(float* vec, uint32_t heads_count, const RopeShape& shape, uint32_t pos);

// Causal attention of one query (all `heads` heads, GQA over kv_heads) over `count` KV rows:
// k_row(j) and v_row(j) give row j's kv_heads * head_dim elements. `scores` is scratch.
template <class KRow, class VRow>
void attend(const float* q, uint32_t heads, uint32_t kv_heads, uint32_t head_dim, uint32_t count,
            KRow k_row, VRow v_row, std::vector<float>& scores, float* out) {
  uint32_t group = heads / kv_heads;
  float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  scores.resize(count);
  for (uint32_t h = 0; h < heads; ++h) {
    const float* qh = q + uint64_t{h} * head_dim;
    uint64_t kv_off = uint64_t{h / group} * head_dim;
    float max_score = -INFINITY;
    for (uint32_t j = 0; j < count; ++j) {
      const float* kj = k_row(j) + kv_off;
      float dot = 0.0f;
      for (uint32_t d = 0; d < head_dim; ++d) dot += qh[d] * kj[d];
      scores[j] = dot * scale;
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0.0f;
    for (uint32_t j = 0; j < count; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    float* oh = out + uint64_t{h} * head_dim;
    std::fill(oh, oh + head_dim, 0.0f);
    for (uint32_t j = 0; j < count; ++j) {
      const float* vj = v_row(j) + kv_off;
      float p = scores[j] / sum;
      for (uint32_t d = 0; d < head_dim; ++d) oh[d] += p * vj[d];
    }
  }
}

}  // namespace tandem::devices::cpu
