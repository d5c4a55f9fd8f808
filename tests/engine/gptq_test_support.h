// What the CPU and device GPTQ tests share: random weights, and the measure of a quantized
// linear, its output error on given inputs with the weights dequantized as inference does.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/formats/exl2_writer.h"
#include "kernels/cpu/dequantize.h"

namespace exl::test {

// W [n, k], N(0, 0.05) from `seed`.
inline std::vector<float> normal_weights(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(size_t(n * k));
  for (auto& v : w) v = nd(rng);
  return w;
}

// Σ over rows of ‖x·(W_q − W)ᵀ‖², x [rows, K], W [N, K].
inline double gptq_output_error(const Exl2Tensors& t, std::span<const float> w, std::span<const float> x,
                                int64_t rows) {
  const int64_t N = t.out_features, K = t.in_features;
  std::vector<float> back(size_t(t.padded_out * K));
  dequantize(t.view(), back);
  double err = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double d = 0;
      for (int64_t k = 0; k < K; ++k) d += double(x[size_t(r * K + k)]) * (back[size_t(n * K + k)] - w[size_t(n * K + k)]);
      err += d * d;
    }
  return err;
}

}  // namespace exl::test
