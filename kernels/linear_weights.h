// The weights of one linear layer y = x · Wᵀ (+ b), in each supported storage format, as the
// backends consume them. K = in_features, N = out_features. Raw pointers point into memory owned
// elsewhere (a mapped model file or a backend buffer) that must outlive the struct; std::vectors
// hold data derived at load time. Loaders validate everything; backends trust these invariants.
#pragma once
#include <cstdint>
#include <variant>
#include <vector>

#include "kernels/dtype.h"

namespace exl {

// One EXL2 group: `rows` consecutive permuted rows starting at `row_start`, packed at `bits`
// per value from 32-bit word row `qrow_start` of q_weight (exl2-engine.md §1.5–1.6).
struct Exl2Group {
  int bits = 0;        // 2, 3, 4, 5, 6 or 8
  int64_t row_start = 0;
  int64_t rows = 0;
  int64_t qrow_start = 0;
};

// EXL2: groups sorted by bits descending, cover rows [0, K) contiguously; rows are multiples of
// 32 (16 for 2-bit) except possibly the last; q_rows = Σ rows·bits/32.
struct Exl2Matrix {
  int64_t in_features = 0;     // K
  int64_t out_features = 0;    // N
  int64_t padded_out = 0;      // Np = ceil(N/32)·32
  int64_t q_rows = 0;          // QR
  const uint32_t* q_weight = nullptr;     // [QR, Np]
  const uint32_t* q_scale = nullptr;      // [G, Np/8], 4-bit codes, column n at bits 4·(n%8)
  const uint16_t* q_scale_max = nullptr;  // [G] fp16 bits
  std::vector<Exl2Group> groups;          // [G]
  std::vector<int32_t> perm;              // [K] permuted row j holds input feature perm[j]
  std::vector<float> bias;                // [N] or empty
};

// GPTQ 4-bit, v1 zero convention (effective zero = stored + 1) unless `zeros_v2`.
struct GptqMatrix {
  int64_t in_features = 0;   // K (multiple of 8)
  int64_t out_features = 0;  // N (multiple of 8)
  int64_t num_groups = 0;    // G
  const uint32_t* qweight = nullptr;  // [K/8, N], row k at bits 4·(k%8) of word k/8
  const uint32_t* qzeros = nullptr;   // [G, N/8], column n at bits 4·(n%8)
  const uint16_t* scales = nullptr;   // [G, N] fp16 bits
  std::vector<int32_t> g_idx;         // [K] group of each row (derived when absent)
  bool zeros_v2 = false;
  std::vector<float> bias;            // [N] or empty
};

// Unquantized, HF orientation [N, K] row-major, dtype f16, bf16 or f32.
struct DenseMatrix {
  int64_t in_features = 0;
  int64_t out_features = 0;
  DType dtype = DType::f16;
  const void* data = nullptr;  // [N, K]
  std::vector<float> bias;     // [N] or empty
};

using LinearWeights = std::variant<Exl2Matrix, GptqMatrix, DenseMatrix>;

inline int64_t in_features(const LinearWeights& w) {
  return std::visit([](const auto& m) { return m.in_features; }, w);
}
inline int64_t out_features(const LinearWeights& w) {
  return std::visit([](const auto& m) { return m.out_features; }, w);
}

}  // namespace exl
