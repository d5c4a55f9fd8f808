// The CPU dequantizers against the bit-layout facts of exl2-engine.md §1.6 and the worked example
// of §2, on hand-built matrices (no files involved).
#include "kernels/cpu/dequantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/error.h"
#include "kernels/half.h"

namespace exl {
namespace dequantize_test {

// A single-group EXL2 matrix of K = 32 rows × N = 32 columns whose every column holds `block`,
// with identity permutation, scale code 15 and q_scale_max 1, so W[n, j] = q[j] − 2^(bits−1).
struct OneBlock {
  std::vector<uint32_t> q_weight, q_scale;
  uint16_t smax = float_to_half(1.0f);
  Exl2Matrix m;

  OneBlock(int bits, const std::vector<uint32_t>& block) {
    for (uint32_t w : block) q_weight.insert(q_weight.end(), 32, w);
    q_scale.assign(4, 0xffffffffu);
    m.in_features = m.out_features = m.padded_out = 32;
    m.q_rows = int64_t(block.size());
    m.q_weight = q_weight.data();
    m.q_scale = q_scale.data();
    m.q_scale_max = &smax;
    m.groups = {{bits, 0, 32, 0}};
    m.perm.resize(32);
    std::iota(m.perm.begin(), m.perm.end(), 0);
  }
};

void expect_rows(const OneBlock& b, int bits, auto q_of_row) {
  std::vector<float> w(32 * 32);
  dequantize(b.m, w);
  for (int n = 0; n < 32; ++n)
    for (int j = 0; j < 32; ++j)
      ASSERT_EQ(w[n * 32 + j], float(q_of_row(j) - (1 << (bits - 1)))) << bits << "-bit, column " << n << " row " << j;
}

TEST(Dequantize, Exl2BitLayoutMatchesSpecVectors) {
  expect_rows(OneBlock(2, {0xe4e4e4e4, 0xe4e4e4e4}), 2, [](int j) { return j % 4; });
  expect_rows(OneBlock(3, {0x88fac688, 0xc688fac6, 0xfac688fa}), 3, [](int j) { return j % 8; });
  expect_rows(OneBlock(5, {0x8a418820, 0xc5a92839, 0xca307b9a, 0x38bdab49, 0xffbbcdeb}), 5, [](int j) { return j; });
  expect_rows(OneBlock(6, {0x440c2040, 0xa2481c61, 0x3ce34c2c, 0x544d2450, 0xa6585d65, 0x7de75c6d}), 6,
              [](int j) { return j; });
}

TEST(Dequantize, Exl2FourAndEightBitNibbleOrder) {
  std::vector<uint32_t> four, eight;
  for (int w = 0; w < 4; ++w) {
    uint32_t x = 0;
    for (int i = 0; i < 8; ++i) x |= uint32_t((w * 8 + i) % 16) << (4 * i);
    four.push_back(x);
  }
  for (int w = 0; w < 8; ++w) {
    uint32_t x = 0;
    for (int i = 0; i < 4; ++i) x |= uint32_t(w * 4 + i + 100) << (8 * i);
    eight.push_back(x);
  }
  expect_rows(OneBlock(4, four), 4, [](int j) { return j % 16; });
  expect_rows(OneBlock(8, eight), 8, [](int j) { return j + 100; });
}

// §2: 4-bit group 0, column 5, q_weight[0, 5] = 0x87654321, scale code 9, q_scale_max fp16(0.0123).
// The spec's values were computed in fp16; ours use a float scale, so allow 2e-3 relative.
TEST(Dequantize, Exl2WorkedExampleFromSpec) {
  const int64_t k = 128, np = 32;
  std::vector<uint32_t> q_weight(14 * np, 0x88888888u), q_scale(2 * np / 8, 0);
  q_weight[0 * np + 5] = 0x87654321u;
  q_scale[0] = 9u << (4 * 5);
  std::vector<uint16_t> smax = {float_to_half(0.0123f), float_to_half(0.0123f)};
  Exl2Matrix m;
  m.in_features = k;
  m.out_features = m.padded_out = np;
  m.q_rows = 14;
  m.q_weight = q_weight.data();
  m.q_scale = q_scale.data();
  m.q_scale_max = smax.data();
  m.groups = {{4, 0, 64, 0}, {3, 64, 64, 8}};
  m.perm.resize(k);
  std::iota(m.perm.rbegin(), m.perm.rend(), 0);  // permuted row j is input feature 127 − j
  std::vector<float> w(np * k);
  dequantize(m, w);
  const double expect[8] = {-0.03363, -0.02881, -0.02402, -0.01921, -0.01440, -0.00961, -0.00480, 0.0};
  for (int j = 0; j < 8; ++j) EXPECT_NEAR(w[5 * k + (127 - j)], expect[j], 2e-3 * std::abs(expect[j]) + 1e-6) << j;
  EXPECT_NEAR(exl2_scale(m, 0, 5), 0.0048027, 0.0048027 * 2e-3);
}

TEST(Dequantize, Exl2PaddedOutputIncludesPaddingRows) {
  OneBlock b(4, {0x88888888u, 0x88888888u, 0x88888888u, 0x88888888u});
  b.m.out_features = 20;  // Np stays 32
  std::vector<float> unpadded(20 * 32, -1.0f), padded(32 * 32, -1.0f);
  dequantize(b.m, unpadded);
  dequantize(b.m, padded);
  for (float v : unpadded) EXPECT_EQ(v, 0.0f);
  for (float v : padded) EXPECT_EQ(v, 0.0f);
  std::vector<float> wrong(21 * 32);
  EXPECT_THROW(dequantize(b.m, wrong), Error);
}

TEST(Dequantize, DenseConvertsEveryDtype) {
  const std::vector<float> ref = {1.5f, -2.25f, 0.0f, 65504.0f, -0.000061035156f, 3.0f};
  std::vector<uint16_t> h, bf;
  for (float v : ref) h.push_back(float_to_half(v)), bf.push_back(float_to_bf16(v));
  DenseMatrix m;
  m.in_features = 3;
  m.out_features = 2;
  std::vector<float> out(6);
  m.dtype = DType::f16;
  m.data = h.data();
  dequantize(m, out);
  EXPECT_EQ(out, ref);
  m.dtype = DType::bf16;
  m.data = bf.data();
  dequantize(m, out);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(out[i], ref[i], std::abs(ref[i]) / 128) << i;
  m.dtype = DType::f32;
  m.data = ref.data();
  dequantize(m, out);
  EXPECT_EQ(out, ref);
}

}  // namespace dequantize_test
}  // namespace exl
