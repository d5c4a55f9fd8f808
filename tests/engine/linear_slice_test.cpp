// engine/linear_slice.h on a matrix large enough that its columns are gathered by several threads:
// every word and scale nibble of the slice is the source's at the chosen column, padding zero.
// (Slices of real models against their products: tensor_parallel_test.cpp, mlp_order_test.cpp.)
#include "engine/linear_slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace exl {
namespace {

TEST(LinearSlice, LargeColumnSlicesAreTheSourceColumnsAtEveryWord) {
  const int64_t K = 2048, N = 8192, Q = K / 8, G = K / 128;  // 4-bit: 256 word rows, 2M words
  std::mt19937 rng(5);
  std::vector<uint32_t> qw(size_t(Q * N)), qs(size_t(G * N / 8));
  for (uint32_t& w : qw) w = rng();
  for (uint32_t& w : qs) w = rng();
  std::vector<uint16_t> qm(size_t(G), 0x3c00);
  Exl2Matrix m;
  m.in_features = K, m.out_features = N, m.padded_out = N, m.q_rows = Q;
  m.q_weight = qw.data(), m.q_scale = qs.data(), m.q_scale_max = qm.data();
  for (int64_t g = 0; g < G; ++g) m.groups.push_back({4, g * 128, 128, g * 16});
  m.perm.resize(size_t(K));
  std::iota(m.perm.begin(), m.perm.end(), 0);
  // Every column but 17 of them, shuffled: 8,175 columns, padded to 8,192.
  std::vector<int32_t> cols(static_cast<size_t>(N));
  std::iota(cols.begin(), cols.end(), 0);
  std::shuffle(cols.begin(), cols.end(), rng);
  cols.resize(cols.size() - 17);
  const LinearSlice s = slice_linear_columns(m, cols);
  const auto& e = std::get<Exl2Matrix>(s.weights);
  const int64_t n = int64_t(cols.size()), Np = e.padded_out;
  ASSERT_EQ(e.out_features, n);
  ASSERT_EQ(Np, 8192);
  for (int64_t q = 0; q < Q; ++q) {
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(e.q_weight[q * Np + i], qw[size_t(q * N + cols[size_t(i)])]) << "word row " << q << " column " << i;
    for (int64_t i = n; i < Np; ++i) ASSERT_EQ(e.q_weight[q * Np + i], 0u) << "padding column " << i;
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < Np; ++i) {
      const uint32_t got = (e.q_scale[g * Np / 8 + i / 8] >> (4 * (i % 8))) & 15u;
      const uint32_t want = i < n ? (qs[size_t(g * N / 8 + cols[size_t(i)] / 8)] >> (4 * (cols[size_t(i)] % 8))) & 15u : 0u;
      ASSERT_EQ(got, want) << "group " << g << " column " << i;
    }
}

}  // namespace
}  // namespace exl
