// Building EXL2 tensors for one linear layer (exl2-engine.md §1.2–1.8), the inverse of
// engine/exl2_loader: codes are stored as the continuous little-endian bitstream along K per
// group, scale codes as nibbles (column n at bits 4·(n%8)), padding columns hold the zero point so
// they dequantize to 0, and q_invperm = argsort(perm). view() gives the Exl2Matrix the backends and
// kernels/cpu/dequantize read, so a written layer can be checked through the inference path.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/linear_weights.h"

namespace exl {

// Groups from (bits, rows) pairs in permuted-row order. Throws exl::Error unless widths are
// EXL2 widths sorted descending, rows are multiples of 32 (16 for 2-bit) except the last, and
// the rows add up to K.
std::vector<Exl2Group> make_exl2_groups(std::span<const std::pair<int, int64_t>> bits_rows, int64_t in_features);

// The tensors of one EXL2 linear, owned. Built by make_exl2_tensors, then filled with set_code /
// set_scale; not thread-safe while being filled.
struct Exl2Tensors {
  int64_t in_features = 0, out_features = 0, padded_out = 0, q_rows = 0;
  std::vector<Exl2Group> groups;
  std::vector<int32_t> perm;          // [K] permuted row j holds input feature perm[j]
  std::vector<uint32_t> q_weight;     // [QR, Np]
  std::vector<uint32_t> q_scale;      // [G, Np/8]
  std::vector<uint16_t> q_scale_max;  // [G] fp16 bits
  std::vector<uint16_t> bias;         // [N] fp16 bits, or empty

  // Points into this object: valid while it lives and is not resized.
  Exl2Matrix view() const;
  std::vector<int16_t> q_groups() const;   // (bits, qrow_start) pairs
  std::vector<int32_t> q_invperm() const;  // argsort(perm)
  // Bytes of q_weight + q_scale + q_scale_max + q_groups + q_invperm (model_summary.h's rule).
  int64_t storage_bytes() const;
};

// Empty tensors for a K×N layer: every code is the zero point, every scale code 0 (scale 1/256
// of q_scale_max, which starts at 0). perm must be a permutation of [0, K).
Exl2Tensors make_exl2_tensors(int64_t in_features, int64_t out_features, std::vector<Exl2Group> groups,
                              std::vector<int32_t> perm);

// Stores code q (< 2^bits) of row j of group g (0-based within the group), column n.
void set_code(Exl2Tensors& t, size_t g, int64_t j, int64_t n, uint32_t q);
// Stores the 4-bit scale code (qscale − 1, in [0, 15]) of group g, column n.
void set_scale_code(Exl2Tensors& t, size_t g, int64_t n, uint32_t code);

}  // namespace exl
