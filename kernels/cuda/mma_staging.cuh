// The staged form of a tensor-core EXL2 set's input (exl2_gemm.h, exl2_mma_set): fp16 activations in
// the fragment order of each job's 128-row chunks, written by exl2_mma_stage_kernel or by the op that
// produces the input (Exl2MmaStaging). For the .cu files whose kernels write it; the index
// arithmetic (EXL_HD) compiles for the host too.
#pragma once
#include <cuda_fp16.h>

#include "kernels/cuda/exl2_gemm.h"
#include "kernels/cuda/host_device.h"

namespace exl::cuda {

inline constexpr int k_mma_chunk = 128;  // permuted rows per step of a warp: four 32-row blocks, one per quad lane

EXL_HD constexpr int mma_chunks(int K) { return (K + k_mma_chunk - 1) / k_mma_chunk; }

// Half index in the activation tile of (row m of MB, permuted row j of the slice, slot p of j's
// block): per 128-row chunk, per mma step s = p / 4 (16 rows of the chunk's fragment order), the
// step's MB × 16 halves as 8 × 8 "core matrices" of 128 contiguous bytes: (8-row group of m, k-half)
// at 128·(2·(m / 8) + k-half) halves, row m % 8 at 8 halves, k % 8 at 1. Slot p of quad lane
// t = (j / 32) % 4 is k = 2t + 8·((p / 2) % 2) + p % 2 of its step, where the lane's A fragment holds
// it. ldmatrix reads a B fragment pair from it, and wgmma (sm_90a) reads the step in place as a
// K-major operand without swizzle (leading byte offset 128, stride byte offset 256).
EXL_HD int mma_x_index(int MB, int m, int j, int p) {
  const int c = j >> 7, t = (j >> 5) & 3, s = p >> 2, k = 2 * t + 8 * ((p >> 1) & 1) + (p & 1);
  return ((c * 8 + s) * MB + (m & ~7)) * 16 + (k >> 3) * 64 + (m & 7) * 8 + (k & 7);
}

// Half index of (row r of `rows`, permuted row j, slot p) in job `job`'s part of a staged area
// (exl2_mma_staged_bytes(rows, K, ·)): the jobs' parts follow one another, each a row block after
// another of chunks(K) · MB · 128 halves.
EXL_HD size_t mma_staged_index(int rows, int K, int job, int r, int j, int p) {
  const int mb = exl2_mma_rows_per_block(rows), yb = r / mb;
  return (size_t(job) * size_t((rows + mb - 1) / mb) + size_t(yb)) * size_t(mma_chunks(K)) * size_t(mb) * k_mma_chunk +
         size_t(mma_x_index(mb, r - yb * mb, j, p));
}

// silu(g) · u as every staged MLP input forms it (the staging kernel and the gate/up sums alike,
// so that both give the same bits).
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Value v of input feature n (< s.K) of row r, saturated to fp16, for every job of s.
__device__ __forceinline__ void mma_stage_store(const Exl2MmaStaging& s, int r, int n, float v) {
  const __half h = __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f));
  __half* const out = reinterpret_cast<__half*>(s.staged);
#pragma unroll
  for (int j = 0; j < k_exl2_gemv_max_jobs; ++j)
    if (j < s.n_jobs) {
      const int at = s.at[j][n];
      out[mma_staged_index(s.rows, s.K, j, r, at >> 5, at & 31)] = h;
    }
}

// Zero at padding row k (s.K <= k < 128 · chunks) of row r, for every job of s.
__device__ __forceinline__ void mma_stage_pad(const Exl2MmaStaging& s, int r, int k) {
  __half* const out = reinterpret_cast<__half*>(s.staged);
#pragma unroll
  for (int j = 0; j < k_exl2_gemv_max_jobs; ++j)
    if (j < s.n_jobs) out[mma_staged_index(s.rows, s.K, j, r, k, k & 31)] = __float2half_rn(0.0f);
}

}  // namespace exl::cuda
