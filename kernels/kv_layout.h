// Physical layout of the paged KV cache, shared by every backend so that a page written by one is
// read identically by another. A pool is `num_pages` pages; a page holds `page_size` token slots
// for every layer: [layer][K=0,V=1][kv_head][slot][head_dim] elements in the storage format.
// Quantized formats store each head vector as blocks of `block` elements along head_dim
// (block = 32 when head_dim % 32 == 0, else head_dim) with one fp16 scale per block, kept in a
// separate scale area of the page: [layer][K,V][kv_head][slot][head_dim / block] fp16.
//   f32:  element = x (exact; the CPU default, so CPU logits match float references)
//   fp16: element = fp16(x)
//   q8:   s = max|x| / 127, q = round(x / s) in int8 (−127..127), x' = q·s
//   q4:   s = max|x| / 7,   q = round(x / s) in −7..7 stored as q+8 in 4 bits, two per byte
//         (element 2i in the low nibble); x' = q·s
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace exl {

enum class KvFormat : uint8_t { f32, fp16, q8, q4 };
std::string to_string(KvFormat f);
KvFormat kv_format_from_string(const std::string& s);  // throws exl::Error

struct KvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 64;
  KvFormat format = KvFormat::fp16;

  int block() const { return head_dim % 32 == 0 ? 32 : head_dim; }
  int blocks_per_vec() const { return head_dim / block(); }
  // Bytes of one head vector's elements (without scales).
  size_t vec_bytes() const {
    switch (format) {
      case KvFormat::f32: return size_t(head_dim) * 4;
      case KvFormat::fp16: return size_t(head_dim) * 2;
      case KvFormat::q8: return size_t(head_dim);
      case KvFormat::q4: return size_t(head_dim + 1) / 2;
    }
    return 0;
  }
  size_t vec_scale_bytes() const {
    return format == KvFormat::f32 || format == KvFormat::fp16 ? 0 : size_t(blocks_per_vec()) * 2;
  }
  size_t n_vecs_per_page() const { return size_t(n_layers) * 2 * n_kv_heads * page_size; }
  size_t page_bytes() const { return n_vecs_per_page() * (vec_bytes() + vec_scale_bytes()); }
  // Index of the vector (layer, kv (0=K,1=V), head, slot) within its page.
  size_t vec_index(int layer, int kv, int head, int slot) const {
    return ((size_t(layer) * 2 + kv) * n_kv_heads + head) * page_size + slot;
  }
  // Byte offsets inside a page.
  size_t data_offset(size_t vec) const { return vec * vec_bytes(); }
  size_t scale_offset(size_t vec) const { return n_vecs_per_page() * vec_bytes() + vec * vec_scale_bytes(); }
  // Bytes of KV storage per token across all layers.
  double bytes_per_token() const { return double(page_bytes()) / page_size; }
};

}  // namespace exl
