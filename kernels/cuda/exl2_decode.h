// Reading EXL2 quantized values out of q_weight (exl2-engine.md §1.6): each group's values for a
// column form a little-endian bitstream along K, `bits` bits per row, whose bit o is bit o%32 of
// word row qrow_start + o/32. Shared by the CUDA kernels and by host tests of the same arithmetic.
#pragma once
#include <cstdint>

#include "kernels/cuda/host_device.h"

namespace exl::cuda {

// A group as the GPU kernels read it (16 bytes, loaded as one vector).
struct alignas(16) Exl2GroupDesc {
  int32_t bits;
  int32_t row_start;   // first permuted row
  int32_t rows;
  int32_t qrow_start;  // first word row of q_weight
};

// Value i (0..31) of a 32-row block whose bitstream starts at bit 0 of w[0]; w holds BITS words.
// With i a compile-time constant (unrolled loops) the straddle test folds away.
template <int BITS>
EXL_HD uint32_t exl2_block_value(const uint32_t* w, int i) {
  const int o = i * BITS, wi = o >> 5, sh = o & 31;
  uint32_t v = w[wi] >> sh;
  if (sh + BITS > 32) v |= w[wi + 1] << (32 - sh);
  return v & ((1u << BITS) - 1u);
}

// Value of permuted row j (inside group g) for column n; q_weight rows are `np` words apart.
EXL_HD uint32_t exl2_value(const uint32_t* q_weight, int64_t np, int64_t n, const Exl2GroupDesc& g, int64_t j) {
  const int64_t o = (j - g.row_start) * g.bits;
  const int64_t w = g.qrow_start + (o >> 5);
  const int sh = int(o & 31);
  uint64_t v = uint64_t(q_weight[w * np + n]) >> sh;
  if (sh + g.bits > 32) v |= uint64_t(q_weight[(w + 1) * np + n]) << (32 - sh);
  return uint32_t(v) & ((1u << g.bits) - 1u);
}

// Dequantization scale of (group, column): (code+1)² · Smax/256, computed in fp32 like the CPU
// backend. `scale_words` is the group's q_scale row; `smax` the group's q_scale_max as float.
EXL_HD float exl2_scale(const uint32_t* scale_words, int64_t n, float smax) {
  const uint32_t s4 = (scale_words[n >> 3] >> (4 * (n & 7))) & 15u;
  return float((s4 + 1) * (s4 + 1)) * (smax / 256.0f);
}

}  // namespace exl::cuda
