#include "kernels/cpu/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/half.h"

namespace exl {

namespace {

// The smallest fp16 value >= amax / qmax (saturating at the largest finite half).
uint16_t group_scale(float amax, float qmax) {
  const float s = amax / qmax;
  if (!(s < 65504.0f)) return 0x7bff;
  uint16_t h = float_to_half(s);
  if (half_to_float(h) < s) ++h;
  return h;
}

float group_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// Bit-exact with half_to_float, but branch-free on the common path so the loops vectorize:
// rebias the exponent with one multiply (exact, subnormal halves included), patch inf/NaN.
inline float half_to_float_fast(uint16_t h) {
  const uint32_t mag = uint32_t(h & 0x7fff) << 13;
  const uint32_t normal = float_to_bits(bits_to_float(mag) * 0x1p112f);
  const uint32_t special = 0u - uint32_t((h & 0x7c00) == 0x7c00);
  const uint32_t bits = (normal & ~special) | ((mag | 0x7f800000u) & special);
  return bits_to_float(bits | (uint32_t(h & 0x8000) << 16));
}

int quantize_one(float x, float s, int qmax) {
  if (s == 0.0f) return 0;
  return std::clamp(int(std::rint(x / s)), -qmax, qmax);
}

}  // namespace

void quantize_kv_block(KvFormat f, const float* x, int n, uint8_t* data, uint16_t* scale) {
  switch (f) {
    case KvFormat::fp16:
      for (int i = 0; i < n; ++i) {
        const uint16_t h = float_to_half(x[i]);
        std::memcpy(data + 2 * i, &h, 2);
      }
      *scale = 0;
      return;
    case KvFormat::q8: {
      *scale = group_scale(group_amax(x, n), 127.0f);
      const float s = half_to_float(*scale);
      for (int i = 0; i < n; ++i) data[i] = uint8_t(int8_t(quantize_one(x[i], s, 127)));
      return;
    }
    case KvFormat::q4: {
      *scale = group_scale(group_amax(x, n), 7.0f);
      const float s = half_to_float(*scale);
      for (int i = 0; i < n; i += 2) {
        const unsigned lo = unsigned(quantize_one(x[i], s, 7) + 8);
        const unsigned hi = i + 1 < n ? unsigned(quantize_one(x[i + 1], s, 7) + 8) : 0u;
        data[i / 2] = uint8_t(lo | (hi << 4));
      }
      return;
    }
  }
}

void dequantize_kv_block(KvFormat f, const uint8_t* data, uint16_t scale, int n, float* out) {
  switch (f) {
    case KvFormat::fp16:
      for (int i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = half_to_float_fast(h);
      }
      return;
    case KvFormat::q8: {
      const float s = half_to_float(scale);
      for (int i = 0; i < n; ++i) out[i] = float(int8_t(data[i])) * s;
      return;
    }
    case KvFormat::q4: {
      const float s = half_to_float(scale);
      for (int j = 0; j < n / 2; ++j) {
        out[2 * j] = float(int(data[j] & 15u) - 8) * s;
        out[2 * j + 1] = float(int(data[j] >> 4) - 8) * s;
      }
      if (n & 1) out[n - 1] = float(int(data[n / 2] & 15u) - 8) * s;
      return;
    }
  }
}

namespace {

// Byte offset of group g inside a row.
size_t group_data_offset(KvFormat f, int g) {
  return kv_row_data_bytes(f, g * kv_group_size);
}

}  // namespace

void quantize_kv_rows(KvFormat f, const float* x, int n_rows, int head_dim, uint8_t* data,
                      uint16_t* scales) {
  const size_t row_bytes = kv_row_data_bytes(f, head_dim);
  const int groups = (head_dim + kv_group_size - 1) / kv_group_size;
  const int row_scales = kv_row_scales(f, head_dim);
  for (int r = 0; r < n_rows; ++r) {
    for (int g = 0; g < groups; ++g) {
      const int n = std::min(kv_group_size, head_dim - g * kv_group_size);
      uint16_t s = 0;
      quantize_kv_block(f, x + size_t(r) * size_t(head_dim) + size_t(g) * kv_group_size, n,
                        data + size_t(r) * row_bytes + group_data_offset(f, g), &s);
      if (row_scales > 0) scales[size_t(r) * size_t(row_scales) + size_t(g)] = s;
    }
  }
}

void dequantize_kv_rows(KvFormat f, const uint8_t* data, const uint16_t* scales, int n_rows,
                        int head_dim, float* out) {
  const size_t row_bytes = kv_row_data_bytes(f, head_dim);
  if (f == KvFormat::fp16) {
    dequantize_kv_block(f, data, 0, n_rows * head_dim, out);
    return;
  }
  const int groups = kv_row_scales(f, head_dim);
  for (int r = 0; r < n_rows; ++r) {
    for (int g = 0; g < groups; ++g) {
      const int n = std::min(kv_group_size, head_dim - g * kv_group_size);
      dequantize_kv_block(f, data + size_t(r) * row_bytes + group_data_offset(f, g),
                          scales[size_t(r) * size_t(groups) + size_t(g)], n,
                          out + size_t(r) * size_t(head_dim) + size_t(g) * kv_group_size);
    }
  }
}

}  // namespace exl
