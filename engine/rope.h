// RoPE frequency tables for the rope types of model_config.h (default, linear, llama3, yarn),
// computed in double as HF's formulas define them.
#pragma once
#include "engine/formats/model_config.h"
#include "kernels/backend.h"

namespace exl {

RopeTable make_rope_table(const RopeConfig& rope, int head_dim, int64_t max_position_embeddings);

}  // namespace exl
