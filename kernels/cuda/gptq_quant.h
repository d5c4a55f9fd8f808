// Kernels of the device GPTQ (kernels/gptq_device.h; kernels in gptq_quant.cu, the cuBLAS and
// Cholesky in gptq_device.cpp). Matrices are row-major; "rows" is the weight in permuted-row
// order, rows[j, n] = W[n, perm[j]], [K, N]. Each launcher queues on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace exl::cuda {

// h[i, j] += 2·c[i, j] for j ≥ i (c: fp32 XᵀX of a chunk, its upper triangle filled), h double.
cudaError_t gptq_hessian_add(double* h, const float* c, int64_t k, cudaStream_t stream);
// d[i] = h[i, i].
cudaError_t gptq_hessian_diag(const double* h, double* d, int64_t k, cudaStream_t stream);
// a = R·P·H·Pᵀ·R (R: index reversal; H read from its upper triangle), dead features' rows and
// columns 0 and their diagonal 1, plus damp on the diagonal; b = I. Both [k, k] double.
cudaError_t gptq_factor_build(const double* h, const int32_t* perm, const uint8_t* dead, double damp, double* a,
                              double* b, int64_t k, cudaStream_t stream);
// u[i, j] = X[k−1−i, k−1−j] for j ≥ i (0 below), X = b read column-major (cuBLAS's L⁻¹), as fp32;
// *bad |= 1 where a value is not finite.
cudaError_t gptq_factor_extract(const double* b, float* u, int* bad, int64_t k, cudaStream_t stream);
// rows[j, n] = dead_row[j] ? 0 : w[n, perm[j]]; w [n_out, k].
cudaError_t gptq_gather_rows(const float* w, const int32_t* perm, const uint8_t* dead_row, float* rows,
                             int64_t n_out, int64_t k, cudaStream_t stream);

// One group of `gr` rows starting at permuted row r0, `bits` wide, over N columns (padded to np):
// 1. colmax: base[n] = max_j |rows[r0 + j, n]| / half_range; *smax_bits = max(base) as float bits
//    (atomicMax; *smax_bits must start at 0).
cudaError_t gptq_group_colmax(const float* rows, int64_t r0, int gr, int n, int bits, float* base,
                              unsigned* smax_bits, cudaStream_t stream);
// 2. grid: qscale[n] from base and the maximum; partial[block, i] = the block's columns' squared
//    error at grid point i (16 points), in double. Returns the block count through *n_blocks.
inline constexpr int k_gptq_grid_points = 16;
cudaError_t gptq_group_grid(const float* rows, int64_t r0, int gr, int n, int bits, const float* base,
                            const unsigned* smax_bits, uint8_t* qscale, double* partial, int* n_blocks,
                            cudaStream_t stream);
int gptq_group_grid_blocks(int n);
// 3. pick: the grid point of least summed error (the first on ties); *smax_half = its fp16 maximum,
//    *smax = that as float; *bad |= 2 when no point is finite.
cudaError_t gptq_group_pick(const double* partial, int n_blocks, const unsigned* smax_bits, uint16_t* smax_half,
                            float* smax, int* bad, cudaStream_t stream);
// 4. quantize: each column's rows of the group in order, quantized as inference dequantizes them,
//    the error e_j = (r_j − deq_j) / u[j, j] fed to the group's later rows (r_i −= u[j, i]·e_j) and
//    stored in err [gr, n]; codes packed into q_weight [q_rows, np] from word row qrow_start,
//    padding columns as the zero point; scale codes into q_scale_row [np / 8].
cudaError_t gptq_group_quantize(float* rows, const float* u, int64_t k, int64_t r0, int gr, int n, int np, int bits,
                                int64_t qrow_start, const uint8_t* qscale, const float* smax, float* err,
                                uint32_t* q_weight, uint32_t* q_scale_row, cudaStream_t stream);

}  // namespace exl::cuda
