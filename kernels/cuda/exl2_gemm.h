// EXL2 matrix products on the GPU (kernels in exl2_gemm.cu). The packed tensors are the on-disk
// ones, uploaded unchanged (no load-time shuffle); `groups` and `group_of_row` are derived tables.
//   - exl2_gemv: few activation rows. Each thread owns 4 output columns and decodes their words
//     in registers (one 128-bit load per word row); each block handles a K-slice of `k_slice`
//     permuted rows (multiple of 32) whose activations it gathers through `perm` into shared
//     memory, and atomically adds its partial sums into y, which must hold zeros or the bias.
//   - exl2_reconstruct: dequantizes columns [n0, n0+nc) into an fp16 [K, nc] row-major matrix in
//     original row order (row perm[j] ← permuted row j), for the cuBLAS path of larger batches.
// Launchers return the launch status; all work is queued on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/exl2_decode.h"
#include "kernels/cuda/gemv_shape.h"

namespace exl::cuda {

struct Exl2DeviceView {
  const uint32_t* q_weight = nullptr;     // [QR, Np]
  const uint32_t* q_scale = nullptr;      // [G, Np/8]
  const uint16_t* q_scale_max = nullptr;  // [G] fp16
  const Exl2GroupDesc* groups = nullptr;  // [G]
  const int32_t* group_of_row = nullptr;  // [K] group index of each permuted row
  const int32_t* perm = nullptr;          // [K] permuted row j holds input feature perm[j]
  int n_groups = 0;
  int K = 0, N = 0, Np = 0;
};

// y[rows, N] += x[rows, K] · Wᵀ.
cudaError_t exl2_gemv(const Exl2DeviceView& w, const float* x, float* y, int rows, int k_slice, cudaStream_t stream);

// out[K, nc] (fp16 bits) = W[n0 .. n0+nc) transposed, rows in original input order.
cudaError_t exl2_reconstruct(const Exl2DeviceView& w, int n0, int nc, uint16_t* out, cudaStream_t stream);

}  // namespace exl::cuda
