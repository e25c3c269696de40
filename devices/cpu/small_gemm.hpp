// tandem/devices/cpu: C[M,N] = A[M,K] * W[N,K]^T + beta * C for few rows (M <= 64): a decode
// step of a few sequences, or sequences verifying k drafts each in k+1-row passes. Rows go in
// blocks of 8 (all 8 rows' accumulators in registers), W streamed once per block.
//
// Why not BLAS: OpenBLAS's sgemm packs W for every call, so at M = 5 a stories15M pass costs
// ~4x a one-row sgemv, and speculation's verification pass would cost what it saves
// (docs/benchmarks.md "Speculative decoding"). These kernels stream W once, two of its rows at a
// time against all M rows of A held in registers, with AVX-512F or AVX2+FMA chosen at run
// time (__builtin_cpu_supports).
//
// Row-invariant: row i of C is computed by the same operations in the same order whatever M
// is, so a sequence's logits are bit-identical whether its pass has 1 row or 5, or shares the
// step with other sequences (up to M = 64). Greedy output with speculation is then exactly the
// output without it on this device.
//
// Above 8 rows W is streamed once per block of 8, and still beats OpenBLAS's sgemm up to 64
// rows on this machine (stories15M's lm head, 1 thread: 16 rows 4.5 vs 7.8 ms, 40 rows 12.3 vs
// 12.9 ms, 64 rows 17.4 vs 19.5 ms); past 64 (prefill chunks) sgemm's packing pays.
#pragma once

#include <cstdint>

namespace tandem::devices::cpu {

inline constexpr uint32_t small_gemm_rows_max = 64;
inline constexpr uint32_t small_gemm_block_rows = 8;  // rows per sweep of W

// False (nothing written) when the CPU has neither AVX-512F nor AVX2+FMA, or m is outside
// [1, small_gemm_rows_max]: the caller uses BLAS.
bool small_gemm_nt(const float* a, uint32_t m, uint32_t k, const float* w, uint32_t n, float* c,
                   float beta);

// The lowest index of the largest of x[0..n), or -1 when x holds a NaN (or n is 0). Vectorized
// like small_gemm_nt (a decode step's argmax rows at a 200,064-token vocabulary scan ~64M
// floats).
int64_t row_argmax(const float* x, uint32_t n);

// "avx512f", "avx2" or "none" (the kernel small_gemm_nt uses here).
const char* small_gemm_isa();

}  // namespace tandem::devices::cpu
