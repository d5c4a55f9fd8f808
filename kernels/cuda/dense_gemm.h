// Unquantized linear layers on the GPU and the small helpers of every cuBLAS path (kernels in
// dense_gemm.cu; the cuBLAS calls themselves are host code in cuda_linear.cpp).
//   - dense_gemv: few rows; one warp per output column reads W's row [K] in its stored dtype and
//     accumulates in fp32; y = x·Wᵀ (+ bias), written (not accumulated).
//   - to_half / to_bf16: activations converted for tensor-core GEMMs (fp16 saturates at ±65504).
//   - split_half / dense_columns_f32: operands of the exact (split-fp16) GEMM path.
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
// hi = fp16(x), lo = fp16((x − hi) · k_split_lo_scale), both saturated at ±65504: x = hi + lo /
// k_split_lo_scale to about 2⁻²² relative (the scale keeps lo clear of fp16's subnormals for all
// but tiny x, whose absolute error stays below 2⁻³⁵), so products of split operands on fp16
// tensor cores keep fp32-level precision (cuda_linear.h).
inline constexpr float k_split_lo_scale = 2048.0f;
cudaError_t split_half(const float* x, uint16_t* hi, uint16_t* lo, int64_t n, cudaStream_t stream);
// out[K, nc] (fp32, row-major) = rows [n0, n0 + nc) of the dense [N, K] matrix w, transposed.
cudaError_t dense_columns_f32(DenseType type, const void* w, int K, int n0, int nc, float* out, cudaStream_t stream);
cudaError_t fill_bias(float* y, const float* bias, int rows, int N, cudaStream_t stream);
cudaError_t add_bias(float* y, const float* bias, int rows, int N, cudaStream_t stream);

}  // namespace exl::cuda
