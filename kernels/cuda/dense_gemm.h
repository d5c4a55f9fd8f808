// Unquantized linear layers on the GPU and the small helpers of every cuBLAS path (kernels in
// dense_gemm.cu; the cuBLAS calls themselves are host code in cuda_linear.cpp).
//   - dense_gemv: few rows; one warp per output column reads W's row [K] in its stored dtype and
//     accumulates in fp32; y = x·Wᵀ (+ bias), written (not accumulated).
//   - to_half / to_bf16: activations converted for tensor-core GEMMs (fp16 saturates at ±65504).
//   - fill_bias / add_bias: y[rows, N] = bias (or 0) / y += bias.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace exl::cuda {

enum class DenseType : int { f32, f16, bf16 };

// Activation rows one dense_gemv block handles; larger batches use more blocks.
inline constexpr int k_dense_gemv_max_rows = 8;

cudaError_t dense_gemv(DenseType type, const void* w, const float* bias, const float* x, float* y, int rows, int K,
                       int N, cudaStream_t stream);

cudaError_t to_half(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);
cudaError_t to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);
cudaError_t fill_bias(float* y, const float* bias, int rows, int N, cudaStream_t stream);
cudaError_t add_bias(float* y, const float* bias, int rows, int N, cudaStream_t stream);

}  // namespace exl::cuda
