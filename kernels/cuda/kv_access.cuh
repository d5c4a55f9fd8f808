// Device-side reads of the paged KV pool (kernels/kv_layout.h's byte layout), shared by the
// attention kernels. CUDA sources only.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {

// Vector (layer, K or V, kv head, slot in page) inside a page.
__device__ __forceinline__ int64_t vec_index(const KvDeviceLayout& L, int kv, int head, int slot) {
  return ((int64_t(L.layer) * 2 + kv) * L.n_kv_heads + head) * L.page_size + slot;
}

// Scales are read and written bytewise: the scale area need not be 2-byte aligned for every layout.
__device__ __forceinline__ float load_scale(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

// Element d of vector `vec` of `page`, decoded from the pool's format to float.
__device__ __forceinline__ float load_kv(const uint8_t* pool, const KvDeviceLayout& L, int page, int64_t vec, int d) {
  const uint8_t* page_base = pool + int64_t(page) * L.page_bytes;
  const uint8_t* data = page_base + vec * L.vec_bytes;
  switch (L.format) {
    case 0: return reinterpret_cast<const float*>(data)[d];
    case 1: return __half2float(reinterpret_cast<const __half*>(data)[d]);
    case 2: {
      const float s = load_scale(page_base + L.scales_offset + vec * L.vec_scale_bytes + 2 * (d / L.block));
      return float(int(int8_t(data[d]))) * s;
    }
    default: {
      const float s = load_scale(page_base + L.scales_offset + vec * L.vec_scale_bytes + 2 * (d / L.block));
      return float(int((data[d >> 1] >> (4 * (d & 1))) & 15) - 8) * s;
    }
  }
}

inline constexpr int k_kv_max_blocks_per_vec = 8;

__device__ __forceinline__ float kv_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int kv_quantize(float x, float inv, float qmax) {
  return int(fminf(fmaxf(rintf(x * inv), -qmax), qmax));
}

// One warp stores src[0, D) as vector (K or V = kv, head h) of cache slot `slot` in the pool's
// format (q8/q4: one fp16 scale per `block` elements, amax / qmax, round to nearest). `inv_s` is
// this warp's shared scratch of k_kv_max_blocks_per_vec floats.
__device__ __forceinline__ void kv_store_vector(uint8_t* pool, const KvDeviceLayout& L, int kv, int h, int slot,
                                                const float* src, float* inv_s, int lane) {
  const int D = L.head_dim;
  const int page = slot / L.page_size, off = slot % L.page_size;
  const int64_t vec = vec_index(L, kv, h, off);
  uint8_t* page_base = pool + int64_t(page) * L.page_bytes;
  uint8_t* data = page_base + vec * L.vec_bytes;
  if (L.format == 0) {
    for (int d = lane; d < D; d += 32) reinterpret_cast<float*>(data)[d] = src[d];
    return;
  }
  if (L.format == 1) {
    for (int d = lane; d < D; d += 32) reinterpret_cast<__half*>(data)[d] = __float2half_rn(src[d]);
    return;
  }
  const float qmax = L.format == 2 ? 127.0f : 7.0f;
  const int B = L.block, nb = D / B;
  uint8_t* scales = page_base + L.scales_offset + vec * L.vec_scale_bytes;
  for (int b = 0; b < nb; ++b) {
    float amax = 0.0f;
    for (int i = lane; i < B; i += 32) amax = fmaxf(amax, fabsf(src[b * B + i]));
    amax = kv_warp_max(amax);
    const __half sh = __float2half_rn(amax / qmax);
    const float s = __half2float(sh);
    if (lane == 0) {
      const unsigned short bits = __half_as_ushort(sh);
      scales[2 * b] = uint8_t(bits & 0xff);
      scales[2 * b + 1] = uint8_t(bits >> 8);
      inv_s[b] = s > 0.0f ? 1.0f / s : 0.0f;
    }
  }
  __syncwarp();
  if (L.format == 2) {
    for (int d = lane; d < D; d += 32) data[d] = uint8_t(int8_t(kv_quantize(src[d], inv_s[d / B], qmax)));
    return;
  }
  for (int i = lane; i < (D + 1) / 2; i += 32) {
    const int d0 = 2 * i, d1 = 2 * i + 1;
    const uint8_t lo = uint8_t(kv_quantize(src[d0], inv_s[d0 / B], qmax) + 8);
    const uint8_t hi = d1 < D ? uint8_t(kv_quantize(src[d1], inv_s[d1 / B], qmax) + 8) : uint8_t(data[i] >> 4);
    data[i] = uint8_t(lo | (hi << 4));
  }
}

}  // namespace exl::cuda
