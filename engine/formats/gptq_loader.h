// Loading one 4-bit GPTQ linear layer (exl2-engine.md §1.10) from a model directory.
//
// Tensors read, for a prefix such as "model.layers.0.mlp.up_proj":
//   <prefix>.qweight  I32 [K/8, N]   row k at bits 4·(k%8) of word k/8
//   <prefix>.qzeros   I32 [G, N/8]   column n at bits 4·(n%8)
//   <prefix>.scales   F16 [G, N]
//   <prefix>.g_idx    I32 [K]        optional; all zeros counts as absent; values in [0, G)
//   <prefix>.bias     float [N]      optional; dropped when all zeros
// Without g_idx, row k belongs to group k / gs with gs the smallest power of two such that
// gs·G ≥ K. Zero convention: v1 (effective zero = stored + 1) unless config.json's
// quantization_config.checkpoint_format is "gptq_v2" (effective zero = stored). Only 4-bit GPTQ
// exists here: a config with quant_method "gptq" and other bits is rejected. A v2 stored zero of 0
// means 0 (ExLlamaV2's subtract-0x11111111 trick would borrow across nibbles there).
#pragma once
#include <cstdint>
#include <string_view>

#include "engine/formats/model_dir.h"
#include "kernels/linear_weights.h"

namespace exl {

// Loads and validates the GPTQ matrix under `prefix` with the dimensions the config expects.
// The matrix points into `dir`'s mapped files. Throws exl::Error naming file, tensor and problem.
GptqMatrix load_gptq_matrix(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                            int64_t out_features);

// The group size GPTQ implies without g_idx: the smallest power of two gs with gs·groups ≥ K.
int64_t gptq_implied_group_size(int64_t in_features, int64_t num_groups);

}  // namespace exl
