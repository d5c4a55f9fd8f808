// CPU (de)quantization of KV-cache rows in the formats of kernels/kv_layout.h. Pure functions,
// any thread. Inputs are trusted (the page cache validates positions and shapes); values are
// expected finite.
#pragma once
#include <cstdint>

#include "kernels/kv_layout.h"

namespace exl {

// One group of n elements x[n] (1..32 for q8/q4, any n for fp16). fp16: data[2n] (halves, little-endian), *scale = 0.
// q8: data[n] int8. q4: data[ceil(n/2)] nibbles. *scale = the group's fp16 scale bits.
void quantize_kv_block(KvFormat f, const float* x, int n, uint8_t* data, uint16_t* scale);
// Inverse of quantize_kv_block: out[n] = q * scale (or the halves for fp16; scale ignored).
void dequantize_kv_block(KvFormat f, const uint8_t* data, uint16_t scale, int n, float* out);

// n_rows rows of head_dim elements: x [n_rows][head_dim] -> data [n_rows][row_bytes] and
// scales [n_rows][row_scales] (unused for fp16; may be null then).
void quantize_kv_rows(KvFormat f, const float* x, int n_rows, int head_dim, uint8_t* data,
                      uint16_t* scales);
// The read path of attention: data/scales as above -> out [n_rows][head_dim].
void dequantize_kv_rows(KvFormat f, const uint8_t* data, const uint16_t* scales, int n_rows,
                        int head_dim, float* out);

}  // namespace exl
