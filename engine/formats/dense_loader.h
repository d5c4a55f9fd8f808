// Loading one unquantized linear layer: `<prefix>.weight` F16, BF16 or F32 in HF orientation
// [out_features, in_features], plus the optional `<prefix>.bias` (any float dtype, [out_features]).
#pragma once
#include <cstdint>
#include <string_view>

#include "engine/formats/model_dir.h"
#include "kernels/linear_weights.h"

namespace exl {

// The matrix points into `dir`'s mapped files. Throws exl::Error naming file, tensor and problem.
DenseMatrix load_dense_matrix(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                              int64_t out_features);

}  // namespace exl
