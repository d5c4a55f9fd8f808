#include <algorithm>
#include <cuda_fp16.h>

#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/mma_staging.cuh"
#include "kernels/cuda/norm_rope_act.h"
#include "kernels/cuda/overlapped_launch.cuh"
#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/row_norm.cuh"

namespace exl::cuda {
namespace {

// The norm and rope kernels allow the next kernel to launch at once (overlapped_launch.cuh): the
// EXL2 tensor-core products that follow them in a batched decode step wait for their inputs.

__global__ void __launch_bounds__(k_row_threads)
    rms_norm_kernel(const float* x, const float* __restrict__ w, float* y, int64_t dim, float eps) {
  allow_dependents();
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  const float inv = block_inv_rms(row_sum_squares(xr, dim), dim, eps);
#pragma unroll 4
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) yr[d] = w[d] * (xr[d] * inv);
}

// rms_norm_kernel's values, stored staged for a tensor-core set (with its padding rows) instead: a
// whole row through shared memory (mma_stage_row) where the staging allows, else value by value.
__global__ void __launch_bounds__(k_row_threads)
    rms_norm_stage_kernel(const float* x, const float* __restrict__ w, int64_t dim, float eps, const Exl2MmaStaging s) {
  allow_dependents();
  const int r = int(blockIdx.x);
  const float* xr = x + r * dim;
  extern __shared__ __half staged_row[];  // mma_stage_row_bytes(s)
  mma_stage_norm_row(s, r, xr, w, eps, staged_row);
}

// x += y, then the rms_norm of the sums (the same float sums are stored and normalised).
__global__ void __launch_bounds__(k_row_threads)
    add_rms_norm_kernel(float* x, const float* __restrict__ y, const float* __restrict__ w, float* out, int64_t dim,
                        float eps) {
  allow_dependents();
  float* xr = x + blockIdx.x * dim;
  const float* yr = y + blockIdx.x * dim;
  float* orow = out + blockIdx.x * dim;
  double ss = 0;
#pragma unroll 4
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = xr[d] + yr[d];
    xr[d] = v;
    ss += double(v) * double(v);
  }
  const float inv = block_inv_rms(ss, dim, eps);
#pragma unroll 4
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) orow[d] = w[d] * (xr[d] * inv);
}

struct KvStore {
  const float* v = nullptr;  // null: rope only
  uint8_t* pool = nullptr;
  KvDeviceLayout layout;
  const int32_t* slots = nullptr;
};

constexpr int k_rope_threads = 512;

// Block (r, j, z) rotates heads [z·hz, (z+1)·hz) of row r of tensor j (hz = ⌈heads / gridDim.z⌉):
// x0 with n0 heads, x1 with n1 heads. With st.v, blocks (r, 1, z) then store those heads of x1's
// and st.v's row r into the cache, one warp per vector.
__global__ void __launch_bounds__(k_rope_threads)
    rope_kernel(float* x0, int n0, float* x1, int n1, int head_dim, const int32_t* __restrict__ positions,
                const float* __restrict__ inv_freq, float attn_factor, KvStore st) {
  allow_dependents();
  float* x = blockIdx.y ? x1 : x0;
  const int n_heads = blockIdx.y ? n1 : n0;
  const int hz = (n_heads + int(gridDim.z) - 1) / int(gridDim.z), h0 = int(blockIdx.z) * hz;
  const int nh = min(n_heads, h0 + hz) - h0;
  if (nh <= 0) return;
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const int half = head_dim / 2;
  float* sn = cs + half;
  const int r = blockIdx.x;
  for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cos_sin(positions[r], inv_freq[i], attn_factor, cs[i], sn[i]);
  __syncthreads();
  float* xr = x + (size_t(r) * n_heads + h0) * head_dim;
#pragma unroll 4
  for (int k = threadIdx.x; k < nh * half; k += blockDim.x) {
    const int h = k / half, i = k - h * half;
    rope_rotate(xr + size_t(h) * head_dim, i, half, cs[i], sn[i]);
  }
  if (!st.v || blockIdx.y == 0) return;
  __shared__ float inv_s[k_rope_threads / 32][k_kv_max_blocks_per_vec];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int vec = warp; vec < 2 * nh; vec += blockDim.x >> 5) {
    const int kv = vec / nh, h = h0 + vec - kv * nh;
    const float* src = (kv == 0 ? x1 : st.v) + (size_t(r) * n1 + h) * head_dim;
    kv_store_vector(st.pool, st.layout, kv, h, st.slots[r], src, inv_s[warp], lane);
  }
}

// Head splits of rope_kernel's rows: a decode batch's few rows spread over more blocks (each row's
// heads were one 512-thread block: 16 blocks at 8 rows, 12.6 µs per layer on the H200).
unsigned rope_head_splits(int64_t rows) { return unsigned(std::clamp<int64_t>(128 / std::max<int64_t>(rows, 1), 1, 8)); }

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out,
                              int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

template <DenseType T>
__global__ void embedding_kernel(const void* __restrict__ table, int64_t vocab, int64_t dim,
                                 const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t row = ids[blockIdx.x];
  float* o = out + blockIdx.x * dim;
  if (row < 0 || row >= vocab) {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) o[d] = 0.0f;
    return;
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    if constexpr (T == DenseType::f32) {
      o[d] = static_cast<const float*>(table)[row * dim + d];
    } else {
      const uint16_t v = static_cast<const uint16_t*>(table)[row * dim + d];
      if constexpr (T == DenseType::f16) o[d] = __half2float(__ushort_as_half(v));
      else o[d] = __uint_as_float(uint32_t(v) << 16);
    }
  }
}

unsigned grid_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return unsigned(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace

cudaError_t rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                     cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  rms_norm_kernel<<<unsigned(rows), k_row_threads, 0, stream>>>(x, w, y, dim, eps);
  return cudaGetLastError();
}

cudaError_t rms_norm_stage(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                           const Exl2MmaStaging& to, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (to.n_jobs < 1 || to.K != dim || to.rows != rows || !to.staged) return cudaErrorInvalidValue;
  rms_norm_stage_kernel<<<unsigned(rows), k_row_threads, mma_stage_row_bytes(to), stream>>>(x, w, dim, eps, to);
  return cudaGetLastError();
}

cudaError_t rope(float* x, int64_t rows, int n_heads, int head_dim, const int32_t* positions, const float* inv_freq,
                 float attn_factor, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const size_t smem = size_t(head_dim / 2) * 2 * sizeof(float);
  rope_kernel<<<dim3(unsigned(rows), 1, rope_head_splits(rows)), k_rope_threads, smem, stream>>>(
      x, n_heads, x, n_heads, head_dim, positions, inv_freq, attn_factor, KvStore{});
  return cudaGetLastError();
}

cudaError_t rope_qk(float* q, float* k, int64_t rows, int n_heads, int n_kv_heads, int head_dim,
                    const int32_t* positions, const float* inv_freq, float attn_factor, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const size_t smem = size_t(head_dim / 2) * 2 * sizeof(float);
  rope_kernel<<<dim3(unsigned(rows), 2, rope_head_splits(rows)), k_rope_threads, smem, stream>>>(
      q, n_heads, k, n_kv_heads, head_dim, positions, inv_freq, attn_factor, KvStore{});
  return cudaGetLastError();
}

cudaError_t rope_qk_store(float* q, float* k, const float* v, int64_t rows, int n_heads, int n_kv_heads, int head_dim,
                          const int32_t* positions, const float* inv_freq, float attn_factor, uint8_t* pool,
                          const KvDeviceLayout& layout, const int32_t* slots, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const size_t smem = size_t(head_dim / 2) * 2 * sizeof(float);
  rope_kernel<<<dim3(unsigned(rows), 2, rope_head_splits(rows)), k_rope_threads, smem, stream>>>(
      q, n_heads, k, n_kv_heads, head_dim, positions, inv_freq, attn_factor, KvStore{v, pool, layout, slots});
  return cudaGetLastError();
}

cudaError_t add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t dim, float eps,
                         cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  add_rms_norm_kernel<<<unsigned(rows), k_row_threads, 0, stream>>>(x, y, w, out, dim, eps);
  return cudaGetLastError();
}

cudaError_t swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_kernel<<<grid_for(n), 256, 0, stream>>>(gate, up, out, n);
  return cudaGetLastError();
}

cudaError_t add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<grid_for(n), 256, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t embedding(DenseType type, const void* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n_ids,
                      float* out, cudaStream_t stream) {
  if (n_ids == 0) return cudaSuccess;
  const unsigned grid = unsigned(n_ids);
  switch (type) {
    case DenseType::f32: embedding_kernel<DenseType::f32><<<grid, 128, 0, stream>>>(table, vocab, dim, ids, out); break;
    case DenseType::f16: embedding_kernel<DenseType::f16><<<grid, 128, 0, stream>>>(table, vocab, dim, ids, out); break;
    case DenseType::bf16: embedding_kernel<DenseType::bf16><<<grid, 128, 0, stream>>>(table, vocab, dim, ids, out); break;
  }
  return cudaGetLastError();
}

}  // namespace exl::cuda
