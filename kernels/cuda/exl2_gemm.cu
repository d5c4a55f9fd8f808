#include <cuda_fp16.h>

#include "kernels/cuda/exl2_gemm.h"

namespace exl::cuda {
namespace {

struct Cols4 {
  uint32_t v[4];
};

__device__ __forceinline__ Cols4 load4(const uint32_t* p) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  return {{u.x, u.y, u.z, u.w}};
}

// float(q) − zero for a small unsigned q without an int→float conversion (a slow unit): the bits
// 0x4B000000 | q are the float 2^23 + q; `z23` is 2^23 + zero. Exact.
__device__ __forceinline__ float q_minus(uint32_t q, float z23) { return __uint_as_float(0x4B000000u | q) - z23; }

// Accumulates rows [r0, r0+cnt) of one group (r0 relative to the group) for 4 columns.
// xs points at the shared activations of the first of those rows; rows of xs are xs_stride apart.
template <int BITS, int MB>
__device__ void exl2_group_dot(const uint32_t* qw, int np, int n0, int qrow_start, int r0, int cnt, const float* xs,
                               int xs_stride, float (&acc)[MB][4]) {
  constexpr float Z23 = 8388608.0f + float(1 << (BITS - 1));
  int bit = r0 * BITS;
  int i = 0;
  // Whole 32-row blocks from a word boundary; activations read 4 rows at a time when aligned.
  if ((bit & 31) == 0 && (reinterpret_cast<uintptr_t>(xs) & 15) == 0 && (xs_stride & 3) == 0) {
    for (; i + 32 <= cnt; i += 32, bit += 32 * BITS) {
      const uint32_t* wp = qw + size_t(qrow_start + (bit >> 5)) * np + n0;
      uint32_t w[4][BITS];
#pragma unroll
      for (int b = 0; b < BITS; ++b) {
        const Cols4 c4 = load4(wp + size_t(b) * np);
#pragma unroll
        for (int c = 0; c < 4; ++c) w[c][b] = c4.v[c];
      }
#pragma unroll
      for (int r4 = 0; r4 < 32; r4 += 4) {
        float wv[4][4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
          for (int c = 0; c < 4; ++c) wv[k][c] = q_minus(exl2_block_value<BITS>(w[c], r4 + k), Z23);
#pragma unroll
        for (int m = 0; m < MB; ++m) {
          const float4 xv = *reinterpret_cast<const float4*>(xs + m * xs_stride + i + r4);
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc[m][c] = fmaf(wv[0][c], xv.x, acc[m][c]);
            acc[m][c] = fmaf(wv[1][c], xv.y, acc[m][c]);
            acc[m][c] = fmaf(wv[2][c], xv.z, acc[m][c]);
            acc[m][c] = fmaf(wv[3][c], xv.w, acc[m][c]);
          }
        }
      }
    }
  }
  if (i >= cnt) return;
  int wrow = qrow_start + (bit >> 5);
  const int sh = bit & 31;
  uint64_t buf[4];
  int have = 32 - sh;
  {
    const Cols4 c4 = load4(qw + size_t(wrow) * np + n0);
#pragma unroll
    for (int c = 0; c < 4; ++c) buf[c] = uint64_t(c4.v[c]) >> sh;
  }
  for (; i < cnt; ++i) {
    if (have < BITS) {
      ++wrow;
      const Cols4 c4 = load4(qw + size_t(wrow) * np + n0);
#pragma unroll
      for (int c = 0; c < 4; ++c) buf[c] |= uint64_t(c4.v[c]) << have;
      have += 32;
    }
    float wv[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      wv[c] = q_minus(uint32_t(buf[c]) & ((1u << BITS) - 1u), Z23);
      buf[c] >>= BITS;
    }
    have -= BITS;
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      const float xv = xs[m * xs_stride + i];
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][c] = fmaf(wv[c], xv, acc[m][c]);
    }
  }
}

template <int MB>
__global__ void __launch_bounds__(k_gemv_threads) exl2_gemv_kernel(Exl2DeviceView w, const float* __restrict__ x,
                                                                   float* __restrict__ y, int rows, int k_slice) {
  extern __shared__ float xs[];  // [MB][k_slice]
  const int k0 = blockIdx.z * k_slice;
  const int k1 = min(w.K, k0 + k_slice);
  const int kc = k1 - k0;
  const int m0 = blockIdx.y * MB;
  const int mc = min(MB, rows - m0);
  for (int i = threadIdx.x; i < MB * kc; i += blockDim.x) {
    const int m = i / kc, j = i - m * kc;
    xs[m * k_slice + j] = m < mc ? x[size_t(m0 + m) * w.K + w.perm[k0 + j]] : 0.0f;
  }
  __syncthreads();
  const int n0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (n0 >= w.N) return;

  float acc[MB][4];
#pragma unroll
  for (int m = 0; m < MB; ++m)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[m][c] = 0.0f;

  for (int g = w.group_of_row[k0]; g < w.n_groups; ++g) {
    const Exl2GroupDesc gd = w.groups[g];
    if (gd.row_start >= k1) break;
    const int rb = max(k0, gd.row_start), re = min(k1, gd.row_start + gd.rows);
    if (rb >= re) continue;
    float gacc[MB][4];
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) gacc[m][c] = 0.0f;
    const int r0 = rb - gd.row_start, cnt = re - rb;
    const float* xg = xs + (rb - k0);
    switch (gd.bits) {
      case 2: exl2_group_dot<2, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
      case 3: exl2_group_dot<3, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
      case 4: exl2_group_dot<4, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
      case 5: exl2_group_dot<5, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
      case 6: exl2_group_dot<6, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
      default: exl2_group_dot<8, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
    }
    const float smax = __half2float(__ushort_as_half(w.q_scale_max[g]));
    const uint32_t* srow = w.q_scale + size_t(g) * (w.Np / 8);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float s = exl2_scale(srow, n0 + c, smax);
#pragma unroll
      for (int m = 0; m < MB; ++m) acc[m][c] = fmaf(gacc[m][c], s, acc[m][c]);
    }
  }
#pragma unroll
  for (int m = 0; m < MB; ++m) {
    if (m >= mc) break;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (n0 + c < w.N) atomicAdd(y + size_t(m0 + m) * w.N + n0 + c, acc[m][c]);
  }
}

// 32 rows of one group starting at a word boundary: the block's words are loaded once.
template <int BITS>
__device__ void reconstruct_block(const Exl2DeviceView& w, const Exl2GroupDesc& gd, int g, int n, int c, int j0,
                                  int nc, __half* __restrict__ out) {
  const uint32_t* wp = w.q_weight + size_t(gd.qrow_start + (((j0 - gd.row_start) * BITS) >> 5)) * w.Np + n;
  uint32_t words[BITS];
#pragma unroll
  for (int b = 0; b < BITS; ++b) words[b] = __ldg(wp + size_t(b) * w.Np);
  const float s = exl2_scale(w.q_scale + size_t(g) * (w.Np / 8), n, __half2float(__ushort_as_half(w.q_scale_max[g])));
#pragma unroll
  for (int r = 0; r < 32; ++r)
    out[size_t(w.perm[j0 + r]) * nc + c] =
        __float2half_rn(float(int(exl2_block_value<BITS>(words, r)) - (1 << (BITS - 1))) * s);
}

__global__ void exl2_reconstruct_kernel(Exl2DeviceView w, int n0, int nc, __half* __restrict__ out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= nc) return;
  const int n = n0 + c;
  const int j0 = blockIdx.y * 32;
  const int j_end = min(w.K, j0 + 32);
  const int g0 = w.group_of_row[j0];
  const Exl2GroupDesc g0d = w.groups[g0];
  if (j_end - j0 == 32 && g0d.row_start + g0d.rows >= j_end && (((j0 - g0d.row_start) * g0d.bits) & 31) == 0) {
    switch (g0d.bits) {
      case 2: reconstruct_block<2>(w, g0d, g0, n, c, j0, nc, out); return;
      case 3: reconstruct_block<3>(w, g0d, g0, n, c, j0, nc, out); return;
      case 4: reconstruct_block<4>(w, g0d, g0, n, c, j0, nc, out); return;
      case 5: reconstruct_block<5>(w, g0d, g0, n, c, j0, nc, out); return;
      case 6: reconstruct_block<6>(w, g0d, g0, n, c, j0, nc, out); return;
      default: reconstruct_block<8>(w, g0d, g0, n, c, j0, nc, out); return;
    }
  }
  for (int j = j0; j < j_end; ++j) {
    const int g = w.group_of_row[j];
    const Exl2GroupDesc gd = w.groups[g];
    const uint32_t q = exl2_value(w.q_weight, w.Np, n, gd, j);
    const float smax = __half2float(__ushort_as_half(w.q_scale_max[g]));
    const float s = exl2_scale(w.q_scale + size_t(g) * (w.Np / 8), n, smax);
    out[size_t(w.perm[j]) * nc + c] = __float2half_rn(float(int(q) - (1 << (gd.bits - 1))) * s);
  }
}

}  // namespace

cudaError_t exl2_gemv(const Exl2DeviceView& w, const float* x, float* y, int rows, int k_slice, cudaStream_t stream) {
  const int mb = gemv_rows_per_block(rows);
  const dim3 grid((w.N + k_gemv_cols_per_block - 1) / k_gemv_cols_per_block, (rows + mb - 1) / mb,
                  (w.K + k_slice - 1) / k_slice);
  const size_t smem = size_t(mb) * size_t(k_slice) * sizeof(float);
  switch (mb) {
    case 1: exl2_gemv_kernel<1><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
    case 2: exl2_gemv_kernel<2><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
    case 4: exl2_gemv_kernel<4><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
    default: exl2_gemv_kernel<8><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
  }
  return cudaGetLastError();
}

cudaError_t exl2_reconstruct(const Exl2DeviceView& w, int n0, int nc, uint16_t* out, cudaStream_t stream) {
  const dim3 grid((nc + 127) / 128, (w.K + 31) / 32);
  exl2_reconstruct_kernel<<<grid, 128, 0, stream>>>(w, n0, nc, reinterpret_cast<__half*>(out));
  return cudaGetLastError();
}

}  // namespace exl::cuda
