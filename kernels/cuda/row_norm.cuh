// A row's RMS norm factor as every norm kernel forms it (norm_rope_act.cu, and the tensor-core
// sums that normalise the residual stream for the next set in exl2_gemm.cu): one block of
// k_row_threads threads per row, thread i summing the squares of elements i, i + k_row_threads, …
// in double, the parts reduced in a fixed order. Kernels that follow this keep each other's bits.
#pragma once
#include <cstdint>

namespace exl::cuda {

inline constexpr int k_row_threads = 1024;  // a 4096-wide row: 4 loads per thread, all in flight

// 1 / sqrt(mean square + eps) of a row of `dim` values whose sum of squares the block's
// k_row_threads threads hold in parts (`ss`: double, reduced in a fixed order); every thread of
// the block calls it and gets the same value.
__device__ __forceinline__ float block_inv_rms(double ss, int64_t dim, float eps) {
  __shared__ double partial[k_row_threads / 32];
  __shared__ float inv_s;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int i = 0; i < k_row_threads / 32; ++i) t += partial[i];
    inv_s = float(1.0 / sqrt(t / double(dim) + double(eps)));
  }
  __syncthreads();
  return inv_s;
}

// The thread's part of a row's sum of squares.
__device__ __forceinline__ double row_sum_squares(const float* xr, int64_t dim) {
  double ss = 0;
#pragma unroll 4
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) ss += double(xr[d]) * double(xr[d]);
  return ss;
}

}  // namespace exl::cuda
