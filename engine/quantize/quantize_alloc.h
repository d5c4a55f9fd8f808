// Per-block bit allocation under a bits-per-weight budget: every slot (a layer, or an attention
// or MLP block) has measured options (storage bits, error), and the allocation picks one option
// per slot minimizing the summed error subject to the summed bits staying within the budget.
// Optimizer: exact dynamic programming over the slots (a multiple-choice knapsack) with bits
// counted in units of budget/20000 rounded up (so it never exceeds the budget), then the bits that
// rounding left unused spent greedily (largest error reduction that fits first); optimal up to
// that rounding (≤ slots · budget/20000 bits). Pure function.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace exl {

struct LayerOptions {
  std::vector<int64_t> bits;   // storage bits of each option
  std::vector<double> error;   // its error (any additive measure)
};

// The chosen option index per slot. Throws exl::Error naming the least achievable budget when
// even the cheapest options exceed `budget_bits`.
std::vector<size_t> allocate_bits(std::span<const LayerOptions> layers, int64_t budget_bits);

}  // namespace exl
