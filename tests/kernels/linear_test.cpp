// CPU linear kernels (EXL2 every width and mixes, GPTQ v1/v2 with act-order, dense f16/bf16/f32)
// against element-wise double-precision references, on random inputs and odd sizes.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/ops.h"
#include "random_weights.h"

namespace exl {
namespace linear_test {

double max_rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    err = std::max(err, std::fabs(double(got[i]) - ref[i]));
  }
  return err / scale;
}

TEST(CpuLinear, Exl2AllWidthsAndMixes) {
  ThreadPool tp(2);
  const std::vector<test::Exl2Case> cases = test::exl2_width_cases();
  uint32_t seed = 1;
  for (const auto& c : cases) {
    for (bool bias : {false, true}) {
      auto w = test::random_exl2(c.K, c.N, c.groups, seed++, bias);
      auto ref_w = test::naive_dequant(w.m);
      for (int64_t rows : {1, 3, 37}) {
        auto x = test::random_floats(size_t(rows * c.K), seed++);
        std::vector<float> y(size_t(rows * c.N));
        cpu::linear_exl2(tp, w.m, x.data(), y.data(), rows);
        auto ref = test::naive_linear(ref_w, w.m.bias, x, rows, c.K, c.N);
        EXPECT_LT(max_rel_err(y, ref), 1e-5) << "K=" << c.K << " N=" << c.N << " rows=" << rows;
      }
    }
  }
}

TEST(CpuLinear, GptqV1V2ActOrder) {
  ThreadPool tp(2);
  uint32_t seed = 100;
  for (bool act : {false, true})
    for (bool v2 : {false, true})
      for (auto [K, N, gs] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{64, 8, 32}, {256, 40, 128}, {96, 24, 32}}) {
        auto w = test::random_gptq(K, N, gs, act, seed++);
        w.m.zeros_v2 = v2;
        auto ref_w = test::naive_dequant(w.m);
        for (int64_t rows : {1, 5}) {
          auto x = test::random_floats(size_t(rows * K), seed++);
          std::vector<float> y(size_t(rows * N));
          cpu::linear_gptq(tp, w.m, x.data(), y.data(), rows);
          auto ref = test::naive_linear(ref_w, {}, x, rows, K, N);
          EXPECT_LT(max_rel_err(y, ref), 1e-5) << "K=" << K << " act=" << act << " v2=" << v2;
        }
      }
}

TEST(CpuLinear, DenseAllDtypes) {
  ThreadPool tp(2);
  const int64_t K = 77, N = 45, rows = 9;
  auto wf = test::random_floats(size_t(N * K), 7);
  auto x = test::random_floats(size_t(rows * K), 8);
  auto bias = test::random_floats(size_t(N), 9);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<uint16_t> h(wf.size());
    std::vector<double> ref_w(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) {
      if (dt == DType::f16) h[i] = float_to_half(wf[i]), ref_w[i] = half_to_float(h[i]);
      else if (dt == DType::bf16) h[i] = float_to_bf16(wf[i]), ref_w[i] = bf16_to_float(h[i]);
      else ref_w[i] = wf[i];
    }
    DenseMatrix m{K, N, dt, dt == DType::f32 ? static_cast<const void*>(wf.data()) : h.data(), bias};
    std::vector<float> y(size_t(rows * N));
    cpu::linear_dense(tp, m, x.data(), y.data(), rows);
    EXPECT_LT(max_rel_err(y, test::naive_linear(ref_w, bias, x, rows, K, N)), 1e-5) << to_string(dt);
  }
}

}  // namespace linear_test
}  // namespace exl
