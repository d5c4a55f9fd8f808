// The device GPTQ (kernels/gptq_device.h, reached through engine/quantize/gptq_runner.h) against
// the CPU reference (gptq.h) on random correlated inputs. The device tests skip without a CUDA
// device; they also run on the CPU in tests/cuda_emu (`make -C tests/cuda_emu gptq`), which
// emulates the kernels and, naively, the cuBLAS calls.
//
// Tolerances: the device Hessian sums 2048-row chunks in fp32 (the reference 128-row chunks), both
// then in double, so diag(H) agrees to ~1e-6 relative and the act-order is the same unless two
// features' diagonals tie that closely (not in these inputs); U, computed from it in double and
// rounded to fp32 as the reference does, agrees to the Hessian's error times the damped matrix's
// condition number (≤ ~10³ here): 1e-3 relative. GPTQ codes: the first group's arithmetic is the
// reference's operation for operation; later groups see rows updated by a cuBLAS SGEMM whose
// summation order differs from the reference's loop, so a code within fp32 rounding of a rounding
// boundary can flip, and its error feedback moves the later rows by a fraction of one step:
// ≥ 99% of codes equal (the CUDA emulator, whose SGEMM sums in double, gets all 64,000), the
// layer's output error within 5% of the reference's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/quantize/gptq.h"
#include "engine/quantize/gptq_runner.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda_device.h"
#include "kernels/gptq_device.h"
#include "gptq_test_support.h"

namespace exl {
namespace gptq_device_test {

#define EXL_GPTQ_REQUIRE_CUDA() \
  if (exl::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << exl::cuda_device_description()

// Code of row j (within group g), column n: the inverse of exl2_writer's set_code.
uint32_t code_at(const Exl2Tensors& t, size_t g, int64_t j, int64_t n) {
  const Exl2Group& gr = t.groups[g];
  const int64_t bit = j * gr.bits;
  const int shift = int(bit % 32);
  uint64_t v = t.q_weight[size_t((gr.qrow_start + bit / 32) * t.padded_out + n)];
  if (shift + gr.bits > 32) v |= uint64_t(t.q_weight[size_t((gr.qrow_start + bit / 32 + 1) * t.padded_out + n)]) << 32;
  return uint32_t(v >> shift) & ((1u << gr.bits) - 1u);
}

// The runner without a device is exactly the CPU reference (no GPU needed).
TEST(GptqRunner, WithoutADeviceIsTheCpuReference) {
  const int64_t rows = 300, K = 64, N = 40;
  const auto x = test::correlated_inputs(rows, K, 11, 3);
  const auto w = test::normal_weights(N, K, 12);
  ThreadPool pool(2);
  Hessian h = make_hessian(K);
  accumulate_hessian(h, x.data(), rows, &pool);
  const GptqPlan plan = plan_gptq(h, 0.01, &pool);
  const std::vector<std::pair<int, int64_t>> groups = {{5, 32}, {3, 32}};
  const Exl2Tensors want = gptq_quantize(w, N, K, plan, groups, &pool);

  const GptqRunner runner(pool, nullptr);
  EXPECT_FALSE(runner.on_device());
  const auto p = runner.plan(x, K, 0.01);
  const auto held = runner.weight(w, N, K);
  const Exl2Tensors got = runner.quantize(*held, *p, groups);
  EXPECT_EQ(std::vector<int32_t>(runner.perm(*p).begin(), runner.perm(*p).end()), plan.perm);
  EXPECT_EQ(got.perm, want.perm);
  EXPECT_EQ(got.q_weight, want.q_weight);
  EXPECT_EQ(got.q_scale, want.q_scale);
  EXPECT_EQ(got.q_scale_max, want.q_scale_max);
}

TEST(GptqDevice, HessianAndFactorMatchTheCpuReference) {
  EXL_GPTQ_REQUIRE_CUDA();
  const int64_t rows = 4100, K = 320;  // two full device chunks and a partial one
  const auto x = test::correlated_inputs(rows, K, 21, 7);
  ThreadPool pool(2);
  Hessian h = make_hessian(K);
  accumulate_hessian(h, x.data(), rows, &pool);
  const GptqPlan want = plan_gptq(h, 0.01, &pool);

  auto dev = make_cuda_gptq_device(0);
  auto dh = dev->make_hessian(K);
  dev->accumulate(*dh, x.data(), 1000);
  dev->accumulate(*dh, x.data() + 1000 * K, rows - 1000);
  EXPECT_EQ(dh->rows, rows);
  const std::vector<double> diag = dev->diag(*dh);
  ASSERT_EQ(diag.size(), size_t(K));
  for (int64_t i = 0; i < K; ++i)
    EXPECT_NEAR(diag[size_t(i)], h.h[size_t(i * K + i)], 1e-5 * h.h[size_t(i * K + i)] + 1e-9) << i;
  const GptqOrder order = gptq_order(diag, 0.01);
  EXPECT_EQ(order.perm, want.perm);
  EXPECT_EQ(order.dead, want.dead);
  EXPECT_TRUE(order.dead[7]);
  const auto f = dev->factor(*dh, order.perm, order.dead, order.damp);
  ASSERT_TRUE(f);
  const std::vector<float> u = dev->factor_u(*f);
  ASSERT_EQ(u.size(), want.u.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    diff += double(u[i] - want.u[i]) * double(u[i] - want.u[i]);
    norm += double(want.u[i]) * want.u[i];
    if (i % size_t(K) < i / size_t(K)) {
      ASSERT_EQ(u[i], 0.0f) << "below the diagonal at " << i;
    }
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-3);
}

TEST(GptqDevice, CodesAndOutputErrorMatchTheCpuReference) {
  EXL_GPTQ_REQUIRE_CUDA();
  const int64_t rows = 1200, K = 320, N = 200;  // N pads to 224: padding columns hold the zero point
  const auto x = test::correlated_inputs(rows, K, 31, 100);
  const auto w = test::normal_weights(N, K, 32);
  ThreadPool pool(2);
  const GptqRunner cpu(pool, nullptr);
  auto dev = make_cuda_gptq_device(0);
  const GptqRunner gpu(pool, dev.get());
  EXPECT_TRUE(gpu.on_device());
  const std::vector<std::pair<int, int64_t>> groups = {{8, 32}, {6, 64}, {4, 64}, {4, 64}, {3, 64}, {2, 32}};
  const auto pc = cpu.plan(x, K, 0.01), pg = gpu.plan(x, K, 0.01);
  ASSERT_TRUE(std::ranges::equal(cpu.perm(*pc), gpu.perm(*pg)));
  const Exl2Tensors a = cpu.quantize(*cpu.weight(w, N, K), *pc, groups);
  const Exl2Tensors b = gpu.quantize(*gpu.weight(w, N, K), *pg, groups);
  ASSERT_EQ(b.q_weight.size(), a.q_weight.size());
  ASSERT_EQ(b.q_scale.size(), a.q_scale.size());
  ASSERT_EQ(b.padded_out, 224);
  int64_t same = 0, total = 0;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    for (int64_t j = 0; j < a.groups[g].rows; ++j) {
      for (int64_t n = 0; n < N; ++n) same += code_at(a, g, j, n) == code_at(b, g, j, n), ++total;
      for (int64_t n = N; n < b.padded_out; ++n)
        ASSERT_EQ(code_at(b, g, j, n), 1u << (a.groups[g].bits - 1)) << "padding column " << n;
    }
  }
  EXPECT_GE(double(same), 0.99 * double(total)) << same << " of " << total << " codes equal";
  EXPECT_EQ(a.q_scale_max[0], b.q_scale_max[0]);  // the first group sees identical rows
  for (int64_t n = 0; n < N; ++n) {
    const uint32_t ca = (a.q_scale[size_t(n / 8)] >> (4 * (n % 8))) & 15u, cb = (b.q_scale[size_t(n / 8)] >> (4 * (n % 8))) & 15u;
    ASSERT_EQ(ca, cb) << "first group's scale code of column " << n;
  }
  const double ea = test::gptq_output_error(a, w, x, rows), eb = test::gptq_output_error(b, w, x, rows);
  EXPECT_NEAR(eb / ea, 1.0, 0.05) << "output error CPU " << ea << ", device " << eb;
}

}  // namespace gptq_device_test
}  // namespace exl
