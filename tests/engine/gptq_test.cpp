// GPTQ's parts against independent references: the Hessian against a naive double 2·XᵀX, the
// plan's factor against the definition ((H + λI)·UᵀU = I in act-order), and the quantized layer
// against round-to-nearest on the same layout and permutation, by the error of the layer's output
// on its calibration inputs (what GPTQ minimizes) and through the inference dequantizer.
#include "engine/quantize/gptq.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/quantize/quantize_linear.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/error.h"
#include "gptq_test_support.h"

namespace exl {
namespace gptq_test {

using test::correlated_inputs;

TEST(Gptq, HessianIsTwiceXtXInDouble) {
  const int64_t rows = 300, K = 40;  // more rows than one float chunk
  const auto x = correlated_inputs(rows, K, 1);
  ThreadPool pool(2);
  Hessian h = make_hessian(K);
  accumulate_hessian(h, x.data(), 200, &pool);
  accumulate_hessian(h, x.data() + 200 * K, rows - 200);
  EXPECT_EQ(h.rows, rows);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = i; j < K; ++j) {
      double want = 0;
      for (int64_t t = 0; t < rows; ++t) want += 2.0 * double(x[size_t(t * K + i)]) * double(x[size_t(t * K + j)]);
      ASSERT_NEAR(h.h[size_t(i * K + j)], want, 1e-5 * (std::fabs(want) + 1)) << i << "," << j;
    }
}

TEST(Gptq, PlanIsActOrderAndTheUpperFactorOfTheDampedInverse) {
  const int64_t rows = 256, K = 64;
  auto x = correlated_inputs(rows, K, 2);
  for (int64_t t = 0; t < rows; ++t) x[size_t(t * K + 5)] = 0.0f;  // a dead input feature
  Hessian h = make_hessian(K);
  accumulate_hessian(h, x.data(), rows);
  const GptqPlan p = plan_gptq(h, 0.01, nullptr);
  ASSERT_EQ(p.perm.size(), size_t(K));
  EXPECT_EQ(p.perm.back(), 5);
  EXPECT_TRUE(p.dead[5]);
  EXPECT_FALSE(p.dead[0]);
  for (int64_t j = 1; j + 1 < K; ++j)
    EXPECT_GE(h.h[size_t(p.perm[size_t(j - 1)] * (K + 1))], h.h[size_t(p.perm[size_t(j)] * (K + 1))]);
  double mean = 0;
  for (int64_t i = 0; i < K; ++i) mean += h.h[size_t(i * (K + 1))];
  EXPECT_NEAR(p.damp, 0.01 * mean / double(K), 1e-9 * mean);
  // (H_perm + λI) · (UᵀU) = I, with the dead feature's row and column replaced by 1 on the diagonal.
  auto hp = [&](int64_t i, int64_t j) {
    const int32_t a = p.perm[size_t(i)], b = p.perm[size_t(j)];
    if (p.dead[size_t(a)] || p.dead[size_t(b)]) return (i == j ? 1.0 : 0.0) + (i == j ? p.damp : 0.0);
    return h.h[size_t(std::min(a, b) * K + std::max(a, b))] + (i == j ? p.damp : 0.0);
  };
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) {
      if (j < i) {
        EXPECT_EQ(p.u[size_t(i * K + j)], 0.0f);
      }
      double s = 0;
      for (int64_t m = 0; m < K; ++m) {
        double inv = 0;  // (UᵀU)[m, j]
        for (int64_t r = 0; r <= std::min(m, j); ++r) inv += double(p.u[size_t(r * K + m)]) * p.u[size_t(r * K + j)];
        s += hp(i, m) * inv;
      }
      ASSERT_NEAR(s, i == j ? 1.0 : 0.0, 2e-3) << i << "," << j;
    }
}

TEST(Gptq, BeatsRoundToNearestOnTheOutputAndDequantizesAsInference) {
  const int64_t rows = 512, K = 128, N = 96;
  const auto x = correlated_inputs(rows, K, 3);
  const auto w = test::normal_weights(N, K, 4);
  ThreadPool pool(2);
  Hessian h = make_hessian(K);
  accumulate_hessian(h, x.data(), rows, &pool);
  const GptqPlan plan = plan_gptq(h, 0.01, &pool);
  for (int bits : {2, 3, 4, 6}) {
    const std::vector<std::pair<int, int64_t>> groups = {{bits, 64}, {bits, 64}};
    const Exl2Tensors g = gptq_quantize(w, N, K, plan, groups, &pool);
    const Exl2Tensors r = quantize_exl2(w, N, K, plan.perm, groups);
    EXPECT_EQ(g.perm, plan.perm);
    EXPECT_EQ(g.q_invperm(), r.q_invperm());
    const double eg = test::gptq_output_error(g, w, x, rows), er = test::gptq_output_error(r, w, x, rows);
    EXPECT_LT(eg, 0.8 * er) << bits << " bits: GPTQ " << eg << " vs RTN " << er;
  }
  // Same plan, same layout: the same tensors (deterministic, independent of the thread pool).
  const std::vector<std::pair<int, int64_t>> mixed = {{6, 32}, {4, 32}, {3, 64}};
  const Exl2Tensors a = gptq_quantize(w, N, K, plan, mixed, &pool), b = gptq_quantize(w, N, K, plan, mixed);
  EXPECT_EQ(a.q_weight, b.q_weight);
  EXPECT_EQ(a.q_scale, b.q_scale);
  EXPECT_EQ(a.q_scale_max, b.q_scale_max);
}

TEST(Gptq, EmptyOrMismatchedInputsAreErrors) {
  Hessian h = make_hessian(32);
  EXPECT_THAT([&] { plan_gptq(h, 0.01); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr("no calibration rows")));
  EXPECT_THROW(make_hessian(0), Error);
  std::vector<float> x(size_t(32 * 4), 1.0f);
  accumulate_hessian(h, x.data(), 4);
  const GptqPlan p = plan_gptq(h, 0.01);
  const std::vector<float> w(size_t(16 * 64), 0.5f);
  const std::pair<int, int64_t> g[] = {{4, 64}};
  EXPECT_THROW(gptq_quantize(w, 16, 64, p, g), Error);
}

}  // namespace gptq_test
}  // namespace exl
