#include "engine/mlp_order.h"

#include <numeric>

#include "kernels/error.h"

namespace exl {

OrderedMlp order_mlp_by_down(LinearWeights gate, LinearWeights up, LinearWeights down) {
  const int64_t I = in_features(down);
  EXL_CHECK(out_features(gate) == I && out_features(up) == I, "engine: mlp order: gate/up have ", out_features(gate),
            " and ", out_features(up), " output features, down_proj reads ", I);
  OrderedMlp m;
  const auto* d = std::get_if<Exl2Matrix>(&down);
  const auto is_identity = [](const std::vector<int32_t>& p) {
    for (size_t j = 0; j < p.size(); ++j)
      if (p[j] != int32_t(j)) return false;
    return true;
  };
  if (!d || is_identity(d->perm) || std::holds_alternative<GptqMatrix>(gate) || std::holds_alternative<GptqMatrix>(up)) {
    m.gate.weights = std::move(gate);
    m.up.weights = std::move(up);
    m.down = std::move(down);
    return m;
  }
  m.gate = slice_linear_columns(gate, d->perm);
  m.up = slice_linear_columns(up, d->perm);
  Exl2Matrix in_order = *d;
  std::iota(in_order.perm.begin(), in_order.perm.end(), 0);
  m.down = std::move(in_order);
  m.ordered = true;
  return m;
}

}  // namespace exl
