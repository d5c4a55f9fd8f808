#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/dense_gemm.h"
#include "kernels/cuda/split_half.cuh"

namespace exl::cuda {
namespace {

constexpr int k_warps = 8;

template <DenseType T>
struct Elem;
template <>
struct Elem<DenseType::f32> {
  using type = float;
  static constexpr int vec = 4;
  __device__ static float get(float v) { return v; }
};
template <>
struct Elem<DenseType::f16> {
  using type = uint16_t;
  static constexpr int vec = 8;
  __device__ static float get(uint16_t v) { return __half2float(__ushort_as_half(v)); }
};
template <>
struct Elem<DenseType::bf16> {
  using type = uint16_t;
  static constexpr int vec = 8;
  __device__ static float get(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }
};

template <int MB, DenseType T>
__global__ void __launch_bounds__(k_warps * 32)
    dense_gemv_kernel(const typename Elem<T>::type* __restrict__ w, const float* __restrict__ bias,
                      const float* __restrict__ x, float* __restrict__ y, int rows, int K, int N, bool vec) {
  using E = Elem<T>;
  using V = typename E::type;
  constexpr int VEC = E::vec;
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * k_warps + (threadIdx.x >> 5);
  if (n >= N) return;
  const int m0 = blockIdx.y * MB;
  const int mc = min(MB, rows - m0);
  const V* wr = w + size_t(n) * K;
  const float* xr = x + size_t(m0) * K;
  float acc[MB];
#pragma unroll
  for (int m = 0; m < MB; ++m) acc[m] = 0.0f;
  if (vec) {
    for (int k = lane * VEC; k < K; k += 32 * VEC) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(wr + k));
      V wv[VEC];
      static_assert(sizeof(wv) == sizeof(u));
      __builtin_memcpy(wv, &u, sizeof(u));
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        if (m >= mc) break;
        const float4* xp = reinterpret_cast<const float4*>(xr + size_t(m) * K + k);
#pragma unroll
        for (int v4 = 0; v4 < VEC / 4; ++v4) {
          const float4 xv = __ldg(xp + v4);
          acc[m] = fmaf(E::get(wv[v4 * 4 + 0]), xv.x, acc[m]);
          acc[m] = fmaf(E::get(wv[v4 * 4 + 1]), xv.y, acc[m]);
          acc[m] = fmaf(E::get(wv[v4 * 4 + 2]), xv.z, acc[m]);
          acc[m] = fmaf(E::get(wv[v4 * 4 + 3]), xv.w, acc[m]);
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
      const float wv = E::get(wr[k]);
#pragma unroll
      for (int m = 0; m < MB; ++m)
        if (m < mc) acc[m] = fmaf(wv, xr[size_t(m) * K + k], acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < MB; ++m) {
    float s = acc[m];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0 && m < mc) y[size_t(m0 + m) * N + n] = s + (bias ? bias[n] : 0.0f);
  }
}

template <DenseType T>
cudaError_t launch_gemv(const void* w, const float* bias, const float* x, float* y, int rows, int K, int N,
                        cudaStream_t stream) {
  using V = typename Elem<T>::type;
  const bool vec = K % Elem<T>::vec == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int mb = rows > 4 ? 8 : rows > 2 ? 4 : rows > 1 ? 2 : 1;
  const dim3 grid((N + k_warps - 1) / k_warps, (rows + mb - 1) / mb);
  const V* wv = static_cast<const V*>(w);
  switch (mb) {
    case 1: dense_gemv_kernel<1, T><<<grid, k_warps * 32, 0, stream>>>(wv, bias, x, y, rows, K, N, vec); break;
    case 2: dense_gemv_kernel<2, T><<<grid, k_warps * 32, 0, stream>>>(wv, bias, x, y, rows, K, N, vec); break;
    case 4: dense_gemv_kernel<4, T><<<grid, k_warps * 32, 0, stream>>>(wv, bias, x, y, rows, K, N, vec); break;
    default: dense_gemv_kernel<8, T><<<grid, k_warps * 32, 0, stream>>>(wv, bias, x, y, rows, K, N, vec); break;
  }
  return cudaGetLastError();
}

__global__ void to_half_kernel(const float* __restrict__ x, __half* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(fminf(fmaxf(x[i], -65504.0f), 65504.0f));
}

__global__ void split_half_kernel(const float* __restrict__ x, __half* __restrict__ hi, __half* __restrict__ lo,
                                  int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    split_to_half(x[i], hi[i], lo[i]);
  }
}

// A 32 × 32 tile per block (32 × 8 threads): coalesced reads along K, coalesced writes along nc.
template <DenseType T>
__global__ void dense_columns_f32_kernel(const typename Elem<T>::type* __restrict__ w, int K, int n0, int nc,
                                         float* __restrict__ out) {
  __shared__ float tile[32][33];
  const int k0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int c = c0 + i, k = k0 + threadIdx.x;
    if (c < nc && k < K) tile[i][threadIdx.x] = Elem<T>::get(w[size_t(n0 + c) * K + k]);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int k = k0 + i, c = c0 + threadIdx.x;
    if (c < nc && k < K) out[size_t(k) * nc + c] = tile[threadIdx.x][i];
  }
}

__global__ void to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void fill_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t total, int N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = bias ? bias[i % N] : 0.0f;
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t total, int N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += bias[i % N];
}

unsigned grid_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return unsigned(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

cudaError_t dense_gemv(DenseType type, const void* w, const float* bias, const float* x, float* y, int rows, int K,
                       int N, cudaStream_t stream) {
  switch (type) {
    case DenseType::f32: return launch_gemv<DenseType::f32>(w, bias, x, y, rows, K, N, stream);
    case DenseType::f16: return launch_gemv<DenseType::f16>(w, bias, x, y, rows, K, N, stream);
    case DenseType::bf16: return launch_gemv<DenseType::bf16>(w, bias, x, y, rows, K, N, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t to_half(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  to_half_kernel<<<grid_for(n), 256, 0, stream>>>(x, reinterpret_cast<__half*>(out), n);
  return cudaGetLastError();
}

cudaError_t split_half(const float* x, uint16_t* hi, uint16_t* lo, int64_t n, cudaStream_t stream) {
  split_half_kernel<<<grid_for(n), 256, 0, stream>>>(x, reinterpret_cast<__half*>(hi), reinterpret_cast<__half*>(lo), n);
  return cudaGetLastError();
}

cudaError_t dense_columns_f32(DenseType type, const void* w, int K, int n0, int nc, float* out, cudaStream_t stream) {
  if (K <= 0 || nc <= 0) return cudaSuccess;
  const dim3 grid(unsigned((K + 31) / 32), unsigned((nc + 31) / 32)), block(32, 8);
  switch (type) {
    case DenseType::f32:
      dense_columns_f32_kernel<DenseType::f32><<<grid, block, 0, stream>>>(static_cast<const float*>(w), K, n0, nc, out);
      break;
    case DenseType::f16:
      dense_columns_f32_kernel<DenseType::f16><<<grid, block, 0, stream>>>(static_cast<const uint16_t*>(w), K, n0, nc,
                                                                            out);
      break;
    case DenseType::bf16:
      dense_columns_f32_kernel<DenseType::bf16><<<grid, block, 0, stream>>>(static_cast<const uint16_t*>(w), K, n0,
                                                                             nc, out);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(x, reinterpret_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

cudaError_t fill_bias(float* y, const float* bias, int rows, int N, cudaStream_t stream) {
  const int64_t total = int64_t(rows) * N;
  fill_bias_kernel<<<grid_for(total), 256, 0, stream>>>(y, bias, total, N);
  return cudaGetLastError();
}

cudaError_t add_bias(float* y, const float* bias, int rows, int N, cudaStream_t stream) {
  const int64_t total = int64_t(rows) * N;
  add_bias_kernel<<<grid_for(total), 256, 0, stream>>>(y, bias, total, N);
  return cudaGetLastError();
}

}  // namespace exl::cuda
