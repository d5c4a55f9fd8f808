#include <cuda_fp16.h>

#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/split_half.cuh"

namespace exl::cuda {
namespace {

constexpr float k_neg_inf = -__builtin_huge_valf();

// Grid (n_keys, 2·n_kv_heads): one block per (position, K or V, head) vector.
__global__ void gather_kv_kernel(const uint8_t* __restrict__ pool, KvDeviceLayout L, const int32_t* __restrict__ pages,
                                 int n_keys, __half* __restrict__ k16, __half* __restrict__ v16,
                                 __half* __restrict__ k16_lo, __half* __restrict__ v16_lo) {
  const int j = blockIdx.x;
  const int kv = blockIdx.y / L.n_kv_heads, h = blockIdx.y % L.n_kv_heads;
  const int D = L.head_dim;
  const int page = pages[j / L.page_size], slot = j % L.page_size;
  const int64_t vec = vec_index(L, kv, h, slot);
  const int64_t at = (int64_t(h) * n_keys + j) * D;
  __half* dst = (kv == 0 ? k16 : v16) + at;
  __half* lo = k16_lo ? (kv == 0 ? k16_lo : v16_lo) + at : nullptr;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    const float x = load_kv(pool, L, page, vec, d);
    if (lo) split_to_half(x, dst[d], lo[d]);
    else dst[d] = __float2half_rn(x);
  }
}

__device__ __forceinline__ float block_reduce(float v, float* sh, bool is_max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = is_max ? k_neg_inf : 0.0f;
  for (int i = 0; i < nw; ++i) v = is_max ? fmaxf(v, sh[i]) : v + sh[i];
  return v;
}

// One block per score row.
__global__ void causal_softmax_kernel(const float* __restrict__ s, __half* __restrict__ p, __half* __restrict__ p_lo,
                                      int rows, int n_keys, int pos0, int window) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const int t = int(row % rows);
  const int hi = min(n_keys - 1, pos0 + t);
  const int lo = window > 0 ? max(0, pos0 + t - window + 1) : 0;
  const float* sr = s + row * n_keys;
  __half* pr = p + row * n_keys;
  float mx = k_neg_inf;
  for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) mx = fmaxf(mx, sr[j]);
  mx = block_reduce(mx, sh, true);
  float sum = 0.0f;
  for (int j = lo + threadIdx.x; j <= hi; j += blockDim.x) sum += expf(sr[j] - mx);
  sum = block_reduce(sum, sh, false);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  __half* pl = p_lo ? p_lo + row * n_keys : nullptr;
  for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
    const float v = j >= lo && j <= hi ? expf(sr[j] - mx) * inv : 0.0f;
    if (pl) split_to_half(v, pr[j], pl[j]);
    else pr[j] = __float2half_rn(v);
  }
}

}  // namespace

cudaError_t gather_kv(const uint8_t* pool, const KvDeviceLayout& layout, const int32_t* pages, int n_keys,
                      uint16_t* k16, uint16_t* v16, uint16_t* k16_lo, uint16_t* v16_lo, cudaStream_t stream) {
  if (n_keys == 0) return cudaSuccess;
  const dim3 grid(unsigned(n_keys), unsigned(2 * layout.n_kv_heads));
  const int threads = layout.head_dim >= 128 ? 128 : 64;
  gather_kv_kernel<<<grid, threads, 0, stream>>>(pool, layout, pages, n_keys, reinterpret_cast<__half*>(k16),
                                                 reinterpret_cast<__half*>(v16), reinterpret_cast<__half*>(k16_lo),
                                                 reinterpret_cast<__half*>(v16_lo));
  return cudaGetLastError();
}

cudaError_t causal_softmax(const float* s, uint16_t* p, uint16_t* p_lo, int heads, int rows, int n_keys, int pos0,
                           int window, cudaStream_t stream) {
  const int64_t n = int64_t(heads) * rows;
  if (n == 0) return cudaSuccess;
  causal_softmax_kernel<<<unsigned(n), 256, 0, stream>>>(s, reinterpret_cast<__half*>(p), reinterpret_cast<__half*>(p_lo),
                                                         rows, n_keys, pos0, window);
  return cudaGetLastError();
}

}  // namespace exl::cuda
