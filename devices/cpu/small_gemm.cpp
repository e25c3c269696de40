#include "devices/cpu/small_gemm.hpp"

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() as their masked-off source, which
// -Wmaybe-uninitialized reports at every use (a false positive, GCC PR 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string_view>

namespace tandem::devices::cpu {
namespace {

enum class Isa { none, avx2, avx512 };

// TANDEM_CPU_KERNELS=avx2 | blas narrows the choice (an operator's escape hatch, and how the
// kernels are compared on one machine: `blas` is the portable path a CPU without AVX2 takes,
// which the `cpu_device_portable` test runs); unset or anything else: the best the CPU has.
Isa detect() {
  __builtin_cpu_init();
  const char* want = std::getenv("TANDEM_CPU_KERNELS");
  std::string_view w = want == nullptr ? "" : want;
  if (w == "blas") return Isa::none;
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (w == "avx2") return avx2 ? Isa::avx2 : Isa::none;
  if (__builtin_cpu_supports("avx512f")) return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
  return Isa::none;
}

// Read once, on first use (not a namespace-scope initializer: a test's static-init skip
// decorators ask small_gemm_isa() before this file's initializers may have run).
Isa current_isa() {
  static const Isa isa = detect();
  return isa;
}

// W streams from DRAM (stories15M's 61 MB do not stay in a 32 MB L3 between passes), and the
// hardware prefetcher alone does not keep ahead once a chunk of W feeds several rows' FMAs: the
// lm head (32000 x 288) at 5 rows took 2.3-2.8 ms without this and 1.2-1.4 ms with it, 1 row
// 1.4 -> 0.9-1.0 ms (Zen 5, docs/benchmarks.md). Each load of W is paired with a prefetch of the
// line 8 KiB further on (W's rows are contiguous, so that is a stream; past W's end it is a
// no-op: prefetches do not fault). Prefetching changes no arithmetic: row invariance holds.
constexpr size_t prefetch_floats = 2048;

// One output column pair (j, j + 1) or a single column, for M rows. The K tail past the last
// full vector is added in scalar, in order, after the vector sum.
#define TANDEM_SMALL_GEMM(NAME, TARGET, VEC, LANES, ZERO, LOAD, FMA, REDUCE)                \
  template <int M>                                                                          \
  __attribute__((target(TARGET))) void NAME(const float* a, uint32_t k, const float* w,     \
                                            uint32_t n, float* c, float beta) {             \
    const uint32_t kv = k - k % LANES;                                                      \
    uint32_t j = 0;                                                                         \
    for (; j < n; j += 2) {                                                                 \
      const bool pair = j + 1 < n;                                                          \
      const float* w0 = w + size_t{j} * k;                                                  \
      const float* w1 = pair ? w0 + k : w0;                                                 \
      VEC x[M], y[M];                                                                       \
      _Pragma("GCC unroll 8") for (int i = 0; i < M; ++i) {                                 \
        x[i] = ZERO();                                                                      \
        y[i] = ZERO();                                                                      \
      }                                                                                     \
      _Pragma("GCC unroll 2") for (uint32_t p = 0; p < kv; p += LANES) {                    \
        _mm_prefetch(reinterpret_cast<const char*>(w0 + p + prefetch_floats), _MM_HINT_T0); \
        _mm_prefetch(reinterpret_cast<const char*>(w1 + p + prefetch_floats), _MM_HINT_T0); \
        VEC v0 = LOAD(w0 + p), v1 = LOAD(w1 + p);                                           \
        _Pragma("GCC unroll 8") for (int i = 0; i < M; ++i) {                               \
          VEC av = LOAD(a + size_t(i) * k + p);                                             \
          x[i] = FMA(av, v0, x[i]);                                                         \
          y[i] = FMA(av, v1, y[i]);                                                         \
        }                                                                                   \
      }                                                                                     \
      _Pragma("GCC unroll 8") for (int i = 0; i < M; ++i) {                                 \
        const float* ai = a + size_t(i) * k;                                                \
        float s0 = REDUCE(x[i]), s1 = REDUCE(y[i]);                                         \
        for (uint32_t p = kv; p < k; ++p) {                                                 \
          s0 += ai[p] * w0[p];                                                              \
          s1 += ai[p] * w1[p];                                                              \
        }                                                                                   \
        float* ci = c + size_t(i) * n + j;                                                  \
        ci[0] = beta == 0.0f ? s0 : s0 + beta * ci[0];                                      \
        if (pair) ci[1] = beta == 0.0f ? s1 : s1 + beta * ci[1];                            \
      }                                                                                     \
    }                                                                                       \
  }

__attribute__((target("avx2,fma"))) inline float reduce8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}
__attribute__((target("avx2,fma"))) inline __m256 zero8() { return _mm256_setzero_ps(); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"))) inline __m256 fma8(__m256 a, __m256 b, __m256 c) {
  return _mm256_fmadd_ps(a, b, c);
}
__attribute__((target("avx512f"))) inline float reduce16(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // + the other 256-bit half
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // + the other 128-bit quarter
  __m128 x = _mm512_castps512_ps128(v);
  x = _mm_hadd_ps(x, x);
  x = _mm_hadd_ps(x, x);
  return _mm_cvtss_f32(x);
}
__attribute__((target("avx512f"))) inline __m512 zero16() { return _mm512_setzero_ps(); }
__attribute__((target("avx512f"))) inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
__attribute__((target("avx512f"))) inline __m512 fma16(__m512 a, __m512 b, __m512 c) {
  return _mm512_fmadd_ps(a, b, c);
}

TANDEM_SMALL_GEMM(gemm_avx2, "avx2,fma", __m256, 8, zero8, load8, fma8, reduce8)
TANDEM_SMALL_GEMM(gemm_avx512, "avx512f", __m512, 16, zero16, load16, fma16, reduce16)
#undef TANDEM_SMALL_GEMM

template <int M>
void run(Isa which, const float* a, uint32_t k, const float* w, uint32_t n, float* c,
         float beta) {
  if (which == Isa::avx512) {
    gemm_avx512<M>(a, k, w, n, c, beta);
  } else {
    gemm_avx2<M>(a, k, w, n, c, beta);
  }
}

int64_t argmax_scalar(const float* x, uint32_t n) {
  uint32_t best = 0;
  for (uint32_t t = 0; t < n; ++t) {
    if (std::isnan(x[t])) return -1;
    if (x[t] > x[best]) best = t;
  }
  return best;
}

__attribute__((target("avx512f"))) int64_t argmax_avx512(const float* x, uint32_t n) {
  const uint32_t nv = n - n % 16;
  __m512 m = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (uint32_t i = 0; i < nv; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  if (nan != 0) return -1;
  float best = _mm512_reduce_max_ps(m);
  for (uint32_t i = nv; i < n; ++i) {
    if (std::isnan(x[i])) return -1;
    best = std::max(best, x[i]);
  }
  const __m512 b = _mm512_set1_ps(best);
  for (uint32_t i = 0; i < nv; i += 16) {
    __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), b, _CMP_EQ_OQ);
    if (eq != 0) return i + static_cast<uint32_t>(__builtin_ctz(eq));
  }
  for (uint32_t i = nv; i < n; ++i) {
    if (x[i] == best) return i;
  }
  return 0;  // unreachable: best is one of x
}

}  // namespace

int64_t row_argmax(const float* x, uint32_t n) {
  if (n == 0) return -1;
  if (current_isa() == Isa::avx512) return argmax_avx512(x, n);
  return argmax_scalar(x, n);
}

bool small_gemm_nt(const float* a, uint32_t m, uint32_t k, const float* w, uint32_t n, float* c,
                   float beta) {
  const Isa isa = current_isa();
  if (isa == Isa::none || m == 0 || m > small_gemm_rows_max || k == 0 || n == 0) return false;
  for (uint32_t first = 0; first < m; first += small_gemm_block_rows) {
    const float* ab = a + size_t{first} * k;
    float* cb = c + size_t{first} * n;
    switch (std::min(m - first, small_gemm_block_rows)) {
      case 1:
        run<1>(isa, ab, k, w, n, cb, beta);
        break;
      case 2:
        run<2>(isa, ab, k, w, n, cb, beta);
        break;
      case 3:
        run<3>(isa, ab, k, w, n, cb, beta);
        break;
      case 4:
        run<4>(isa, ab, k, w, n, cb, beta);
        break;
      case 5:
        run<5>(isa, ab, k, w, n, cb, beta);
        break;
      case 6:
        run<6>(isa, ab, k, w, n, cb, beta);
        break;
      case 7:
        run<7>(isa, ab, k, w, n, cb, beta);
        break;
      default:
        run<8>(isa, ab, k, w, n, cb, beta);
        break;
    }
  }
  return true;
}

const char* small_gemm_isa() {
  switch (current_isa()) {
    case Isa::avx512: return "avx512f";
    case Isa::avx2: return "avx2";
    case Isa::none: return "none";
  }
  return "none";
}

}  // namespace tandem::devices::cpu
