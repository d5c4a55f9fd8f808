// Test-only builders of random weights in every format (with owned storage), and naive
// element-wise dequantizers written directly from the format description (exl2-engine.md §1.5–1.10),
// used as independent references for the backends' linear kernels.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/half.h"
#include "kernels/linear_weights.h"

namespace exl::test {

struct OwnedExl2 {
  std::vector<uint32_t> q_weight, q_scale;
  std::vector<uint16_t> q_scale_max;
  Exl2Matrix m;
};

// A shape of EXL2 matrix for random_exl2: K, N and its groups (bits, rows).
struct Exl2Case {
  int64_t K, N;
  std::vector<std::pair<int, int64_t>> groups;
};

// Every width alone and in mixes, groups shorter and longer than 32 rows, one past a multiple of
// 32 at the end: the shapes every backend's EXL2 linear is checked on.
inline std::vector<Exl2Case> exl2_width_cases() {
  return {
      {32, 1, {{8, 32}}},
      {64, 33, {{6, 32}, {5, 32}}},
      {128, 70, {{4, 64}, {3, 64}}},
      {96, 40, {{2, 16}, {2, 80}}},
      {256, 96, {{8, 32}, {6, 32}, {5, 64}, {4, 64}, {3, 32}, {2, 32}}},
      {160, 7, {{3, 128}, {3, 32}}},
      {208, 31, {{4, 128}, {2, 80}}},  // last group not a multiple of 32
  };
}

// Groups: (bits, rows) in order; rows must sum to K and rows·bits be a multiple of 32 (as in the
// format: a group fills whole words).
inline OwnedExl2 random_exl2(int64_t K, int64_t N, const std::vector<std::pair<int, int64_t>>& groups, uint32_t seed,
                             bool with_bias = false) {
  std::mt19937 rng(seed);
  OwnedExl2 o;
  const int64_t Np = (N + 31) / 32 * 32;
  int64_t qr = 0, row = 0;
  for (auto [bits, rows] : groups) {
    if (rows * bits % 32 != 0) throw std::invalid_argument("random_exl2: a group must fill whole 32-bit words");
    o.m.groups.push_back({bits, row, rows, qr});
    qr += rows * bits / 32;
    row += rows;
  }
  o.q_weight.assign(size_t(qr * Np), 0);
  for (auto& w : o.q_weight) w = rng();
  o.q_scale.resize(groups.size() * size_t(Np / 8));
  for (auto& w : o.q_scale) w = rng();
  std::uniform_real_distribution<float> u(0.01f, 0.2f);
  for (size_t g = 0; g < groups.size(); ++g) o.q_scale_max.push_back(float_to_half(u(rng)));
  o.m.in_features = K;
  o.m.out_features = N;
  o.m.padded_out = Np;
  o.m.q_rows = qr;
  o.m.q_weight = o.q_weight.data();
  o.m.q_scale = o.q_scale.data();
  o.m.q_scale_max = o.q_scale_max.data();
  o.m.perm.resize(size_t(K));
  std::iota(o.m.perm.begin(), o.m.perm.end(), 0);
  std::shuffle(o.m.perm.begin(), o.m.perm.end(), rng);
  if (with_bias) {
    std::normal_distribution<float> nd;
    for (int64_t n = 0; n < N; ++n) o.m.bias.push_back(nd(rng));
  }
  return o;
}

// W[n][k] (HF orientation, original input order), as double, element by element.
inline std::vector<double> naive_dequant(const Exl2Matrix& m) {
  const int64_t K = m.in_features, N = m.out_features, Np = m.padded_out;
  std::vector<double> w(size_t(N * K));
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const Exl2Group& gr = m.groups[g];
    for (int64_t j = gr.row_start; j < gr.row_start + gr.rows; ++j) {
      for (int64_t n = 0; n < N; ++n) {
        const int64_t bit0 = (j - gr.row_start) * gr.bits;
        uint32_t q = 0;
        for (int b = 0; b < gr.bits; ++b) {
          const int64_t o = bit0 + b;
          const uint32_t word = m.q_weight[(gr.qrow_start + o / 32) * Np + n];
          q |= ((word >> (o % 32)) & 1u) << b;
        }
        const uint32_t s4 = (m.q_scale[g * size_t(Np / 8) + size_t(n / 8)] >> (4 * (n % 8))) & 15u;
        const double scale = double((s4 + 1) * (s4 + 1)) * double(half_to_float(m.q_scale_max[g])) / 256.0;
        w[size_t(n * K + m.perm[size_t(j)])] = (double(q) - double(1 << (gr.bits - 1))) * scale;
      }
    }
  }
  return w;
}

struct OwnedGptq {
  std::vector<uint32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
  GptqMatrix m;
};

inline OwnedGptq random_gptq(int64_t K, int64_t N, int64_t group_size, bool act_order, uint32_t seed) {
  std::mt19937 rng(seed);
  OwnedGptq o;
  const int64_t G = (K + group_size - 1) / group_size;
  o.qweight.resize(size_t(K / 8 * N));
  for (auto& w : o.qweight) w = rng();
  o.qzeros.resize(size_t(G * N / 8));
  for (auto& w : o.qzeros) w = rng() & 0x77777777u;  // zeros 0..7 so v1's +1 stays in range
  std::uniform_real_distribution<float> u(0.005f, 0.05f);
  o.scales.resize(size_t(G * N));
  for (auto& s : o.scales) s = float_to_half(u(rng));
  o.m.in_features = K;
  o.m.out_features = N;
  o.m.num_groups = G;
  o.m.qweight = o.qweight.data();
  o.m.qzeros = o.qzeros.data();
  o.m.scales = o.scales.data();
  o.m.g_idx.resize(size_t(K));
  for (int64_t k = 0; k < K; ++k) o.m.g_idx[size_t(k)] = int32_t(k / group_size);
  if (act_order) std::shuffle(o.m.g_idx.begin(), o.m.g_idx.end(), rng);
  return o;
}

inline std::vector<double> naive_dequant(const GptqMatrix& m) {
  const int64_t K = m.in_features, N = m.out_features;
  std::vector<double> w(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int g = m.g_idx[size_t(k)];
      const uint32_t q = (m.qweight[(k / 8) * N + n] >> (4 * (k % 8))) & 15u;
      const uint32_t z = ((m.qzeros[g * (N / 8) + n / 8] >> (4 * (n % 8))) & 15u) + (m.zeros_v2 ? 0 : 1);
      w[size_t(n * K + k)] = (double(q) - double(z)) * double(half_to_float(m.scales[g * N + n]));
    }
  return w;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// y = x Wᵀ + b in double.
inline std::vector<double> naive_linear(const std::vector<double>& w, const std::vector<float>& bias,
                                        const std::vector<float>& x, int64_t rows, int64_t K, int64_t N) {
  std::vector<double> y(size_t(rows * N));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias.empty() ? 0.0 : bias[size_t(n)];
      for (int64_t k = 0; k < K; ++k) s += w[size_t(n * K + k)] * x[size_t(t * K + k)];
      y[size_t(t * N + n)] = s;
    }
  return y;
}

}  // namespace exl::test
