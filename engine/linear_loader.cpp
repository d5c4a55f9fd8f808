#include "engine/linear_loader.h"

#include "kernels/error.h"
#include "kernels/half.h"

namespace exl {

LinearWeights load_linear(const ModelDir& dir, std::string_view prefix, int64_t in, int64_t out) {
  std::string p(prefix);
  if (p == "lm_head" && !dir.has("lm_head.weight")) p = "model.embed_tokens";
  int64_t shape[2] = {out, in};
  auto v = dir.require(p + ".weight", std::nullopt, shape);
  DenseMatrix m;
  m.in_features = in;
  m.out_features = out;
  m.dtype = v.info->dtype;
  m.data = v.data.data();
  if (dir.has(p + ".bias")) {
    int64_t bshape[1] = {out};
    m.bias = load_f32(dir, p + ".bias", bshape);
  }
  return m;
}

std::vector<float> load_f32(const ModelDir& dir, std::string_view name, std::span<const int64_t> shape) {
  auto v = dir.require(name, std::nullopt, shape);
  std::vector<float> out(size_t(v.info->numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (v.info->dtype == DType::f32) std::memcpy(&out[i], v.data.data() + 4 * i, 4);
    else {
      uint16_t h;
      std::memcpy(&h, v.data.data() + 2 * i, 2);
      out[i] = v.info->dtype == DType::f16 ? half_to_float(h) : bf16_to_float(h);
    }
  }
  return out;
}

}  // namespace exl
