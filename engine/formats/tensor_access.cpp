#include "engine/formats/tensor_access.h"

#include <algorithm>

#include "kernels/half.h"

namespace exl {

std::string tensor_where(std::string_view concept_name, const TensorView& t) {
  return cat("engine: ", concept_name, ": '", t.file, "': tensor '", t.info->name, "': ");
}

bool is_float_dtype(DType t) { return t == DType::f16 || t == DType::bf16 || t == DType::f32; }

std::vector<float> tensor_to_f32(const TensorView& t, std::string_view concept_name) {
  const DType dt = t.info->dtype;
  EXL_CHECK(is_float_dtype(dt), tensor_where(concept_name, t), "has dtype ", to_string(dt),
            ", expected F16, BF16 or F32");
  const size_t n = size_t(t.info->numel());
  std::vector<float> out(n);
  if (dt == DType::f32) {
    const float* p = tensor_data<float>(t, concept_name);
    std::copy(p, p + n, out.begin());
  } else {
    const uint16_t* p = tensor_data<uint16_t>(t, concept_name);
    if (dt == DType::f16)
      std::transform(p, p + n, out.begin(), half_to_float);
    else
      std::transform(p, p + n, out.begin(), bf16_to_float);
  }
  return out;
}

std::vector<float> load_f32(const ModelDir& dir, std::string_view name, std::span<const int64_t> shape) {
  TensorView t = dir.require(name, std::nullopt, shape);
  return tensor_to_f32(t, "tensor");
}

TensorView need_layer_tensor(const ModelDir& dir, std::string_view concept_name, std::string_view prefix,
                             std::string_view suffix) {
  std::string name = cat(prefix, ".", suffix);
  auto t = dir.find(name);
  EXL_CHECK(t.has_value(), "engine: ", concept_name, ": '", dir.path().string(), "': layer '", prefix,
            "': missing tensor '", name, "'");
  return *t;
}

std::vector<float> load_linear_bias(const ModelDir& dir, std::string_view prefix, int64_t out_features,
                                    std::string_view concept_name) {
  auto t = dir.find(cat(prefix, ".bias"));
  if (!t) return {};
  EXL_CHECK(t->info->shape == std::vector<int64_t>{out_features}, tensor_where(concept_name, *t), "has shape ",
            shape_to_string(t->info->shape), ", expected [", out_features, "] (out_features)");
  return tensor_to_f32(*t, concept_name);
}

}  // namespace exl
