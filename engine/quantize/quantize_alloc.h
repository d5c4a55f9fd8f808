// Per-layer bit allocation under a bits-per-weight budget: every layer has measured options
// (storage bits, weight error), and the allocation minimizes the summed error subject to the
// summed bits staying within the budget, greedily by error reduction per extra bit (starting from
// every layer's cheapest option; each step takes the best-ratio upgrade that still fits, jumping
// over options when that gives a better ratio). Pure function.
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

// The chosen option index per layer. Throws exl::Error naming the least achievable budget when
// even the cheapest options exceed `budget_bits`.
std::vector<size_t> allocate_bits(std::span<const LayerOptions> layers, int64_t budget_bits);

}  // namespace exl
