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

}  // namespace exl::cuda
