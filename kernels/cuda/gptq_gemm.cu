#include <cuda_fp16.h>

#include "kernels/cuda/gemv_shape.h"
#include "kernels/cuda/gptq_gemm.h"

namespace exl::cuda {
namespace {

struct GroupParams {
  float scale[4];
  float zero23[4];  // 2^23 + zero (see q_minus)
};

// float(q) − zero without an int→float conversion: 0x4B000000 | q is the float 2^23 + q. Exact.
__device__ __forceinline__ float q_minus(uint32_t q, float z23) { return __uint_as_float(0x4B000000u | q) - z23; }

__device__ __forceinline__ GroupParams gptq_group_params(const GptqDeviceView& w, int g, int n0) {
  GroupParams p;
  const uint32_t zw = __ldg(w.qzeros + size_t(g) * (w.N / 8) + n0 / 8);
  const uint2 sw = __ldg(reinterpret_cast<const uint2*>(w.scales + size_t(g) * w.N + n0));
  const uint32_t s[4] = {sw.x & 0xffffu, sw.x >> 16, sw.y & 0xffffu, sw.y >> 16};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    p.zero23[c] = 8388608.0f + float(int((zw >> (4 * ((n0 & 7) + c))) & 15u) + w.zero_add);
    p.scale[c] = __half2float(__ushort_as_half(static_cast<unsigned short>(s[c])));
  }
  return p;
}

template <int MB>
__global__ void __launch_bounds__(k_gemv_threads) gptq_gemv_kernel(GptqDeviceView w, const float* __restrict__ x,
                                                                   float* __restrict__ y, int rows, int k_slice) {
  extern __shared__ float smem[];
  float* xs = smem;                                          // [MB][k_slice]
  int* gs = reinterpret_cast<int*>(smem + MB * k_slice);     // [k_slice]
  const int k0 = blockIdx.z * k_slice;
  const int k1 = min(w.K, k0 + k_slice);
  const int kc = k1 - k0;
  const int m0 = blockIdx.y * MB;
  const int mc = min(MB, rows - m0);
  for (int i = threadIdx.x; i < MB * kc; i += blockDim.x) {
    const int m = i / kc, j = i - m * kc;
    xs[m * k_slice + j] = m < mc ? x[size_t(m0 + m) * w.K + w.perm[k0 + j]] : 0.0f;
  }
  for (int j = threadIdx.x; j < kc; j += blockDim.x) gs[j] = w.row_group[k0 + j];
  __syncthreads();
  const int n0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (n0 >= w.N) return;

  float acc[MB][4];
#pragma unroll
  for (int m = 0; m < MB; ++m)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[m][c] = 0.0f;
  int cur = -1;
  GroupParams gp{};
  for (int j8 = 0; j8 < kc; j8 += 8) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(w.qweight + size_t((k0 + j8) / 8) * w.N + n0));
    const uint32_t wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int j = j8 + i;
      const int g = gs[j];
      if (g != cur) {
        cur = g;
        gp = gptq_group_params(w, g, n0);
      }
      float wv[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) wv[c] = q_minus((wd[c] >> (4 * i)) & 15u, gp.zero23[c]) * gp.scale[c];
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        const float xv = xs[m * k_slice + j];
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[m][c] = fmaf(wv[c], xv, acc[m][c]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MB; ++m) {
    if (m >= mc) break;
#pragma unroll
    for (int c = 0; c < 4; ++c) atomicAdd(y + size_t(m0 + m) * w.N + n0 + c, acc[m][c]);
  }
}

__device__ __forceinline__ void store_weight(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_weight(float* p, float v) { *p = v; }

template <typename Out>
__global__ void gptq_reconstruct_kernel(GptqDeviceView w, int n0, int nc, Out* __restrict__ out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= nc) return;
  const int n = n0 + c;
  const int r = blockIdx.y;  // word row: rows 8r .. 8r+7
  const uint32_t word = w.qweight[size_t(r) * w.N + n];
  for (int i = 0; i < 8; ++i) {
    const int j = r * 8 + i;
    const int g = w.row_group[j];
    const int z = int((w.qzeros[size_t(g) * (w.N / 8) + n / 8] >> (4 * (n % 8))) & 15u) + w.zero_add;
    const float s = __half2float(__ushort_as_half(w.scales[size_t(g) * w.N + n]));
    store_weight(out + size_t(w.perm[j]) * nc + c, float(int((word >> (4 * i)) & 15u) - z) * s);
  }
}

}  // namespace

cudaError_t gptq_gemv(const GptqDeviceView& w, const float* x, float* y, int rows, int k_slice, cudaStream_t stream) {
  const int mb = gemv_rows_per_block(rows);
  const dim3 grid((w.N + k_gemv_cols_per_block - 1) / k_gemv_cols_per_block, (rows + mb - 1) / mb,
                  (w.K + k_slice - 1) / k_slice);
  const size_t smem = (size_t(mb) + 1) * size_t(k_slice) * sizeof(float);
  switch (mb) {
    case 1: gptq_gemv_kernel<1><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
    case 2: gptq_gemv_kernel<2><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
    case 4: gptq_gemv_kernel<4><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
    default: gptq_gemv_kernel<8><<<grid, k_gemv_threads, smem, stream>>>(w, x, y, rows, k_slice); break;
  }
  return cudaGetLastError();
}

cudaError_t gptq_reconstruct(const GptqDeviceView& w, int n0, int nc, uint16_t* out, cudaStream_t stream) {
  const dim3 grid((nc + 127) / 128, w.K / 8);
  gptq_reconstruct_kernel<<<grid, 128, 0, stream>>>(w, n0, nc, reinterpret_cast<__half*>(out));
  return cudaGetLastError();
}

cudaError_t gptq_reconstruct_f32(const GptqDeviceView& w, int n0, int nc, float* out, cudaStream_t stream) {
  const dim3 grid((nc + 127) / 128, w.K / 8);
  gptq_reconstruct_kernel<<<grid, 128, 0, stream>>>(w, n0, nc, out);
  return cudaGetLastError();
}

}  // namespace exl::cuda
