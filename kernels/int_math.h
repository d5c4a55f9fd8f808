// Integer helpers for sizes and grid shapes, shared by the engine's memory plan and the CUDA
// backend's launch planning. Arguments are non-negative, divisors positive.
#pragma once

#include <cstdint>

namespace exl {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace exl
