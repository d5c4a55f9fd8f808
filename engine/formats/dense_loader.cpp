#include "engine/formats/dense_loader.h"

#include <string>
#include <vector>

#include "engine/formats/tensor_access.h"

namespace exl {

DenseMatrix load_dense_matrix(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                              int64_t out_features) {
  EXL_CHECK(in_features > 0 && out_features > 0, "engine: dense: layer '", prefix, "': expected dimensions [",
            out_features, ", ", in_features, "] must be positive");
  std::string name = cat(prefix, ".weight");
  auto t = dir.find(name);
  EXL_CHECK(t.has_value(), "engine: dense: '", dir.path().string(), "': layer '", prefix, "': missing tensor '",
            name, "'");
  const DType dt = t->info->dtype;
  EXL_CHECK(is_float_dtype(dt), tensor_where("dense", *t), "has dtype ", to_string(dt),
            ", expected F16, BF16 or F32");
  const std::vector<int64_t> want{out_features, in_features};
  EXL_CHECK(t->info->shape == want, tensor_where("dense", *t), "has shape ", shape_to_string(t->info->shape),
            ", expected ", shape_to_string(want), " (out_features × in_features)");
  DenseMatrix m;
  m.in_features = in_features;
  m.out_features = out_features;
  m.dtype = dt;
  m.data = dt == DType::f32 ? static_cast<const void*>(tensor_data<float>(*t, "dense"))
                            : static_cast<const void*>(tensor_data<uint16_t>(*t, "dense"));
  m.bias = load_linear_bias(dir, prefix, out_features, "dense");
  return m;
}

}  // namespace exl
