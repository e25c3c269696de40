#include "devices/cpu/ops.hpp"

#include <cblas.h>

#include "devices/cpu/small_gemm.hpp"

namespace tandem::devices::cpu {

void gemm_nt(const float* a, uint32_t m, uint32_t k, const float* w, uint32_t n, float* c,
             float beta) {
  RT_ASSERT(m > 0 && n > 0 && k > 0, "gemm dims", m, n, k);
  RT_ASSERT(a != nullptr && w != nullptr && c != nullptr, "gemm null operand");
  if (small_gemm_nt(a, m, k, w, n, c, beta)) return;
  if (m == 1) {
    // The weight sweep is the whole cost; OpenBLAS's sgemm path packs W first, sgemv does not.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w,
                static_cast<int>(k), a, 1, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), w, static_cast<int>(k), beta, c,
              static_cast<int>(n));
}

void rmsnorm(float* out, const float* x, const float* weight, uint32_t n, float eps) {
  float ss = 0.0f;
  for (uint32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (uint32_t i = 0; i < n; ++i) out[i] = weight[i] * (scale * x[i]);
}

void rope(float* vec, uint32_t heads_count, const RopeShape& shape, uint32_t pos) {
  uint32_t half = shape.rotary_dim / 2;
  for (uint32_t j = 0; j < half; ++j) {
    float freq = 1.0f / std::pow(shape.theta, static_cast<float>(2 * j) /
                                                  static_cast<float>(shape.rotary_dim));
    float angle = static_cast<float>(pos) * freq;
    float cs = std::cos(angle), sn = std::sin(angle);
    for (uint32_t h = 0; h < heads_count; ++h) {
      float* head = vec + uint64_t{h} * shape.head_dim;
      uint32_t a = shape.style == RopeStyle::interleaved ? 2 * j : j;
      uint32_t b = shape.style == RopeStyle::interleaved ? 2 * j + 1 : j + half;
      float x0 = head[a], x1 = head[b];
      head[a] = x0 * cs - x1 * sn;
      head[b] = x0 * sn + x1 * cs;
    }
  }
}

}  // namespace tandem::devices::cpu
