// The EXL2 bit extraction used by the CUDA kernels (kernels/cuda/exl2_decode.h, host-compiled
// here) against the worked packings of exl2-engine.md §1.6 and a bit-by-bit reader. Runs without
// a GPU, in every build.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cuda/exl2_decode.h"

namespace exl {
namespace cuda_decode_test {

uint32_t naive_bits(const std::vector<uint32_t>& words, int64_t bit0, int bits) {
  uint32_t q = 0;
  for (int b = 0; b < bits; ++b) q |= ((words[size_t((bit0 + b) / 32)] >> ((bit0 + b) % 32)) & 1u) << b;
  return q;
}

template <int B>
void check_block(const std::vector<uint32_t>& w, const std::vector<uint32_t>& expected) {
  for (int i = 0; i < 32; ++i) EXPECT_EQ(cuda::exl2_block_value<B>(w.data(), i), expected[size_t(i)]) << B << "-bit row " << i;
}

TEST(CudaExl2Decode, WorkedPackingsFromTheFormatNotes) {
  std::vector<uint32_t> rep4(32), seq32(32), rep8(32);
  for (int i = 0; i < 32; ++i) rep4[size_t(i)] = uint32_t(i % 4), seq32[size_t(i)] = uint32_t(i), rep8[size_t(i)] = uint32_t(i % 8);
  check_block<2>({0xe4e4e4e4u, 0xe4e4e4e4u}, rep4);
  check_block<3>({0x88fac688u, 0xc688fac6u, 0xfac688fau}, rep8);
  check_block<5>({0x8a418820u, 0xc5a92839u, 0xca307b9au, 0x38bdab49u, 0xffbbcdebu}, seq32);
  check_block<6>({0x440c2040u, 0xa2481c61u, 0x3ce34c2cu, 0x544d2450u, 0xa6585d65u, 0x7de75c6du}, seq32);
}

template <int B>
void check_random_block(std::mt19937& rng) {
  std::vector<uint32_t> w(B);
  for (auto& x : w) x = rng();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(cuda::exl2_block_value<B>(w.data(), i), naive_bits(w, int64_t(i) * B, B)) << B;
}

TEST(CudaExl2Decode, BlockValuesMatchBitReaderForEveryWidth) {
  std::mt19937 rng(5);
  for (int rep = 0; rep < 20; ++rep) {
    check_random_block<2>(rng);
    check_random_block<3>(rng);
    check_random_block<4>(rng);
    check_random_block<5>(rng);
    check_random_block<6>(rng);
    check_random_block<8>(rng);
  }
}

TEST(CudaExl2Decode, ValueReadsColumnStreamsAcrossWordRows) {
  std::mt19937 rng(9);
  const int64_t np = 3;  // three columns, word rows np apart
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const int64_t rows = 96, qrow_start = 2, qrows = qrow_start + rows * bits / 32;
    std::vector<uint32_t> qw(size_t(qrows * np));
    for (auto& x : qw) x = rng();
    const cuda::Exl2GroupDesc g{bits, 40, int32_t(rows), int32_t(qrow_start)};
    for (int64_t n = 0; n < np; ++n) {
      std::vector<uint32_t> column;
      for (int64_t r = qrow_start; r < qrows; ++r) column.push_back(qw[size_t(r * np + n)]);
      for (int64_t j = 0; j < rows; ++j)
        ASSERT_EQ(cuda::exl2_value(qw.data(), np, n, g, g.row_start + j), naive_bits(column, j * bits, bits))
            << bits << "-bit column " << n << " row " << j;
    }
  }
}

TEST(CudaExl2Decode, ScaleIsSquaredCodeTimesMaxOver256) {
  const uint32_t words[2] = {0x76543210u, 0xfedcba98u};
  for (int n = 0; n < 16; ++n) {
    const float expect = float((n + 1) * (n + 1)) * (0.5f / 256.0f);
    EXPECT_FLOAT_EQ(cuda::exl2_scale(words, n, 0.5f), expect) << n;
  }
}

}  // namespace cuda_decode_test
}  // namespace exl
