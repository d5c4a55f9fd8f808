// The staged form of a tensor-core EXL2 set's input (exl2_gemm.h, exl2_mma_set): fp16 activations in
// the fragment order of each job's 128-row chunks, written by exl2_mma_stage_kernel or by the op that
// produces the input (Exl2MmaStaging). For the .cu files whose kernels write it; the index
// arithmetic (EXL_HD) compiles for the host too.
#pragma once
#include <cuda_fp16.h>

#include "kernels/cuda/exl2_gemm.h"
#include "kernels/cuda/host_device.h"
#include "kernels/cuda/row_norm.cuh"

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

// Where (permuted row j, slot p) lies in a row's 16-byte units (Exl2MmaStaging::from): 8 · unit + k % 8,
// unit = 2 · (8 · chunk + step) + k-half.
EXL_HD int mma_x_unit_slot(int j, int p) {
  const int c = j >> 7, t = (j >> 5) & 3, s = p >> 2, k = 2 * t + 8 * ((p >> 1) & 1) + (p & 1);
  return ((c * 8 + s) * 2 + (k >> 3)) * 8 + (k & 7);
}
// Half index of unit u of row m of MB in the activation tile: mma_x_index(MB, m, j, p) is
// mma_x_unit_index(MB, m, u) + k % 8 for (u, k % 8) of mma_x_unit_slot(j, p).
EXL_HD int mma_x_unit_index(int MB, int m, int u) { return ((u >> 1) * MB + (m & ~7)) * 16 + (u & 1) * 64 + (m & 7) * 8; }

// Half index of the activation tile that holds row r of `rows` in job `job`'s part of a staged area.
EXL_HD size_t mma_staged_tile(int rows, int K, int job, int r) {
  const int mb = exl2_mma_rows_per_block(rows);
  return (size_t(job) * size_t((rows + mb - 1) / mb) + size_t(r / mb)) * size_t(mma_chunks(K)) * size_t(mb) * k_mma_chunk;
}

// Half index of (row r of `rows`, permuted row j, slot p) in job `job`'s part of a staged area
// (exl2_mma_staged_bytes(rows, K, ·)): the jobs' parts follow one another, each a row block after
// another of chunks(K) · MB · 128 halves.
EXL_HD size_t mma_staged_index(int rows, int K, int job, int r, int j, int p) {
  const int mb = exl2_mma_rows_per_block(rows), yb = r / mb;
  return mma_staged_tile(rows, K, job, r) + size_t(mma_x_index(mb, r - yb * mb, j, p));
}

// silu(g) · u as every staged MLP input forms it (the staging kernel and the gate/up sums alike,
// so that both give the same bits).
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// The half mma_stage_store stores for value v.
__device__ __forceinline__ __half mma_stage_half(float v) { return __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f)); }

// Half h of row r at stage-map entry `at` (Exl2MmaStaging::at[job][n]) of job `job` of a staged
// input of `rows` rows and K inputs.
__device__ __forceinline__ void mma_stage_store_at(uint16_t* staged, int rows, int K, int job, int r, int at, __half h) {
  reinterpret_cast<__half*>(staged)[mma_staged_index(rows, K, job, r, at >> 5, at & 31)] = h;
}

// Value v of input feature n (< s.K) of row r, saturated to fp16, for every job of s.
__device__ __forceinline__ void mma_stage_store(const Exl2MmaStaging& s, int r, int n, float v) {
  const __half h = mma_stage_half(v);
#pragma unroll
  for (int j = 0; j < k_exl2_gemv_max_jobs; ++j)
    if (j < s.n_jobs) mma_stage_store_at(s.staged, s.rows, s.K, j, r, s.at[j][n], h);
}

// Rows of up to this many inputs go through shared memory (mma_stage_row; 40 KiB of fp16).
inline constexpr int k_mma_stage_row_max = 20480;
// Whether producers that hold whole rows stage them with mma_stage_row (every job has its from
// map and a row fits; else value by value, mma_stage_store).
EXL_HD bool mma_stage_rowwise(const Exl2MmaStaging& s) {
  if (s.n_jobs < 1 || s.K > k_mma_stage_row_max) return false;
  for (int j = 0; j < s.n_jobs; ++j)
    if (!s.from[j]) return false;
  return true;
}
// Dynamic shared memory a whole-row producer launches with for staging s.
EXL_HD size_t mma_stage_row_bytes(const Exl2MmaStaging& s) {
  return mma_stage_rowwise(s) ? size_t(s.K) * sizeof(uint16_t) : 0;
}

// One 16-byte unit of a row's staged input out of the row in shared memory: the halves of the
// eight input features that the unit's gather map entries (a, b: Exl2MmaStaging::from[j][8u ..])
// name, zeros for −1.
__device__ __forceinline__ uint4 mma_stage_unit(const __half* row, int4 a, int4 b) {
  const unsigned short* const h = reinterpret_cast<const unsigned short*>(row);
  const int n[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    w[q] = uint32_t(n[2 * q] >= 0 ? h[n[2 * q]] : 0u) | uint32_t(n[2 * q + 1] >= 0 ? h[n[2 * q + 1]] : 0u) << 16;
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Row r's staged input for every job of s (each with its from map) out of `row`: the row's K values
// in shared memory as mma_stage_store would round them. Block-wide (every thread calls it; the row
// is complete before the call); one 16-byte store per unit, zeros at the padding rows, so the same
// bytes as mma_stage_store for every n and mma_stage_pad for every padding row.
__device__ __forceinline__ void mma_stage_row(const Exl2MmaStaging& s, int r, const __half* row) {
  const int mb = exl2_mma_rows_per_block(s.rows), m = r % mb, units = mma_chunks(s.K) * 16;
#pragma unroll 1
  for (int j = 0; j < s.n_jobs; ++j) {
    const int4* const from = reinterpret_cast<const int4*>(s.from[j]);
    uint4* const out = reinterpret_cast<uint4*>(s.staged + mma_staged_tile(s.rows, s.K, j, r));
    for (int u = int(threadIdx.x); u < units; u += int(blockDim.x))
      out[mma_x_unit_index(mb, m, u) / 8] = mma_stage_unit(row, from[2 * u], from[2 * u + 1]);
  }
}

// Zero at padding row k (s.K <= k < 128 · chunks) of row r, for every job of s.
__device__ __forceinline__ void mma_stage_pad(const Exl2MmaStaging& s, int r, int k) {
  __half* const out = reinterpret_cast<__half*>(s.staged);
#pragma unroll
  for (int j = 0; j < k_exl2_gemv_max_jobs; ++j)
    if (j < s.n_jobs) out[mma_staged_index(s.rows, s.K, j, r, k, k & 31)] = __float2half_rn(0.0f);
}

// Row r of a norm, w[i] · (xr[i] · inv) for i < s.K, staged for every job of s with its padding
// rows. Block-wide (every thread calls it); `row`: mma_stage_row_bytes(s) of shared memory, used
// where mma_stage_rowwise(s), else the values go one by one. xr is read through L2 (it may have
// been written by other blocks of the same launch).
__device__ __forceinline__ void mma_stage_normed_row(const Exl2MmaStaging& s, int r, const float* xr, const float* w,
                                                     float inv, __half* row) {
  const int step = int(blockDim.x);
  if (mma_stage_rowwise(s)) {
#pragma unroll 4
    for (int i = int(threadIdx.x); i < s.K; i += step) row[i] = mma_stage_half(w[i] * (__ldcg(xr + i) * inv));
    __syncthreads();
    mma_stage_row(s, r, row);
    return;
  }
#pragma unroll 4
  for (int i = int(threadIdx.x); i < s.K; i += step) mma_stage_store(s, r, i, w[i] * (__ldcg(xr + i) * inv));
  for (int k = s.K + int(threadIdx.x); k < mma_chunks(s.K) * k_mma_chunk; k += step) mma_stage_pad(s, r, k);
}

// Values per thread of a k_row_threads block up to which a norm's row is staged with every load
// issued at once (mma_stage_norm_row_at_once): rows of up to 4,096 inputs.
inline constexpr int k_mma_norm_row_values = 4;
EXL_HD bool mma_stage_norm_at_once(const Exl2MmaStaging& s) {
  return mma_stage_rowwise(s) && s.K <= k_mma_norm_row_values * k_row_threads;
}

// Row r of a norm staged for every job of s where mma_stage_norm_at_once(s), by a block of
// k_row_threads threads: w[i] · (xr[i] · inv), inv of the row's squares with `eps` as
// block_inv_rms forms it, so the same bytes as mma_stage_normed_row after that norm. The row, its
// weights and every job's gather map entries are loaded before the squares are summed (a thread
// holds 4 values and one unit per job), so that the block waits for memory once where the passes
// of mma_stage_normed_row wait once each. xr is read through L2 (other blocks of the launch may
// have written it); `row`: mma_stage_row_bytes(s) of shared memory.
__device__ __forceinline__ void mma_stage_norm_row_at_once(const Exl2MmaStaging& s, int r, const float* xr,
                                                           const float* w, float eps, __half* row) {
  constexpr int V = k_mma_norm_row_values;
  const int t = int(threadIdx.x), K = s.K, units = mma_chunks(K) * 16;
  float xv[V], wv[V];
#pragma unroll
  for (int p = 0; p < V; ++p) {
    const int i = t + p * k_row_threads;
    xv[p] = i < K ? __ldcg(xr + i) : 0.0f;
    wv[p] = i < K ? w[i] : 0.0f;
  }
  int4 a[k_exl2_gemv_max_jobs], b[k_exl2_gemv_max_jobs];
#pragma unroll
  for (int j = 0; j < k_exl2_gemv_max_jobs; ++j)
    if (j < s.n_jobs && t < units) {
      const int4* const from = reinterpret_cast<const int4*>(s.from[j]);
      a[j] = from[2 * t], b[j] = from[2 * t + 1];
    }
  double ss = 0;
#pragma unroll
  for (int p = 0; p < V; ++p)
    if (t + p * k_row_threads < K) ss += double(xv[p]) * double(xv[p]);
  const float inv = block_inv_rms(ss, K, eps);
#pragma unroll
  for (int p = 0; p < V; ++p)
    if (t + p * k_row_threads < K) row[t + p * k_row_threads] = mma_stage_half(wv[p] * (xv[p] * inv));
  __syncthreads();
  if (t >= units) return;
  const int mb = exl2_mma_rows_per_block(s.rows), m = r % mb;
#pragma unroll
  for (int j = 0; j < k_exl2_gemv_max_jobs; ++j)
    if (j < s.n_jobs)
      reinterpret_cast<uint4*>(s.staged + mma_staged_tile(s.rows, K, j, r))[mma_x_unit_index(mb, m, t) / 8] =
          mma_stage_unit(row, a[j], b[j]);
}

// Row r of rms_norm(xr) ⊙ w (`eps`) staged for every job of s by a block of k_row_threads threads,
// the norm's squares summed as row_norm.cuh sums them (so the bits of the norm kernels): in one
// wait for memory where mma_stage_norm_at_once(s), else pass by pass. xr is read through L2
// (other blocks of the same launch may have written it); `row`: mma_stage_row_bytes(s) of shared
// memory.
__device__ __forceinline__ void mma_stage_norm_row(const Exl2MmaStaging& s, int r, const float* xr, const float* w,
                                                   float eps, __half* row) {
  if (mma_stage_norm_at_once(s)) return mma_stage_norm_row_at_once(s, r, xr, w, eps, row);
  double ss = 0;
#pragma unroll 4
  for (int i = int(threadIdx.x); i < s.K; i += k_row_threads) {
    const float v = __ldcg(xr + i);
    ss += double(v) * double(v);
  }
  mma_stage_normed_row(s, r, xr, w, block_inv_rms(ss, s.K, eps), row);
}

}  // namespace exl::cuda
