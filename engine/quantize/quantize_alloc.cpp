#include "engine/quantize/quantize_alloc.h"

#include "kernels/error.h"

namespace exl {

std::vector<size_t> allocate_bits(std::span<const LayerOptions> layers, int64_t budget_bits) {
  std::vector<size_t> pick(layers.size(), 0);
  int64_t used = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& o = layers[l];
    EXL_CHECK(!o.bits.empty() && o.bits.size() == o.error.size(), "engine: quantize: layer ", l, " has no options");
    for (size_t i = 1; i < o.bits.size(); ++i)
      if (o.bits[i] < o.bits[pick[l]]) pick[l] = i;
    used += o.bits[pick[l]];
  }
  EXL_CHECK(used <= budget_bits, "engine: quantize: the budget of ", budget_bits, " bits is below the smallest layout (",
            used, " bits); raise --bpw");
  for (;;) {
    double best_ratio = 0;
    size_t best_layer = layers.size(), best_option = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      const auto& o = layers[l];
      const int64_t cur_bits = o.bits[pick[l]];
      const double cur_err = o.error[pick[l]];
      for (size_t i = 0; i < o.bits.size(); ++i) {
        const int64_t extra = o.bits[i] - cur_bits;
        if (extra <= 0 || used + extra > budget_bits || !(o.error[i] < cur_err)) continue;
        const double ratio = (cur_err - o.error[i]) / double(extra);
        if (ratio > best_ratio) best_ratio = ratio, best_layer = l, best_option = i;
      }
    }
    if (best_layer == layers.size()) break;
    used += layers[best_layer].bits[best_option] - layers[best_layer].bits[pick[best_layer]];
    pick[best_layer] = best_option;
  }
  return pick;
}

}  // namespace exl
