// What the CPU and device GPTQ tests share: random weights, and the measure of a quantized
// linear, its output error on given inputs with the weights dequantized as inference does.
#pragma once
#include <cmath>
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

// Correlated inputs [rows, k]: x = z·M with z ~ N(0, 1) and a random mixing M (identity plus
// N(0, 1/k)), then feature scales from 0.1 to 3, so the Hessian is far from diagonal and act-order
// matters; input feature `dead` (if any) all zero.
inline std::vector<float> correlated_inputs(int64_t rows, int64_t k, uint32_t seed, int64_t dead = -1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> mix(size_t(k * k)), z(size_t(rows * k)), x(size_t(rows * k), 0.0f);
  for (auto& v : mix) v = nd(rng) / std::sqrt(float(k));
  for (int64_t i = 0; i < k; ++i) mix[size_t(i * k + i)] += 1.0f;
  for (auto& v : z) v = nd(rng);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) x[size_t(t * k + j)] += z[size_t(t * k + i)] * mix[size_t(i * k + j)];
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < k; ++j)
      x[size_t(t * k + j)] *= j == dead ? 0.0f : 0.1f + 2.9f * float((j * 37) % k) / float(k);
  return x;
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
