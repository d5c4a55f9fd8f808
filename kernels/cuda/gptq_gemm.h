// GPTQ 4-bit matrix products on the GPU (kernels in gptq_gemm.cu). At load the rows are reordered
// (stable, by group) so that every group is a contiguous run of rows; `qweight` holds the
// reordered rows, `perm[j]` the original row of reordered row j and `row_group[j]` its group.
// Without act-order the order is the identity and qweight is the file's tensor unchanged.
//   - gptq_gemv: as exl2_gemv (4 columns per thread, K-slices of `k_slice` rows, multiple of 32,
//     activations gathered through perm, partial sums added atomically into y, which must hold
//     zeros or the bias).
//   - gptq_reconstruct: columns [n0, n0+nc) as fp16 [K, nc] row-major in original row order.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace exl::cuda {

struct GptqDeviceView {
  const uint32_t* qweight = nullptr;    // [K/8, N], reordered rows, row j at bits 4·(j%8) of word j/8
  const uint32_t* qzeros = nullptr;     // [G, N/8]
  const uint16_t* scales = nullptr;     // [G, N] fp16
  const int32_t* row_group = nullptr;   // [K]
  const int32_t* perm = nullptr;        // [K]
  int zero_add = 1;                     // 1 for the GPTQ v1 zero convention, 0 for v2
  int K = 0, N = 0;
};

// y[rows, N] += x[rows, K] · Wᵀ.
cudaError_t gptq_gemv(const GptqDeviceView& w, const float* x, float* y, int rows, int k_slice, cudaStream_t stream);

// out[K, nc] (fp16 bits) = W[n0 .. n0+nc) transposed, rows in original input order.
cudaError_t gptq_reconstruct(const GptqDeviceView& w, int n0, int nc, uint16_t* out, cudaStream_t stream);
// The same in fp32 (the exact path of cuda_linear.h).
cudaError_t gptq_reconstruct_f32(const GptqDeviceView& w, int n0, int nc, float* out, cudaStream_t stream);

}  // namespace exl::cuda
