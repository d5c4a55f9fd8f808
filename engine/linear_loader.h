// TEMPORARY dense-only shim; replaced by the full EXL2/GPTQ/dense loader.
#pragma once
#include <string_view>
#include <vector>

#include "engine/model_dir.h"
#include "kernels/linear_weights.h"

namespace exl {

LinearWeights load_linear(const ModelDir& dir, std::string_view prefix, int64_t in_features, int64_t out_features);
std::vector<float> load_f32(const ModelDir& dir, std::string_view name, std::span<const int64_t> shape);

}  // namespace exl
