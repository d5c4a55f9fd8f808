// Loading one EXL2-quantized linear layer (exl2-engine.md §1.2–1.9) from a model directory.
//
// Tensors read, for a prefix such as "model.layers.0.mlp.up_proj":
//   <prefix>.q_weight     I32 [QR, Np]   Np = ceil(N/32)·32
//   <prefix>.q_scale      I32 [G, Np/8]
//   <prefix>.q_scale_max  F16 [G]        finite
//   <prefix>.q_groups     I16 [2G]       (bits, qrow_start) pairs
//   <prefix>.q_invperm    I32 or I16 [K] a permutation of [0, K)
//   <prefix>.bias         float [N]      optional
//   <prefix>.q_perm is ignored: perm is always recomputed as argsort(q_invperm).
// Every structural invariant the kernels rely on is checked here (see Exl2Matrix).
#pragma once
#include <cstdint>
#include <string_view>

#include "engine/formats/model_dir.h"
#include "kernels/linear_weights.h"

namespace exl {

// Loads and validates the EXL2 matrix under `prefix`. `in_features` (K) and `out_features` (N,
// unpadded; vocab_size for lm_head) are the dimensions the config expects. The returned matrix
// points into `dir`'s mapped files and must not outlive it. Throws exl::Error naming the file,
// the tensor and the problem.
Exl2Matrix load_exl2_matrix(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                            int64_t out_features);

// True when `bits` is a width EXL2 kernels support (2, 3, 4, 5, 6, 8).
bool is_exl2_bit_width(int64_t bits);

}  // namespace exl
