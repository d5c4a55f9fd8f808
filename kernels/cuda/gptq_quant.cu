#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/gptq_quant.h"

// The quantization arithmetic uses __fmul_rn / __fsub_rn / __fdiv_rn: the CPU reference
// (engine/quantize/gptq.cpp, quantize_linear.cpp) is compiled without FMA contraction, and the
// codes should be the same wherever the inputs are.

namespace exl::cuda {
namespace {

constexpr int k_gptq_threads = 256;
constexpr int k_gptq_quant_threads = 64;

// Finite (not inf or NaN), in a form the CUDA emulator's C++ also compiles.
__device__ bool gptq_finite(double v) { return fabs(v) <= 1.7976931348623157e308; }

int gptq_blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return int(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void hessian_add_kernel(double* h, const float* c, int64_t k) {
  const int64_t total = k * k;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / k, j = idx % k;
    if (j >= i) h[idx] += 2.0 * double(c[idx]);
  }
}

__global__ void hessian_diag_kernel(const double* h, double* d, int64_t k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k) d[i] = h[i * k + i];
}

__global__ void factor_build_kernel(const double* h, const int32_t* perm, const uint8_t* dead, double damp, double* a,
                                    double* b, int64_t k) {
  const int64_t total = k * k;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / k, j = idx % k;
    const int64_t pi = perm[k - 1 - i], pj = perm[k - 1 - j];
    double v = 0.0;
    if (!dead[pi] && !dead[pj]) v = pi <= pj ? h[pi * k + pj] : h[pj * k + pi];
    if (i == j) v = (dead[pi] ? 1.0 : v) + damp;
    a[idx] = v;
    b[idx] = i == j ? 1.0 : 0.0;
  }
}

__global__ void factor_extract_kernel(const double* b, float* u, int* bad, int64_t k) {
  const int64_t total = k * k;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / k, j = idx % k;
    float out = 0.0f;
    if (j >= i) {
      const double v = b[(k - 1 - j) * k + (k - 1 - i)];
      if (!gptq_finite(v)) atomicOr(bad, 1);
      out = float(v);
    }
    u[idx] = out;
  }
}

__global__ void gather_rows_kernel(const float* w, const int32_t* perm, const uint8_t* dead_row, float* rows,
                                   int64_t n_out, int64_t k) {
  const int64_t total = n_out * k;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx / n_out, n = idx % n_out;
    rows[idx] = dead_row[j] ? 0.0f : w[n * k + perm[j]];
  }
}

__global__ void group_colmax_kernel(const float* rows, int64_t r0, int gr, int n, float half_range, float* base,
                                    unsigned* smax_bits) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= n) return;
  float m = 0.0f;
  for (int j = 0; j < gr; ++j) m = fmaxf(m, fabsf(rows[(r0 + j) * n + col]));
  const float b = __fdiv_rn(m, half_range);
  base[col] = b;
  atomicMax(smax_bits, __float_as_uint(b));
}

__device__ float gptq_grid_point(int i) {
  return __fadd_rn(0.70f, __fdiv_rn(__fmul_rn(0.50f, float(i)), float(k_gptq_grid_points - 1)));
}

__device__ float gptq_scale_of(uint32_t qs, float smax) {
  return __fdiv_rn(__fmul_rn(float(qs * qs), smax), 256.0f);
}

__device__ float gptq_code_of(float r, float inv, float zero, float maxq) {
  return fminf(fmaxf(__fadd_rn(rintf(__fmul_rn(r, inv)), zero), 0.0f), maxq);
}

__global__ void group_grid_kernel(const float* rows, int64_t r0, int gr, int n, int bits, const float* base,
                                  const unsigned* smax_bits, uint8_t* qscale, double* partial) {
  __shared__ double red[k_gptq_threads / 32][k_gptq_grid_points];
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const float smax0 = __uint_as_float(*smax_bits);
  const float maxq = float((1 << bits) - 1), zero = float(1 << (bits - 1));
  double err[k_gptq_grid_points];
  for (int i = 0; i < k_gptq_grid_points; ++i) err[i] = 0.0;
  if (col < n) {
    uint32_t qs = 1;
    if (smax0 > 0.0f) {
      const long r = lroundf(__fmul_rn(sqrtf(__fdiv_rn(base[col], smax0)), 16.0f));
      qs = uint32_t(r < 1 ? 1 : r > 16 ? 16 : r);
      for (int i = 0; i < k_gptq_grid_points; ++i) {
        const float s = __half2float(__float2half_rn(__fmul_rn(smax0, gptq_grid_point(i))));
        if (!gptq_finite(s)) continue;
        const float scale = gptq_scale_of(qs, s), inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
        for (int j = 0; j < gr; ++j) {
          const float x = rows[(r0 + j) * n + col];
          const float d = __fsub_rn(x, __fmul_rn(__fsub_rn(gptq_code_of(x, inv, zero, maxq), zero), scale));
          err[i] += double(__fmul_rn(d, d));
        }
      }
    }
    qscale[col] = uint8_t(qs);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = 0; i < k_gptq_grid_points; ++i) {
    double v = err[i];
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) red[warp][i] = v;
  }
  __syncthreads();
  if (threadIdx.x < k_gptq_grid_points) {
    double v = 0.0;
    for (int w = 0; w < k_gptq_threads / 32; ++w) v += red[w][threadIdx.x];
    partial[blockIdx.x * k_gptq_grid_points + threadIdx.x] = v;
  }
}

__global__ void group_pick_kernel(const double* partial, int n_blocks, const unsigned* smax_bits, uint16_t* smax_half,
                                  float* smax, int* bad) {
  const float smax0 = __uint_as_float(*smax_bits);
  uint16_t h = 0;
  if (smax0 > 0.0f) {
    double best = INFINITY;
    for (int i = 0; i < k_gptq_grid_points; ++i) {
      const __half hi = __float2half_rn(__fmul_rn(smax0, gptq_grid_point(i)));
      if (!gptq_finite(__half2float(hi))) continue;
      double e = 0.0;
      for (int b = 0; b < n_blocks; ++b) e += partial[b * k_gptq_grid_points + i];
      if (e < best) best = e, h = __half_as_ushort(hi);
    }
    if (!gptq_finite(best)) atomicOr(bad, 2);
  }
  *smax_half = h;
  *smax = __half2float(__ushort_as_half(h));
}

__global__ void group_quantize_kernel(float* rows, const float* u, int64_t k, int64_t r0, int gr, int n, int np,
                                      int bits, int64_t qrow_start, const uint8_t* qscale, const float* smax_p,
                                      float* err, uint32_t* q_weight, uint32_t* q_scale_row) {
  extern __shared__ float col_rows[];  // [gr][k_gptq_quant_threads]
  const int t = threadIdx.x;
  const int col = blockIdx.x * blockDim.x + t;
  if (col >= np) return;
  const uint32_t mask = (1u << bits) - 1u;
  const float maxq = float(mask), zero = float(1 << (bits - 1));
  uint64_t buf = 0;
  int nb = 0;
  int64_t word = qrow_start;
  auto put = [&](uint32_t q) {
    buf |= uint64_t(q & mask) << nb;
    nb += bits;
    if (nb >= 32) {
      q_weight[word * np + col] = uint32_t(buf);
      buf >>= 32;
      nb -= 32;
      ++word;
    }
  };
  if (col < n) {
    for (int j = 0; j < gr; ++j) col_rows[j * k_gptq_quant_threads + t] = rows[(r0 + j) * n + col];
    const float scale = gptq_scale_of(qscale[col], *smax_p), inv = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
    for (int j = 0; j < gr; ++j) {
      const float r = col_rows[j * k_gptq_quant_threads + t];
      const float q = gptq_code_of(r, inv, zero, maxq);
      put(uint32_t(q));
      const float* uj = u + (r0 + j) * k + r0;
      const float e = __fdiv_rn(__fsub_rn(r, __fmul_rn(__fsub_rn(q, zero), scale)), uj[j]);
      err[int64_t(j) * n + col] = e;
      for (int i = j + 1; i < gr; ++i) {
        float& ri = col_rows[i * k_gptq_quant_threads + t];
        ri = __fsub_rn(ri, __fmul_rn(uj[i], e));
      }
    }
  } else {
    for (int j = 0; j < gr; ++j) put(uint32_t(zero));
  }
  if (col % 8 == 0) {
    uint32_t w = 0;
    for (int c = 0; c < 8; ++c)
      if (col + c < n) w |= ((uint32_t(qscale[col + c]) - 1u) & 15u) << (4 * c);
    q_scale_row[col / 8] = w;
  }
}

}  // namespace

cudaError_t gptq_hessian_add(double* h, const float* c, int64_t k, cudaStream_t stream) {
  hessian_add_kernel<<<gptq_blocks_for(k * k, k_gptq_threads), k_gptq_threads, 0, stream>>>(h, c, k);
  return cudaGetLastError();
}

cudaError_t gptq_hessian_diag(const double* h, double* d, int64_t k, cudaStream_t stream) {
  hessian_diag_kernel<<<gptq_blocks_for(k, k_gptq_threads), k_gptq_threads, 0, stream>>>(h, d, k);
  return cudaGetLastError();
}

cudaError_t gptq_factor_build(const double* h, const int32_t* perm, const uint8_t* dead, double damp, double* a,
                              double* b, int64_t k, cudaStream_t stream) {
  factor_build_kernel<<<gptq_blocks_for(k * k, k_gptq_threads), k_gptq_threads, 0, stream>>>(h, perm, dead, damp, a, b, k);
  return cudaGetLastError();
}

cudaError_t gptq_factor_extract(const double* b, float* u, int* bad, int64_t k, cudaStream_t stream) {
  factor_extract_kernel<<<gptq_blocks_for(k * k, k_gptq_threads), k_gptq_threads, 0, stream>>>(b, u, bad, k);
  return cudaGetLastError();
}

cudaError_t gptq_gather_rows(const float* w, const int32_t* perm, const uint8_t* dead_row, float* rows,
                             int64_t n_out, int64_t k, cudaStream_t stream) {
  gather_rows_kernel<<<gptq_blocks_for(n_out * k, k_gptq_threads), k_gptq_threads, 0, stream>>>(w, perm, dead_row, rows, n_out, k);
  return cudaGetLastError();
}

cudaError_t gptq_group_colmax(const float* rows, int64_t r0, int gr, int n, int bits, float* base,
                              unsigned* smax_bits, cudaStream_t stream) {
  const float half_range = float((1 << bits) - 1) / 2.0f;
  group_colmax_kernel<<<gptq_blocks_for(n, k_gptq_threads), k_gptq_threads, 0, stream>>>(rows, r0, gr, n, half_range, base,
                                                                          smax_bits);
  return cudaGetLastError();
}

int gptq_group_grid_blocks(int n) { return gptq_blocks_for(n, k_gptq_threads); }

cudaError_t gptq_group_grid(const float* rows, int64_t r0, int gr, int n, int bits, const float* base,
                            const unsigned* smax_bits, uint8_t* qscale, double* partial, int* n_blocks,
                            cudaStream_t stream) {
  *n_blocks = gptq_group_grid_blocks(n);
  group_grid_kernel<<<*n_blocks, k_gptq_threads, 0, stream>>>(rows, r0, gr, n, bits, base, smax_bits, qscale, partial);
  return cudaGetLastError();
}

cudaError_t gptq_group_pick(const double* partial, int n_blocks, const unsigned* smax_bits, uint16_t* smax_half,
                            float* smax, int* bad, cudaStream_t stream) {
  group_pick_kernel<<<1, 1, 0, stream>>>(partial, n_blocks, smax_bits, smax_half, smax, bad);
  return cudaGetLastError();
}

cudaError_t gptq_group_quantize(float* rows, const float* u, int64_t k, int64_t r0, int gr, int n, int np, int bits,
                                int64_t qrow_start, const uint8_t* qscale, const float* smax, float* err,
                                uint32_t* q_weight, uint32_t* q_scale_row, cudaStream_t stream) {
  const size_t smem = size_t(gr) * k_gptq_quant_threads * sizeof(float);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  group_quantize_kernel<<<gptq_blocks_for(np, k_gptq_quant_threads), k_gptq_quant_threads, smem, stream>>>(
      rows, u, k, r0, gr, n, np, bits, qrow_start, qscale, smax, err, q_weight, q_scale_row);
  return cudaGetLastError();
}

}  // namespace exl::cuda
