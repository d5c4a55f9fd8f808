#include "kernels/cpu/kv_quant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/half.h"

namespace exl {
namespace {

using ::testing::ElementsAre;

// Random non-zero values with magnitudes spread over 1e-3 .. 1e2 and the occasional outlier.
std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mag(-3.0f, 2.0f);
  std::bernoulli_distribution neg(0.5), outlier(0.02);
  std::vector<float> x(n);
  for (float& v : x) {
    v = std::pow(10.0f, mag(gen)) * (neg(gen) ? -1.0f : 1.0f);
    if (outlier(gen)) v *= 50.0f;
  }
  return x;
}

struct RoundTrip {
  std::vector<uint8_t> data;
  std::vector<uint16_t> scales;
  std::vector<float> out;
};

RoundTrip round_trip(KvFormat f, const std::vector<float>& x, int n_rows, int head_dim) {
  RoundTrip r;
  r.data.assign(kv_row_data_bytes(f, head_dim) * size_t(n_rows), 0xAA);
  r.scales.assign(size_t(kv_row_scales(f, head_dim)) * size_t(n_rows) + 1, 0xBEEF);
  r.out.assign(x.size(), NAN);
  quantize_kv_rows(f, x.data(), n_rows, head_dim, r.data.data(), r.scales.data());
  dequantize_kv_rows(f, r.data.data(), r.scales.data(), n_rows, head_dim, r.out.data());
  return r;
}

TEST(KvQuant, Fp16RoundTripIsWithinHalfAnUlp) {
  for (int head_dim : {8, 64, 80, 128}) {
    const int rows = 9;
    auto x = random_values(size_t(rows * head_dim), uint32_t(head_dim));
    auto r = round_trip(KvFormat::fp16, x, rows, head_dim);
    for (size_t i = 0; i < x.size(); ++i)  // 11-bit significand: relative error <= 2^-11
      ASSERT_LE(std::fabs(r.out[i] - x[i]), std::fabs(x[i]) * 0x1p-11f) << head_dim << " " << i;
  }
}

void check_block_quantized(KvFormat f, float qmax) {
  for (int head_dim : {7, 8, 32, 64, 80, 96, 128}) {
    const int rows = 11;
    auto x = random_values(size_t(rows * head_dim), uint32_t(head_dim) * 7 + uint32_t(qmax));
    auto r = round_trip(f, x, rows, head_dim);
    const int groups = kv_row_scales(f, head_dim);
    ASSERT_EQ(groups, (head_dim + 31) / 32);
    EXPECT_EQ(r.scales.back(), 0xBEEF) << "wrote past the scales";
    for (int row = 0; row < rows; ++row) {
      for (int g = 0; g < groups; ++g) {
        const int begin = g * 32, end = std::min(head_dim, begin + 32);
        float amax = 0;
        for (int e = begin; e < end; ++e) amax = std::max(amax, std::fabs(x[size_t(row * head_dim + e)]));
        const float s = half_to_float(r.scales[size_t(row * groups + g)]);
        // The smallest half >= amax / qmax: at most one half ulp above it (2^-10 relative for
        // normal halves, 2^-24 absolute for subnormal ones).
        ASSERT_GE(s, amax / qmax);
        ASSERT_LE(s, std::max(amax / qmax * (1.0f + 0x1p-10f), amax / qmax + 0x1p-24f));
        for (int e = begin; e < end; ++e) {
          const size_t i = size_t(row * head_dim + e);
          ASSERT_LE(std::fabs(r.out[i] - x[i]), s * 0.5f * (1.0f + 1e-6f))
              << to_string(f) << " head_dim " << head_dim << " row " << row << " elem " << e;
        }
      }
    }
  }
}

TEST(KvQuant, Q8ErrorIsAtMostHalfTheGroupScale) { check_block_quantized(KvFormat::q8, 127.0f); }
TEST(KvQuant, Q4ErrorIsAtMostHalfTheGroupScale) { check_block_quantized(KvFormat::q4, 7.0f); }

TEST(KvQuant, EncodingMatchesTheDocumentedBits) {
  const float x[4] = {127.0f, -127.0f, 1.0f, 0.0f};
  uint8_t q8[4];
  uint16_t s;
  quantize_kv_block(KvFormat::q8, x, 4, q8, &s);
  EXPECT_EQ(s, 0x3c00);  // 1.0
  EXPECT_THAT(q8, ElementsAre(0x7f, 0x81, 0x01, 0x00));

  const float y[5] = {7.0f, -7.0f, 1.0f, 0.0f, -3.0f};
  uint8_t q4[3] = {0xff, 0xff, 0xff};
  quantize_kv_block(KvFormat::q4, y, 5, q4, &s);
  EXPECT_EQ(s, 0x3c00);
  // nibble = q + 8, element 2i in the low nibble: (15, 1), (9, 8), (5, unused = 0).
  EXPECT_THAT(q4, ElementsAre(0x1f, 0x89, 0x05));
  float back[5];
  dequantize_kv_block(KvFormat::q4, q4, s, 5, back);
  EXPECT_THAT(back, ElementsAre(7.0f, -7.0f, 1.0f, 0.0f, -3.0f));

  const float z[3] = {1.0f, -2.0f, 65504.0f};
  uint8_t h[6];
  quantize_kv_block(KvFormat::fp16, z, 3, h, &s);
  EXPECT_THAT(h, ElementsAre(0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b));
}

TEST(KvQuant, Fp16DecodeIsBitExactForEveryHalf) {
  std::vector<uint8_t> bytes(65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) {
    bytes[2 * h] = uint8_t(h & 0xff);
    bytes[2 * h + 1] = uint8_t(h >> 8);
  }
  std::vector<float> out(65536);
  dequantize_kv_block(KvFormat::fp16, bytes.data(), 0, 65536, out.data());
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(float_to_bits(out[h]), float_to_bits(half_to_float(uint16_t(h)))) << std::hex << h;
}

TEST(KvQuant, ZeroGroupsHaveZeroScaleAndDecodeToZero) {
  for (KvFormat f : {KvFormat::q8, KvFormat::q4}) {
    std::vector<float> x(64, 0.0f);
    x[40] = 0.5f;  // only the second group is non-zero
    auto r = round_trip(f, x, 1, 64);
    EXPECT_EQ(r.scales[0], 0);
    EXPECT_NE(r.scales[1], 0);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(r.out[size_t(i)], 0.0f);
    EXPECT_NEAR(r.out[40], 0.5f, 1e-3f);
  }
}

TEST(KvQuant, TinyValuesGetTheSmallestSubnormalScale) {
  // amax / 127 underflows fp16; the scale is bumped up to 2^-24 instead of becoming 0.
  const float x[2] = {1e-9f, -2e-9f};
  uint8_t q[2];
  uint16_t s;
  quantize_kv_block(KvFormat::q8, x, 2, q, &s);
  EXPECT_EQ(s, 1);
  EXPECT_THAT(q, ElementsAre(0, 0));
}

TEST(KvPageLayout, PlanesAreDisjointAlignedAndCoverThePage) {
  for (KvFormat f : {KvFormat::fp16, KvFormat::q8, KvFormat::q4}) {
    KvPageLayout l{.n_layers = 3, .n_kv_heads = 2, .head_dim = 40, .page_size = 5, .format = f};
    EXPECT_EQ(l.scales_offset() % 16, 0u);
    EXPECT_EQ(l.plane_bytes() % 16, 0u);
    EXPECT_GE(l.scales_offset(), size_t(5) * l.row_bytes());
    EXPECT_GE(l.plane_bytes() - l.scales_offset(), size_t(5 * l.row_scales() * 2));
    EXPECT_EQ(l.plane_offset(2, 1, 1) + l.plane_bytes(), l.page_bytes());
    EXPECT_EQ(l.plane_offset(0, 1, 0), 2 * l.plane_bytes());
    EXPECT_EQ(l.plane_offset(1, 0, 0), 4 * l.plane_bytes());
  }
  EXPECT_EQ(kv_format_from_string("q4"), KvFormat::q4);
  EXPECT_EQ(kv_format_from_string("q6"), std::nullopt);
  EXPECT_EQ(to_string(KvFormat::q8), "q8");
}

}  // namespace
}  // namespace exl
