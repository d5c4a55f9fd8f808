// EXL2 layouts and the quantization of one weight matrix's groups: per group a scale search in
// the converter's parameterization (exl2-engine.md §8.4): 4-bit per-column scale codes relative to
// the group maximum, one fp16 maximum per group, and a global multiplier p ∈ [0.70, 1.20] on a
// 16-point grid chosen to minimize the group's squared weight error. Codes round as
// q = clamp(rint(w/s) + z, 0, 2^b−1). gptq.h uses the scale search on error-compensated rows;
// quantize_exl2 is plain round-to-nearest (no calibration), the reference GPTQ is tested against.
//
// Layout options ("bits:fraction@group_size" segments, highest width first) follow the
// converter's segment rule (§8.5): segment i takes ceil(min(K·fraction, remaining)/gs) groups of gs
// rows; the last group of the layer is cut at K.
//
// Pure functions; safe to call concurrently on different data.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/formats/exl2_writer.h"

namespace exl {

struct QuantSegment {
  int bits = 4;
  double fraction = 1.0;
  int64_t group_size = 128;
};
using QuantOption = std::vector<QuantSegment>;

// The head's option for --head-bits 2, 3, 4, 5, 6 or 8 (the converter's head options, e.g. 6 →
// 8:0.15,6:0.85@128). Throws exl::Error for other values.
QuantOption head_quant_option(int head_bits);
// "8:0.15,6:0.85@128" style text.
std::string to_string(const QuantOption& o);

// (bits, rows) groups of option `o` over K rows.
std::vector<std::pair<int, int64_t>> option_groups(const QuantOption& o, int64_t in_features);
// Storage bits of a K×N layer with these groups (model_summary.h's accounting).
int64_t exl2_storage_bits(std::span<const std::pair<int, int64_t>> groups, int64_t in_features, int64_t out_features);

// Input features by descending saliency ‖W[:, k]‖² (ties by index): the act-order permutation.
// w is [N, K] row-major (HF orientation).
std::vector<int32_t> saliency_order(std::span<const float> w, int64_t out_features, int64_t in_features);

// W [N, K] gathered in permuted-row order: row j = W[:, perm[j]] (N floats).
std::vector<float> permuted_rows(std::span<const float> w, int64_t out_features, int64_t in_features,
                                 std::span<const int32_t> perm);

// The scales one group of rows × N values gets from the scale search above: scale codes, the
// fp16 maximum, and the per-column scale exactly as inference dequantizes with it.
struct GroupScales {
  std::vector<uint32_t> qscale;  // [N], in [1, 16] (stored as qscale − 1)
  uint16_t smax = 0;             // fp16 bits
  std::vector<float> scale;      // [N]
  std::vector<float> inv;        // [N] 1/scale, 0 where the scale is 0
};
GroupScales fit_group_scales(const float* rows_data, int64_t rows, int64_t n_cols, int bits);

// Quantizes W [N, K] with act-order `perm` and the given groups into EXL2 tensors; adds the
// total squared weight error to *sq_error when given.
Exl2Tensors quantize_exl2(std::span<const float> w, int64_t out_features, int64_t in_features,
                          std::vector<int32_t> perm, std::span<const std::pair<int, int64_t>> groups,
                          double* sq_error = nullptr);

}  // namespace exl
