#include "engine/quantize/quantize_alloc.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/error.h"

namespace exl {

std::vector<size_t> allocate_bits(std::span<const LayerOptions> layers, int64_t budget_bits) {
  int64_t least = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& o = layers[l];
    EXL_CHECK(!o.bits.empty() && o.bits.size() == o.error.size(), "engine: quantize: slot ", l, " has no options");
    least += *std::min_element(o.bits.begin(), o.bits.end());
  }
  EXL_CHECK(least <= budget_bits, "engine: quantize: the budget of ", budget_bits,
            " bits is below the smallest layout (", least, " bits); raise --bpw");
  constexpr int64_t kUnits = 20000;
  const int64_t unit = std::max<int64_t>(1, (budget_bits + kUnits - 1) / kUnits);
  const int64_t cap = budget_bits / unit;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[c]: least error of the slots so far using exactly c units; choice[l][c] the option taken.
  std::vector<double> best(size_t(cap + 1), kInf), next;
  best[0] = 0;
  std::vector<std::vector<int32_t>> choice(layers.size(), std::vector<int32_t>(size_t(cap + 1), -1));
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& o = layers[l];
    next.assign(size_t(cap + 1), kInf);
    for (size_t i = 0; i < o.bits.size(); ++i) {
      const int64_t cost = (o.bits[i] + unit - 1) / unit;
      for (int64_t c = cap; c >= cost; --c) {
        const double e = best[size_t(c - cost)] + o.error[i];
        if (e < next[size_t(c)]) next[size_t(c)] = e, choice[l][size_t(c)] = int32_t(i);
      }
    }
    best.swap(next);
  }
  int64_t at = 0;
  for (int64_t c = 0; c <= cap; ++c)
    if (best[size_t(c)] < best[size_t(at)]) at = c;
  // Rounding units up can make the cheapest options not fit in `cap` units though their bits do:
  // fall back to the cheapest option of every slot.
  std::vector<size_t> pick(layers.size(), 0);
  if (!std::isfinite(best[size_t(at)])) {
    for (size_t l = 0; l < layers.size(); ++l)
      pick[l] = size_t(std::min_element(layers[l].bits.begin(), layers[l].bits.end()) - layers[l].bits.begin());
    return pick;
  }
  for (size_t l = layers.size(); l-- > 0;) {
    const int32_t i = choice[l][size_t(at)];
    pick[l] = size_t(i);
    at -= (layers[l].bits[size_t(i)] + unit - 1) / unit;
  }
  // The bits the rounding left unused: the largest error reduction that fits, until none does.
  int64_t used = 0;
  for (size_t l = 0; l < layers.size(); ++l) used += layers[l].bits[pick[l]];
  for (;;) {
    double gain = 0;
    size_t best_l = layers.size(), best_i = 0;
    for (size_t l = 0; l < layers.size(); ++l)
      for (size_t i = 0; i < layers[l].bits.size(); ++i) {
        const double g = layers[l].error[pick[l]] - layers[l].error[i];
        if (g > gain && used - layers[l].bits[pick[l]] + layers[l].bits[i] <= budget_bits) gain = g, best_l = l, best_i = i;
      }
    if (best_l == layers.size()) break;
    used += layers[best_l].bits[best_i] - layers[best_l].bits[pick[best_l]];
    pick[best_l] = best_i;
  }
  return pick;
}

}  // namespace exl
