#include "engine/formats/gptq_loader.h"

#include <algorithm>
#include <string>
#include <vector>

#include "engine/formats/tensor_access.h"

namespace exl {

namespace {

constexpr std::string_view k_gptq = "gptq";

std::string gptq_where(const TensorView& t) { return tensor_where(k_gptq, t); }

void check(const TensorView& t, DType dtype, const std::vector<int64_t>& shape, std::string_view meaning) {
  EXL_CHECK(t.info->dtype == dtype, gptq_where(t), "has dtype ", to_string(t.info->dtype), ", expected ",
            to_string(dtype));
  EXL_CHECK(t.info->shape == shape, gptq_where(t), "has shape ", shape_to_string(t.info->shape), ", expected ",
            shape_to_string(shape), " (", meaning, ")");
}

// g_idx from the file, or derived from the implied group size when absent or all zeros.
std::vector<int32_t> load_g_idx(const ModelDir& dir, std::string_view prefix, int64_t k, int64_t num_groups) {
  std::vector<int32_t> g_idx(size_t(k), 0);
  if (auto t = dir.find(cat(prefix, ".g_idx"))) {
    check(*t, DType::i32, {k}, "in_features");
    const auto* p = tensor_data<int32_t>(*t, k_gptq);
    if (std::any_of(p, p + k, [](int32_t v) { return v != 0; })) {
      for (int64_t i = 0; i < k; ++i)
        EXL_CHECK(p[i] >= 0 && p[i] < num_groups, gptq_where(*t), "row ", i, " has group ", p[i], ", outside [0, ",
                  num_groups, ")");
      std::copy(p, p + k, g_idx.begin());
      return g_idx;
    }
  }
  const int64_t gs = gptq_implied_group_size(k, num_groups);
  for (int64_t i = 0; i < k; ++i) g_idx[i] = int32_t(i / gs);
  return g_idx;
}

}  // namespace

int64_t gptq_implied_group_size(int64_t in_features, int64_t num_groups) {
  int64_t gs = 1;
  while (gs * num_groups < in_features) gs *= 2;
  return gs;
}

GptqMatrix load_gptq_matrix(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                            int64_t out_features) {
  EXL_CHECK(in_features > 0 && out_features > 0, "engine: gptq: layer '", prefix, "': expected dimensions [",
            out_features, ", ", in_features, "] must be positive");
  EXL_CHECK(in_features % 8 == 0 && out_features % 8 == 0, "engine: gptq: '", dir.path().string(), "': layer '",
            prefix, "': 4-bit GPTQ needs in_features and out_features divisible by 8, got ", in_features, " and ",
            out_features);
  const ModelConfig& cfg = dir.config();
  EXL_CHECK(cfg.quant_method != "gptq" || cfg.quant_bits == 0 || cfg.quant_bits == 4, "engine: gptq: '",
            (dir.path() / "config.json").string(), "': quantization_config.bits is ", cfg.quant_bits,
            "; only 4-bit GPTQ is supported");
  GptqMatrix m;
  m.in_features = in_features;
  m.out_features = out_features;
  m.zeros_v2 = cfg.checkpoint_format == "gptq_v2";

  TensorView qw = need_layer_tensor(dir, k_gptq, prefix, "qweight");
  check(qw, DType::i32, {in_features / 8, out_features}, "in_features / 8 × out_features, 4-bit");
  m.qweight = tensor_data<uint32_t>(qw, k_gptq);

  TensorView sc = need_layer_tensor(dir, k_gptq, prefix, "scales");
  EXL_CHECK(sc.info->shape.size() == 2 && sc.info->shape[0] > 0, gptq_where(sc), "has shape ",
            shape_to_string(sc.info->shape), ", expected [groups, ", out_features, "]");
  m.num_groups = sc.info->shape[0];
  EXL_CHECK(m.num_groups <= in_features, gptq_where(sc), "has ", m.num_groups, " groups, more than in_features ",
            in_features);
  check(sc, DType::f16, {m.num_groups, out_features}, "groups × out_features");
  m.scales = tensor_data<uint16_t>(sc, k_gptq);

  TensorView qz = need_layer_tensor(dir, k_gptq, prefix, "qzeros");
  check(qz, DType::i32, {m.num_groups, out_features / 8}, "groups × out_features / 8");
  m.qzeros = tensor_data<uint32_t>(qz, k_gptq);

  m.g_idx = load_g_idx(dir, prefix, in_features, m.num_groups);
  m.bias = load_linear_bias(dir, prefix, out_features, k_gptq);
  if (std::all_of(m.bias.begin(), m.bias.end(), [](float v) { return v == 0.0f; })) m.bias.clear();
  return m;
}

}  // namespace exl
