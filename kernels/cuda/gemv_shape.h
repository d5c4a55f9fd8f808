// Launch geometry shared by the quantized gemv kernels (exl2_gemm.cu, gptq_gemm.cu) and the host
// code that sizes their K-slices.
#pragma once
#include <cstddef>

namespace exl::cuda {

// Activation rows one GPTQ gemv block handles (1, 2, 4 or 8); more rows use more blocks, each
// reading the weights again. (The EXL2 gemv stops at 4: exl2_gemv_rows_per_block.)
inline int gemv_rows_per_block(int rows) { return rows > 4 ? 8 : rows > 2 ? 4 : rows; }
// Threads per block; each owns 4 consecutive output columns.
inline constexpr int k_gemv_threads = 128;
inline constexpr int k_gemv_cols_per_block = k_gemv_threads * 4;

}  // namespace exl::cuda
