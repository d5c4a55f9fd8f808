// Storage formats of the paged KV cache and the byte layout of one page. Pure arithmetic shared
// by the CPU and CUDA backends; the (de)quantization itself is in kernels/cpu/kv_quant.h.
//
// A row is one token's vector for one kv head: head_dim elements.
//   fp16: head_dim IEEE halves (round to nearest even), no scales.
//   q8:   head_dim int8 q in [-127, 127]; x ~ q * s.
//   q4:   ceil(head_dim / 2) bytes, element e in byte e / 2 (low nibble when e is even), nibble =
//         q + 8 with q in [-7, 7]; x ~ q * s. An unused high nibble (odd head_dim) is 0.
// Quantized rows are split into groups of kv_group_size = 32 consecutive elements (the last group
// is shorter when head_dim % 32 != 0), each with one fp16 scale s: the smallest fp16 value
// >= max|x| / qmax (qmax = 127 or 7), so |x| / s <= qmax and q = round-half-even(x / s) needs no
// clamping; the error is at most s / 2 per element. An all-zero group has s = 0 and q = 0.
//
// Page (page_size tokens) = n_layers x {K, V} x n_kv_heads planes, in that nesting order. Plane =
// data [page_size][row_bytes], padded to 16 bytes, then scales [page_size][row_scales] fp16,
// padded to 16 bytes. So the rows of one kv head are contiguous inside a page, and every plane
// starts 16-byte aligned (pages are too, when the pool is).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace exl {

enum class KvFormat : uint8_t { fp16, q8, q4 };
inline constexpr int n_kv_formats = 3;

// "fp16", "q8", "q4".
std::string_view to_string(KvFormat f);
std::optional<KvFormat> kv_format_from_string(std::string_view s);

inline constexpr int kv_group_size = 32;

constexpr size_t kv_row_data_bytes(KvFormat f, int head_dim) {
  switch (f) {
    case KvFormat::fp16: return size_t(head_dim) * 2;
    case KvFormat::q8: return size_t(head_dim);
    case KvFormat::q4: return (size_t(head_dim) + 1) / 2;
  }
  return 0;
}

// fp16 scales per row: 0 for fp16, ceil(head_dim / 32) otherwise.
constexpr int kv_row_scales(KvFormat f, int head_dim) {
  return f == KvFormat::fp16 ? 0 : (head_dim + kv_group_size - 1) / kv_group_size;
}

struct KvPageLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  KvFormat format = KvFormat::fp16;

  static constexpr size_t pad16(size_t n) { return (n + 15) & ~size_t(15); }

  size_t row_bytes() const { return kv_row_data_bytes(format, head_dim); }
  int row_scales() const { return kv_row_scales(format, head_dim); }
  // Offset of the scales inside a plane.
  size_t scales_offset() const { return pad16(size_t(page_size) * row_bytes()); }
  size_t plane_bytes() const {
    return scales_offset() + pad16(size_t(page_size) * size_t(row_scales()) * 2);
  }
  size_t page_bytes() const { return size_t(n_layers) * 2 * size_t(n_kv_heads) * plane_bytes(); }
  // kv: 0 = K, 1 = V.
  size_t plane_offset(int layer, int kv, int head) const {
    return ((size_t(layer) * 2 + size_t(kv)) * size_t(n_kv_heads) + size_t(head)) * plane_bytes();
  }
};

}  // namespace exl
