// Integer helpers for sizes and grid shapes, shared by the engine's memory plan and the CUDA
// backend's launch planning. Arguments are non-negative, divisors positive.
#pragma once

#include <cstdint>

namespace exl {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The smallest power of two that is at least max(n, 1).
constexpr int64_t pow2_ceil(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace exl
