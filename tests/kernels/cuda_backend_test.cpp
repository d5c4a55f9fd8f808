// The CUDA backend against the CPU backend (kernels/cpu/ops.h) on random inputs: every op, odd and
// even sizes, every EXL2 width and mixes, GPTQ, dense dtypes, KV writes byte for byte, and paged
// attention over scattered page tables in every cache format. Tests that need a GPU skip with a
// message when none is present; the host-side planning tests run everywhere CUDA is compiled.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "kernels/error.h"
#include "kernels/int_math.h"
#include "random_weights.h"
#include "test_support.h"

#ifdef EXL_HAVE_CUDA
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_prefill_attention.h"
#include "kernels/cuda/cuda_linear.h"
#include "kernels/cuda/exl2_gemm.h"
#include "kernels/cuda/flash_attention.h"
#endif

namespace exl {
namespace cuda_backend_test {

// Tolerances (max abs error / max abs reference): fp32-accumulating kernels vs fp16-input GEMMs.
constexpr double k_tol_f32 = 1e-3;
constexpr double k_tol_f16 = 1e-2;
#ifdef EXL_HAVE_CUDA
constexpr int64_t cuda_exl2_exact_gemv_rows = cuda::k_exl2_exact_gemv_max_rows;
constexpr int64_t cuda_exl2_mma_min_rows = cuda::k_exl2_mma_min_rows;
constexpr int cuda_attn_decode_max_positions = cuda::k_attn_decode_max_positions;
#else
constexpr int64_t cuda_exl2_exact_gemv_rows = 32;  // unused: the GPU tests skip
constexpr int64_t cuda_exl2_mma_min_rows = 3;
constexpr int cuda_attn_decode_max_positions = 16;
#endif
// EXL2 linears outside the exact path: the gemv (fp32 accumulation of exact weights) below
// k_exl2_mma_min_rows rows, fp16 weights and activations on tensor cores (or cuBLAS) from there.
double exl2_tol(int64_t rows) { return rows < cuda_exl2_mma_min_rows ? k_tol_f32 : k_tol_f16; }

// The largest Σ_k |w_nk·x_tk| + |b_n| over the outputs: the magnitude of a product's terms.
double sum_magnitude(const std::vector<double>& w_abs, const std::vector<float>& bias_abs, const std::vector<float>& x,
                     int64_t rows, int64_t K, int64_t N) {
  std::vector<float> x_abs(x);
  for (float& v : x_abs) v = std::fabs(v);
  double m = 0;
  for (double v : test::naive_linear(w_abs, bias_abs, x_abs, rows, K, N)) m = std::max(m, v);
  return m;
}

// rel_err, except that an error within one fp16 rounding (2^-11) of the terms' magnitude
// (sum_magnitude) counts as none: the 2/4/8-bit paths keep fp16 partial sums, so outputs that
// cancel (one column, one row: K=32 N=1, |y| = 1.95 from terms summing to 148 in magnitude) are
// not held to a relative tolerance their own terms make impossible.
double rel_err_of_sums(const std::vector<float>& got, const std::vector<float>& ref, double magnitude) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    scale = std::max(scale, std::fabs(double(ref[i])));
    err = std::max(err, std::fabs(double(got[i]) - double(ref[i])));
  }
  if (err <= magnitude * 0x1p-11) return 0;
  return scale > 0 ? err / scale : err;
}

using test::rel_err;

class CudaBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cuda_device_count() > 0) gpu_ = make_cuda_backend(0);
  }
  static void TearDownTestSuite() { gpu_.reset(); }
  void SetUp() override {
    if (!gpu_) GTEST_SKIP() << "needs a CUDA GPU; " << cuda_device_description();
  }

  // The backend under test: the suite's, or one a test made with other settings (backend_with).
  Backend& gpu() { return active_ ? *active_ : *gpu_; }
  // A CUDA backend made while each environment variable named is set to its value (the backends
  // read their settings when made); the variables are restored after.
  using EnvList = std::vector<std::pair<const char*, const char*>>;
  static std::unique_ptr<Backend> backend_with(const EnvList& env) {
    std::vector<std::pair<const char*, std::optional<std::string>>> saved;
    for (const auto& [name, value] : env) {
      const char* before = std::getenv(name);
      saved.emplace_back(name, before ? std::optional<std::string>(before) : std::nullopt);
      ::setenv(name, value, 1);
    }
    auto b = make_cuda_backend(0);
    for (const auto& [name, before] : saved) {
      if (before) ::setenv(name, before->c_str(), 1);
      else ::unsetenv(name);
    }
    return b;
  }
  Buffer to_gpu(const std::vector<float>& v) {
    Buffer b = gpu().alloc(v.size() * 4);
    gpu().upload(b.data(), v.data(), v.size() * 4);
    return b;
  }
  std::vector<float> from_gpu(const Buffer& b, size_t n) {
    std::vector<float> v(n);
    gpu().download(v.data(), b.data(), n * 4);
    return v;
  }
  // The set of `ms` (one input, several outputs: Backend::linears) on backend b over `rows` random
  // rows of x (seed), each job against the CPU at tensor-core precision.
  void expect_set_matches_cpu(Backend& b, std::initializer_list<const test::OwnedExl2*> ms, int64_t rows,
                              uint32_t seed) {
    const int64_t K = in_features((*ms.begin())->m);
    std::vector<std::unique_ptr<PreparedLinear>> ps;
    std::vector<const PreparedLinear*> ws;
    std::vector<Buffer> dys;
    std::vector<float*> outs;
    for (const auto* w : ms) {
      ps.push_back(b.prepare_linear(w->m));
      ws.push_back(ps.back().get());
      dys.push_back(b.alloc(size_t(rows * out_features(w->m)) * 4));
      outs.push_back(dys.back().f32());
    }
    const auto x = test::random_floats(size_t(rows * K), seed);
    Buffer dx = b.alloc(x.size() * 4);
    b.upload(dx.data(), x.data(), x.size() * 4);
    b.linears(ws, dx.f32(), outs, rows);
    int j = 0;
    for (const auto* w : ms) {
      std::vector<float> got(size_t(rows * out_features(w->m))), ref(got.size());
      b.download(got.data(), dys[size_t(j)].data(), got.size() * 4);
      cpu::linear_exl2(tp_, w->m, x.data(), ref.data(), rows);
      EXPECT_LT(rel_err(got, ref), exl2_tol(rows)) << "job " << j;
      ++j;
    }
  }
  // y = x · Wᵀ on the GPU for `rows` rows of x, stored `x_offset` floats into its buffer.
  std::vector<float> gpu_linear(const LinearWeights& w, const std::vector<float>& x, int64_t rows,
                                size_t x_offset = 0) {
    auto p = gpu().prepare_linear(w);
    EXPECT_EQ(p->in_features, in_features(w));
    EXPECT_EQ(p->out_features, out_features(w));
    Buffer dx = gpu().alloc((x.size() + x_offset) * 4);
    gpu().upload(dx.f32() + x_offset, x.data(), x.size() * 4);
    Buffer dy = gpu().alloc(size_t(rows * out_features(w)) * 4);
    gpu().linear(*p, dx.f32() + x_offset, dy.f32(), rows);
    return from_gpu(dy, size_t(rows * out_features(w)));
  }

  static std::unique_ptr<Backend> gpu_;
  Backend* active_ = nullptr;
  ThreadPool tp_{2};
};
std::unique_ptr<Backend> CudaBackendTest::gpu_;

TEST(CudaBackendFactory, ThrowsClearlyWithoutDevice) {
  if (cuda_device_count() > 0) {
    EXPECT_THROW(make_cuda_backend(cuda_device_count()), Error);
    return;
  }
  try {
    make_cuda_backend(0);
    FAIL() << "make_cuda_backend succeeded without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernels: cuda"), std::string::npos) << e.what();
  }
}

// ---- linear -------------------------------------------------------------------------------------

using test::Exl2Case;

TEST_F(CudaBackendTest, LinearExl2EveryWidthAndMix) {
  std::vector<Exl2Case> cases = test::exl2_width_cases();
  cases.insert(cases.end(), {
      {512, 130, {{6, 256}, {4, 256}}},  // groups spanning gemv K-slices
      {1024, 517, {{8, 64}, {6, 128}, {5, 128}, {4, 320}, {3, 256}, {2, 128}}},
      {2048, 64, {{4, 2048}}},
  });
  uint32_t seed = 1;
  for (const auto& c : cases)
    for (bool bias : {false, true}) {
      auto w = test::random_exl2(c.K, c.N, c.groups, seed++, bias);
      std::vector<double> w_abs = test::naive_dequant(w.m);
      for (double& v : w_abs) v = std::fabs(v);
      std::vector<float> bias_abs = w.m.bias;
      for (float& v : bias_abs) v = std::fabs(v);
      for (int64_t rows : {1, 2, 3, 8, 13, 40, 64, 65, 100, 200}) {
        auto x = test::random_floats(size_t(rows * c.K), seed++);
        std::vector<float> ref(size_t(rows * c.N));
        cpu::linear_exl2(tp_, w.m, x.data(), ref.data(), rows);
        const double magnitude = sum_magnitude(w_abs, bias_abs, x, rows, c.K, c.N);
        const double tol = exl2_tol(rows);
        EXPECT_LT(rel_err_of_sums(gpu_linear(w.m, x, rows), ref, magnitude), tol)
            << "K=" << c.K << " N=" << c.N << " rows=" << rows << " bias=" << bias;
      }
    }
}

TEST_F(CudaBackendTest, LinearsSharingInputMatchCpu) {
  // q/k/v-like sets of equal K (one launch), a mixed set (GPTQ and a different K run on their
  // own) and rows on both sides of the gemv limit.
  auto cpu = make_cpu_backend(2);
  uint32_t seed = 700;
  for (auto [K, widths] : std::vector<std::pair<int64_t, std::vector<int64_t>>>{
           {96, {160, 33, 33}}, {512, {130, 64}}, {1024, {517, 128, 256}}, {256, {7, 96, 40}}}) {
    std::vector<test::OwnedExl2> ms;
    for (int64_t N : widths)
      ms.push_back(K == 96 ? test::random_exl2(K, N, {{6, 32}, {3, 64}}, seed++, N == 33)
                           : test::random_exl2(K, N, {{4, K / 2}, {5, K / 4}, {8, K / 4}}, seed++, N == 64));
    for (int64_t rows : {1, 3, 8, 20, 50}) {
      auto x = test::random_floats(size_t(rows * K), seed++);
      std::vector<std::unique_ptr<PreparedLinear>> pg;
      std::vector<const PreparedLinear*> wg;
      std::vector<Buffer> yb;
      std::vector<float*> yg;
      for (const auto& m : ms) {
        pg.push_back(gpu().prepare_linear(m.m));
        wg.push_back(pg.back().get());
        yb.push_back(gpu().alloc(size_t(rows * m.m.out_features) * 4));
        yg.push_back(yb.back().f32());
      }
      Buffer dx = to_gpu(x);
      gpu().linears(wg, dx.f32(), yg, rows);
      for (size_t i = 0; i < ms.size(); ++i) {
        std::vector<float> ref(size_t(rows * ms[i].m.out_features));
        cpu::linear_exl2(tp_, ms[i].m, x.data(), ref.data(), rows);
        EXPECT_LT(rel_err(from_gpu(yb[i], ref.size()), ref), exl2_tol(rows))
            << "K=" << K << " matrix " << i << " rows=" << rows;
      }
    }
  }
  // A set that cannot share a launch: GPTQ next to EXL2, and EXL2 of a different K.
  auto a = test::random_exl2(128, 70, {{4, 64}, {3, 64}}, 801);
  auto b = test::random_gptq(128, 64, 32, true, 802);
  auto c = test::random_exl2(256, 40, {{2, 128}, {6, 128}}, 803);
  auto pa = gpu().prepare_linear(a.m), pb = gpu().prepare_linear(b.m), pc = gpu().prepare_linear(c.m);
  auto x = test::random_floats(2 * 256, 804);
  Buffer dx = to_gpu(x), ya = gpu().alloc(2 * 70 * 4), yb = gpu().alloc(2 * 64 * 4), yc = gpu().alloc(2 * 40 * 4);
  const PreparedLinear* ws[3] = {pa.get(), pb.get(), pc.get()};
  float* ys[3] = {ya.f32(), yb.f32(), yc.f32()};
  EXPECT_THROW(gpu().linears(std::span<const PreparedLinear* const>(ws, 3), dx.f32(), std::span<float* const>(ys, 2), 2),
               Error);
  gpu().linears(ws, dx.f32(), ys, 2);
  EXPECT_LT(rel_err(from_gpu(ya, 140), gpu_linear(a.m, std::vector<float>(x.begin(), x.begin() + 256), 2)), 1e-6);
  EXPECT_LT(rel_err(from_gpu(yb, 128), gpu_linear(b.m, std::vector<float>(x.begin(), x.begin() + 256), 2)), 1e-5);
  EXPECT_LT(rel_err(from_gpu(yc, 80), gpu_linear(c.m, x, 2)), 1e-6);
}

TEST_F(CudaBackendTest, SwigluLinearFusedMatchesSwigluThenLinear) {
  // Streamed layouts (whole 32-row groups) and a group-walk one (16-row 2-bit groups); rows on
  // both sides of the gemv limit (above it the backend runs swiglu, then the linear).
  uint32_t seed = 900;
  for (const Exl2Case& c : std::vector<Exl2Case>{{1024, 517, {{8, 64}, {6, 128}, {5, 128}, {4, 320}, {3, 256}, {2, 128}}},
                                                 {4096, 96, {{4, 1024}, {3, 3072}}},
                                                 {96, 40, {{2, 16}, {2, 80}}}}) {
    auto w = test::random_exl2(c.K, c.N, c.groups, seed++, c.K == 96);
    auto p = gpu().prepare_linear(w.m);
    for (int64_t rows : {1, 3, 8, 16, 40, 64, 90}) {
      auto g = test::random_floats(size_t(rows * c.K), seed++, 4.0f), u = test::random_floats(size_t(rows * c.K), seed++);
      std::vector<float> act(g.size()), ref(size_t(rows * c.N));
      cpu::swiglu(g.data(), u.data(), act.data(), int64_t(g.size()));
      cpu::linear_exl2(tp_, w.m, act.data(), ref.data(), rows);
      Buffer dg = to_gpu(g), du = to_gpu(u), dy = gpu().alloc(ref.size() * 4);
      gpu().swiglu_linear(*p, dg.f32(), du.f32(), dy.f32(), rows, c.K, false);
      EXPECT_LT(rel_err(from_gpu(dy, ref.size()), ref), exl2_tol(rows))
          << "K=" << c.K << " N=" << c.N << " rows=" << rows;
    }
  }
}

TEST_F(CudaBackendTest, NormAndResidualFusionsMatchTheSeparateOps) {
  // rms_norm_linears (norm formed in the gemv's gather), linear_residual and swiglu_linear_residual
  // (the gemv adds into x) against the CPU's separate ops; streamed and group-walk layouts, rows
  // on both sides of the gemv limit (above it the backend runs the ops one by one).
  uint32_t seed = 1300;
  for (const Exl2Case& c : std::vector<Exl2Case>{{1024, 520, {{8, 64}, {6, 128}, {5, 128}, {4, 320}, {3, 256}, {2, 128}}},
                                                 {96, 40, {{2, 16}, {2, 80}}}}) {
    auto a = test::random_exl2(c.K, c.N, c.groups, seed++, true), b = test::random_exl2(c.K, 75, c.groups, seed++);
    auto down = test::random_exl2(c.N, c.K, {{4, c.N}}, seed++);
    auto pa = gpu().prepare_linear(a.m), pb = gpu().prepare_linear(b.m), pd = gpu().prepare_linear(down.m);
    for (int64_t rows : {1, 3, 8, 16, 40}) {
      SCOPED_TRACE("K=" + std::to_string(c.K) + " rows=" + std::to_string(rows));
      const double tol = exl2_tol(rows);
      const auto x = test::random_floats(size_t(rows * c.K), seed++, 3.0f), nw = test::random_floats(size_t(c.K), seed++);
      std::vector<float> xn(x.size()), ra(size_t(rows * c.N)), rb(size_t(rows * 75));
      cpu::rms_norm(tp_, x.data(), nw.data(), xn.data(), rows, c.K, 1e-5f);
      cpu::linear_exl2(tp_, a.m, xn.data(), ra.data(), rows);
      cpu::linear_exl2(tp_, b.m, xn.data(), rb.data(), rows);
      Buffer dx = to_gpu(x), dnw = to_gpu(nw), dxn = gpu().alloc(x.size() * 4), dya = gpu().alloc(ra.size() * 4),
             dyb = gpu().alloc(rb.size() * 4);
      const PreparedLinear* ws[2] = {pa.get(), pb.get()};
      float* ys[2] = {dya.f32(), dyb.f32()};
      gpu().rms_norm_linears(ws, dx.f32(), dnw.f32(), dxn.f32(), ys, rows, c.K, 1e-5f, false);
      EXPECT_LT(rel_err(from_gpu(dya, ra.size()), ra), tol);
      EXPECT_LT(rel_err(from_gpu(dyb, rb.size()), rb), tol);
      // exact (a q8/q4 cache's forward): fp32-level at every size, as linears_exact.
      gpu().rms_norm_linears(ws, dx.f32(), dnw.f32(), dxn.f32(), ys, rows, c.K, 1e-5f, true);
      EXPECT_LT(rel_err(from_gpu(dyb, rb.size()), rb), k_tol_f32);

      // x_res[rows, K] += xa · Downᵀ (Down maps N → K), then += (silu(g) ⊙ u) · Downᵀ.
      const auto base = test::random_floats(size_t(rows * c.K), seed++, 2.0f);
      const auto g = test::random_floats(size_t(rows * c.N), seed++, 4.0f), u = test::random_floats(g.size(), seed++);
      std::vector<float> ref = base, t(base.size()), act(g.size());
      const auto ya = from_gpu(dya, ra.size());
      cpu::linear_exl2(tp_, down.m, ya.data(), t.data(), rows);
      cpu::add(ref.data(), t.data(), int64_t(ref.size()));
      Buffer dres = to_gpu(base), dtmp = gpu().alloc(base.size() * 4);
      gpu().linear_residual(*pd, dya.f32(), dres.f32(), dtmp.f32(), rows, rows > 16);
      EXPECT_LT(rel_err(from_gpu(dres, ref.size()), ref), rows > 16 ? k_tol_f32 : tol);
      cpu::swiglu(g.data(), u.data(), act.data(), int64_t(g.size()));
      cpu::linear_exl2(tp_, down.m, act.data(), t.data(), rows);
      cpu::add(ref.data(), t.data(), int64_t(ref.size()));
      Buffer dg = to_gpu(g), du = to_gpu(u);
      gpu().swiglu_linear_residual(*pd, dg.f32(), du.f32(), dres.f32(), dtmp.f32(), rows, c.N, false);
      EXPECT_LT(rel_err(from_gpu(dres, ref.size()), ref), tol);
    }
  }
}

TEST_F(CudaBackendTest, StagedNormsAndMlpMatchTheSeparateOpsBitForBit) {
  // Beyond two rows rms_norm_linears' norm writes the tensor-core kernel's input itself, and
  // rms_norm_mlp_residual chains gate/up's sums into down's input (cuda_linear.h,
  // run_mlp_staged): the same fp16 inputs as the staging kernels form, so every output equals the
  // separate GPU ops' bit for bit; and the CPU's within the fp16 tolerance. Gate/up of several
  // K-slices (chained) and of one (K = 96, with padding rows past K, and 128), mixed widths,
  // random act-order (and down in input order), bias, rows on both sides of the tensor-core bottom
  // and past one row block.
  struct MlpCase {
    int64_t H, I;
    std::vector<std::pair<int, int64_t>> g_h, g_i;
  };
  uint32_t seed = 2100;
  for (const MlpCase& c : std::vector<MlpCase>{{1024, 384, {{8, 64}, {6, 128}, {5, 128}, {4, 320}, {3, 256}, {2, 128}},
                                                {{4, 256}, {6, 128}}},
                                               {96, 160, {{4, 96}}, {{3, 128}, {5, 32}}},
                                               {128, 256, {{6, 128}}, {{2, 64}, {8, 192}}}}) {
    auto gate = test::random_exl2(c.H, c.I, c.g_h, seed++, true), up = test::random_exl2(c.H, c.I, c.g_h, seed++);
    auto down = test::random_exl2(c.I, c.H, c.g_i, seed++);
    auto pg = gpu().prepare_linear(gate.m), pu = gpu().prepare_linear(up.m);
    for (const bool in_order : {false, true})
    for (int64_t rows : {2, 3, 8, 17, 40, 64, 90}) {
      SCOPED_TRACE("H=" + std::to_string(c.H) + " rows=" + std::to_string(rows) + (in_order ? " down in order" : ""));
      // In order: down's rows in input order, as a model's are once gate/up follow them
      // (engine/mlp_order.h): the gate/up sums then store whole units of down's input.
      if (in_order) std::iota(down.m.perm.begin(), down.m.perm.end(), 0);
      auto pd = gpu().prepare_linear(down.m);
      const auto x = test::random_floats(size_t(rows * c.H), seed++, 3.0f);
      const auto nw = test::random_floats(size_t(c.H), seed++, 0.1f);
      Buffer dx = to_gpu(x), dnw = to_gpu(nw), dxn = gpu().alloc(x.size() * 4), dtmp = gpu().alloc(x.size() * 4);
      const size_t ni = size_t(rows * c.I);
      Buffer dg = gpu().alloc(ni * 4), du = gpu().alloc(ni * 4), dg2 = gpu().alloc(ni * 4), du2 = gpu().alloc(ni * 4);
      const PreparedLinear* gu[2] = {pg.get(), pu.get()};
      float* sep[2] = {dg.f32(), du.f32()};
      float* fused[2] = {dg2.f32(), du2.f32()};
      gpu().rms_norm(dx.f32(), dnw.f32(), dxn.f32(), rows, c.H, 1e-5f);
      gpu().linears(gu, dxn.f32(), sep, rows);
      gpu().rms_norm_linears(gu, dx.f32(), dnw.f32(), dxn.f32(), fused, rows, c.H, 1e-5f, false);
      const auto g_sep = from_gpu(dg, ni), u_sep = from_gpu(du, ni);
      const bool staged = rows >= cuda_exl2_mma_min_rows;  // two rows: the gemv, which norms while gathering
      if (staged) {
        EXPECT_EQ(from_gpu(dg2, ni), g_sep);
        EXPECT_EQ(from_gpu(du2, ni), u_sep);
      }

      std::vector<float> xn(x.size()), g(ni), u(ni), act(ni), t(x.size()), ref = x;
      cpu::rms_norm(tp_, x.data(), nw.data(), xn.data(), rows, c.H, 1e-5f);
      cpu::linear_exl2(tp_, gate.m, xn.data(), g.data(), rows);
      cpu::linear_exl2(tp_, up.m, xn.data(), u.data(), rows);
      EXPECT_LT(rel_err(g_sep, g), exl2_tol(rows));
      cpu::swiglu(g.data(), u.data(), act.data(), int64_t(ni));
      cpu::linear_exl2(tp_, down.m, act.data(), t.data(), rows);
      cpu::add(ref.data(), t.data(), int64_t(ref.size()));

      Buffer dres = to_gpu(x);
      gpu().swiglu_linear_residual(*pd, dg.f32(), du.f32(), dres.f32(), dtmp.f32(), rows, c.I, false);
      const auto res_sep = from_gpu(dres, x.size());
      Buffer dres2 = to_gpu(x);
      gpu().rms_norm_mlp_residual({pg.get(), pu.get(), pd.get(), dres2.f32(), dnw.f32(), dxn.f32(), dg2.f32(), du2.f32(),
                                   dtmp.f32(), rows, c.H, c.I, 1e-5f, false});
      const auto res_fused = from_gpu(dres2, x.size());
      if (staged) {
        EXPECT_EQ(res_fused, res_sep);
      }
      EXPECT_LT(rel_err(res_fused, ref), exl2_tol(rows));
    }
  }
}

// The CPU's layer output block on the residual stream x [rows, H] (eps 1e-5): x += att · W_oᵀ,
// then x += (silu(g) ⊙ u) · W_downᵀ with g, u = (rms_norm(x) ⊙ nw) · W_{gate,up}ᵀ.
void cpu_layer_output(ThreadPool& tp, const Exl2Matrix& o, const std::vector<float>& att, const Exl2Matrix& gate,
                      const Exl2Matrix& up, const Exl2Matrix& down, const std::vector<float>& nw, std::vector<float>& x,
                      int64_t rows) {
  const int64_t H = o.out_features, I = gate.out_features;
  std::vector<float> t(x.size()), xn(x.size()), g(size_t(rows * I)), u(g.size()), act(g.size());
  cpu::linear_exl2(tp, o, att.data(), t.data(), rows);
  cpu::add(x.data(), t.data(), int64_t(x.size()));
  cpu::rms_norm(tp, x.data(), nw.data(), xn.data(), rows, H, 1e-5f);
  cpu::linear_exl2(tp, gate, xn.data(), g.data(), rows);
  cpu::linear_exl2(tp, up, xn.data(), u.data(), rows);
  cpu::swiglu(g.data(), u.data(), act.data(), int64_t(g.size()));
  cpu::linear_exl2(tp, down, act.data(), t.data(), rows);
  cpu::add(x.data(), t.data(), int64_t(x.size()));
}

TEST_F(CudaBackendTest, DecodeStepHandoffsMatchCpu) {
  // Inside decode steps each op hands its output to the gemv that reads it next in that gemv's
  // act-order (cuda/handoff.h): o projection → gate/up (with the sums of squares the norm needs),
  // gate/up → down, down → q. Pairs learned in the first step are used from the second: every
  // step matches the CPU's separate ops, and the later steps read three hand-offs each. Mixed
  // widths in both the streamed and the group-walk layout; biases on the producers.
  const int64_t H = 512, I = 384;
  auto o = test::random_exl2(H, H, {{4, 256}, {6, 256}}, 2000, true);
  auto gate = test::random_exl2(H, I, {{4, 256}, {5, 256}}, 2001);
  auto up = test::random_exl2(H, I, {{4, 256}, {5, 256}}, 2002);
  up.m.perm = gate.m.perm;  // gate and up share their act-order, as a converted model's do
  auto down = test::random_exl2(I, H, {{3, 96}, {4, 288}}, 2003, true);
  auto q = test::random_exl2(H, 256, {{8, 128}, {2, 384}}, 2004);
  auto po = gpu().prepare_linear(o.m), pg = gpu().prepare_linear(gate.m), pu = gpu().prepare_linear(up.m),
       pd = gpu().prepare_linear(down.m), pq = gpu().prepare_linear(q.m);
  uint32_t seed = 2100;
  for (int64_t rows : {1, 2}) {
    SCOPED_TRACE("rows=" + std::to_string(rows));
    const auto x0 = test::random_floats(size_t(rows * H), seed++, 2.0f), a = test::random_floats(x0.size(), seed++);
    const auto nw1 = test::random_floats(size_t(H), seed++), nw2 = test::random_floats(size_t(H), seed++);
    std::vector<float> x = x0, xn(x0.size()), g(size_t(rows * I)), yq(size_t(rows * 256));
    cpu_layer_output(tp_, o.m, a, gate.m, up.m, down.m, nw1, x, rows);
    cpu::rms_norm(tp_, x.data(), nw2.data(), xn.data(), rows, H, 1e-5f);
    cpu::linear_exl2(tp_, q.m, xn.data(), yq.data(), rows);

    Buffer dx = gpu().alloc(x0.size() * 4), da = to_gpu(a), dn1 = to_gpu(nw1), dn2 = to_gpu(nw2),
           dxn = gpu().alloc(x0.size() * 4), dt = gpu().alloc(x0.size() * 4), dg = gpu().alloc(g.size() * 4),
           du = gpu().alloc(g.size() * 4), dq = gpu().alloc(yq.size() * 4);
    const PreparedLinear* gu[2] = {pg.get(), pu.get()};
    const PreparedLinear* qs[1] = {pq.get()};
    float* gu_out[2] = {dg.f32(), du.f32()};
    float* q_out[1] = {dq.f32()};
    const int64_t before = cuda_step_stats(gpu()).handoffs;
    for (int step = 0; step < 4; ++step) {
      gpu().upload(dx.data(), x0.data(), x0.size() * 4);
      do {
        gpu().begin_step();
        gpu().linear_residual(*po, da.f32(), dx.f32(), dt.f32(), rows, false);
        gpu().rms_norm_linears(gu, dx.f32(), dn1.f32(), dxn.f32(), gu_out, rows, H, 1e-5f, false);
        gpu().swiglu_linear_residual(*pd, dg.f32(), du.f32(), dx.f32(), dt.f32(), rows, I, false);
        gpu().rms_norm_linears(qs, dx.f32(), dn2.f32(), dxn.f32(), q_out, rows, H, 1e-5f, false);
      } while (!gpu().end_step());
      EXPECT_LT(rel_err(from_gpu(dx, x.size()), x), k_tol_f32) << "step " << step;
      EXPECT_LT(rel_err(from_gpu(dq, yq.size()), yq), k_tol_f32) << "step " << step;
    }
    // Steps 2..4 read three hand-offs each (a step recorded and then captured reads them twice).
    EXPECT_GE(cuda_step_stats(gpu()).handoffs - before, 9);
  }
}

TEST_F(CudaBackendTest, HandoffNormsFollowNewWeightsAtAFreedAddress) {
  // A decode step's gate/up read the o projection's hand-off with their norm weights permuted once
  // and cached by the weights' device address. Each round frees its norm weights and uploads new
  // ones of the same size (the allocator tends to hand the same address back): every round must
  // use its own weights, not the cached permutation of an earlier round's.
  const int64_t H = 256, I = 128;
  auto o = test::random_exl2(H, H, {{4, 256}}, 3000);
  auto gate = test::random_exl2(H, I, {{4, 256}}, 3001), up = test::random_exl2(H, I, {{5, 256}}, 3002);
  up.m.perm = gate.m.perm;
  auto po = gpu().prepare_linear(o.m), pg = gpu().prepare_linear(gate.m), pu = gpu().prepare_linear(up.m);
  const PreparedLinear* gu[2] = {pg.get(), pu.get()};
  const auto x0 = test::random_floats(size_t(H), 3003, 2.0f), a = test::random_floats(size_t(H), 3004);
  Buffer dx = gpu().alloc(size_t(H) * 4), da = to_gpu(a), dxn = gpu().alloc(size_t(H) * 4),
         dt = gpu().alloc(size_t(H) * 4), dg = gpu().alloc(size_t(I) * 4), du = gpu().alloc(size_t(I) * 4);
  float* gu_out[2] = {dg.f32(), du.f32()};
  const int64_t before = cuda_step_stats(gpu()).handoffs;
  const void* last = nullptr;
  int reused = 0;
  for (uint32_t round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // The norm weights at the last round's (freed) address: allocations are held until one lands there.
    std::vector<Buffer> held;
    Buffer dn = gpu().alloc(size_t(H) * 4);
    for (int i = 0; last && dn.data() != last && i < 256; ++i) held.push_back(std::exchange(dn, gpu().alloc(size_t(H) * 4)));
    reused += dn.data() == last;
    last = dn.data();
    const auto nw = test::random_floats(size_t(H), 3100 + round);
    std::vector<float> x = x0, t(x0.size()), xn(x0.size()), g(static_cast<size_t>(I));
    cpu::linear_exl2(tp_, o.m, a.data(), t.data(), 1);
    cpu::add(x.data(), t.data(), H);
    cpu::rms_norm(tp_, x.data(), nw.data(), xn.data(), 1, H, 1e-5f);
    cpu::linear_exl2(tp_, gate.m, xn.data(), g.data(), 1);
    gpu().upload(dn.data(), nw.data(), nw.size() * 4);
    for (int step = 0; step < 3; ++step) {
      gpu().upload(dx.data(), x0.data(), x0.size() * 4);
      do {
        gpu().begin_step();
        gpu().linear_residual(*po, da.f32(), dx.f32(), dt.f32(), 1, false);
        gpu().rms_norm_linears(gu, dx.f32(), dn.f32(), dxn.f32(), gu_out, 1, H, 1e-5f, false);
      } while (!gpu().end_step());
      EXPECT_LT(rel_err(from_gpu(dg, g.size()), g), k_tol_f32) << "step " << step;
    }
  }
  EXPECT_GE(cuda_step_stats(gpu()).handoffs - before, 4) << "later steps of a round read the hand-off";
  if (reused == 0) GTEST_SKIP() << "the allocator never handed a freed address back: nothing was shown";
}

TEST_F(CudaBackendTest, LinearExl2MatchesNaiveDequantization) {
  // Independent of the CPU kernel: the element-wise double reference of random_weights.h.
  auto w = test::random_exl2(384, 100, {{8, 32}, {5, 96}, {3, 128}, {2, 128}}, 77, true);
  const auto wd = test::naive_dequant(w.m);
  for (int64_t rows : {1, 5, 33}) {
    auto x = test::random_floats(size_t(rows * 384), 78 + uint32_t(rows));
    const auto refd = test::naive_linear(wd, w.m.bias, x, rows, 384, 100);
    const std::vector<float> ref(refd.begin(), refd.end());
    EXPECT_LT(rel_err(gpu_linear(w.m, x, rows), ref), exl2_tol(rows)) << rows;
  }
}

TEST_F(CudaBackendTest, StreamKTensorCoreSetsMatchCpu) {
  // EXL_CUDA_MMA_STREAM_K=n: every tensor-core set of one row block runs on n blocks that share its
  // (column tile, 128-row chunk) units, most of them ending inside a tile (three jobs of 3 + 2 + 1
  // tiles, 9 chunks each: 54 units; 7 blocks take 7 or 8, 11 blocks 4 or 5, 53 blocks one or two,
  // so a tile has up to 2, 3 and 9 slots). The sums add a tile's slots in K order; against the
  // CPU at tensor-core precision.
  auto wq = test::random_exl2(1152, 300, {{8, 128}, {6, 256}, {5, 256}, {4, 256}, {3, 256}}, 1710, true);
  auto wk = test::random_exl2(1152, 256, {{2, 384}, {4, 768}}, 1711, true);
  auto wv = test::random_exl2(1152, 100, {{4, 1152}}, 1712, false);
  for (const char* n : {"7", "11", "53"}) {
    auto sk = backend_with({{"EXL_CUDA_MMA_STREAM_K", n}});
    for (int64_t rows : {3, 16, 33, 64}) {
      SCOPED_TRACE(std::string("blocks=") + n + " rows=" + std::to_string(rows));
      expect_set_matches_cpu(*sk, {&wq, &wk, &wv}, rows, 1713 + uint32_t(rows));
    }
  }
}

TEST_F(CudaBackendTest, LinearExl2HalfPathLargeActivations) {
  // The 2/4/8-bit gemv paths keep fp16 partial sums over a few rows: activations of magnitude
  // ~100 (outlier channels) must neither overflow nor lose more than fp32-path accuracy.
  uint32_t seed = 300;
  for (const auto& groups : std::vector<std::vector<std::pair<int, int64_t>>>{
           {{4, 4096}}, {{8, 1024}, {2, 1024}}, {{4, 32}, {8, 32}, {4, 960}}}) {
    int64_t K = 0;
    for (const auto& g : groups) K += g.second;
    auto w = test::random_exl2(K, 300, groups, seed++, false);
    for (int64_t rows : {1, 4, 9}) {
      auto x = test::random_floats(size_t(rows * K), seed++, 100.0f);
      std::vector<float> ref(size_t(rows * 300));
      cpu::linear_exl2(tp_, w.m, x.data(), ref.data(), rows);
      EXPECT_LT(rel_err(gpu_linear(w.m, x, rows), ref), exl2_tol(rows)) << "K=" << K << " rows=" << rows;
    }
  }
}

TEST_F(CudaBackendTest, LinearGptqV1V2ActOrder) {
  uint32_t seed = 100;
  for (bool act : {false, true})
    for (bool v2 : {false, true})
      for (auto [K, N, gs] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {64, 8, 32}, {256, 40, 128}, {96, 24, 32}, {1024, 264, 128}}) {
        auto w = test::random_gptq(K, N, gs, act, seed++);
        w.m.zeros_v2 = v2;
        if (seed % 2) w.m.bias = test::random_floats(size_t(N), seed);
        for (int64_t rows : {1, 8, 40}) {
          auto x = test::random_floats(size_t(rows * K), seed++);
          std::vector<float> ref(size_t(rows * N));
          cpu::linear_gptq(tp_, w.m, x.data(), ref.data(), rows);
          EXPECT_LT(rel_err(gpu_linear(w.m, x, rows), ref), rows <= 16 ? k_tol_f32 : k_tol_f16)
              << "K=" << K << " N=" << N << " act=" << act << " v2=" << v2 << " rows=" << rows;
        }
      }
}

TEST_F(CudaBackendTest, LinearDenseEveryDtype) {
  uint32_t seed = 200;
  for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{77, 45}, {128, 96}, {256, 33}})
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      auto wf = test::random_floats(size_t(N * K), seed++);
      std::vector<uint16_t> h(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) h[i] = dt == DType::f16 ? float_to_half(wf[i]) : float_to_bf16(wf[i]);
      DenseMatrix m{K, N, dt, dt == DType::f32 ? static_cast<const void*>(wf.data()) : h.data(),
                    test::random_floats(size_t(N), seed++)};
      for (int64_t rows : {1, 3, 8, 40}) {
        auto x = test::random_floats(size_t(rows * K), seed++);
        std::vector<float> ref(size_t(rows * N));
        cpu::linear_dense(tp_, m, x.data(), ref.data(), rows);
        const double tol = rows <= 8 || dt == DType::f32 ? k_tol_f32 : k_tol_f16;
        EXPECT_LT(rel_err(gpu_linear(m, x, rows), ref), tol)
            << to_string(dt) << " K=" << K << " N=" << N << " rows=" << rows;
        EXPECT_LT(rel_err(gpu_linear(m, x, rows, 1), ref), tol)  // unaligned activations
            << to_string(dt) << " K=" << K << " N=" << N << " rows=" << rows << " offset 1";
      }
    }
}

TEST_F(CudaBackendTest, LinearsExactAreFp32LevelBeyondGemvSizes) {
  // linears_exact (forwards with a q8/q4 cache): fp32-level error beyond the gemv sizes for every
  // format, act-order and bias, activations over a wide range; linears() keeps the fp16 path.
  auto e = test::random_exl2(512, 130, {{8, 64}, {6, 128}, {4, 192}, {3, 64}, {2, 64}}, 900, true);
  auto g = test::random_gptq(256, 96, 64, true, 901);
  auto wf = test::random_floats(size_t(72 * 256), 902, 0.05f);
  std::vector<uint16_t> h(wf.size()), hb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) h[i] = float_to_half(wf[i]), hb[i] = float_to_bf16(wf[i]);
  const std::vector<float> bias = test::random_floats(72, 903);
  const DenseMatrix d16{256, 72, DType::f16, h.data(), bias}, dbf{256, 72, DType::bf16, hb.data(), {}},
      d32{256, 72, DType::f32, wf.data(), bias};
  uint32_t seed = 910;
  for (const LinearWeights& w :
       {LinearWeights(e.m), LinearWeights(g.m), LinearWeights(d16), LinearWeights(dbf), LinearWeights(d32)}) {
    const int64_t K = in_features(w), N = out_features(w);
    const bool dense = std::holds_alternative<DenseMatrix>(w);
    auto p = gpu().prepare_linear(w);
    const PreparedLinear* ws[2] = {p.get(), p.get()};
    for (int64_t rows : {3, 12, 24, 40, 129}) {
      auto x = test::random_floats(size_t(rows * K), seed++, 30.0f);
      for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e-3f;
      std::vector<float> ref(size_t(rows * N));
      cpu::linear(tp_, w, x.data(), ref.data(), rows);
      Buffer dx = to_gpu(x), y0 = gpu().alloc(ref.size() * 4), y1 = gpu().alloc(ref.size() * 4),
             y_fast = gpu().alloc(ref.size() * 4);
      float* ys[2] = {y0.f32(), y1.f32()};
      gpu().linears_exact(ws, dx.f32(), ys, rows);
      gpu().linear(*p, dx.f32(), y_fast.f32(), rows);
      const double err = std::max(rel_err(from_gpu(y0, ref.size()), ref), rel_err(from_gpu(y1, ref.size()), ref));
      const double fast = rel_err(from_gpu(y_fast, ref.size()), ref);
      // The gemv kernels' own precision (EXL2's exact path keeps up to 32 rows on its gemv).
      const bool exl2 = std::holds_alternative<Exl2Matrix>(w);
      const bool gemv = rows <= (dense ? 8 : exl2 ? cuda_exl2_exact_gemv_rows : 16);
      EXPECT_LT(err, gemv ? k_tol_f32 : 2e-5) << "K=" << K << " N=" << N << " rows=" << rows;
      if (!gemv && !(dense && std::get<DenseMatrix>(w).dtype == DType::f32)) {
        EXPECT_GT(fast, 10 * err) << "linear() took the exact path; K=" << K << " rows=" << rows;
      }
    }
  }
  const PreparedLinear* ws[1] = {nullptr};
  float* ys[2] = {nullptr, nullptr};
  EXPECT_THROW(gpu().linears_exact(ws, nullptr, ys, 40), Error);
}

#ifdef EXL_HAVE_CUDA
TEST_F(CudaBackendTest, LinearLargeBatchDequantizesInColumnChunks) {
  cuda::CudaContext ctx(0);
  ctx.dequant_chunk_elems = 256 * 128;  // 128 columns per chunk at K = 256
  auto e = test::random_exl2(256, 300, {{6, 128}, {4, 96}, {2, 32}}, 700, true);
  auto g = test::random_gptq(256, 296, 64, true, 701);
  const int64_t rows = 20;
  auto x = test::random_floats(size_t(rows * 256), 702);
  for (const LinearWeights& w : {LinearWeights(e.m), LinearWeights(g.m)}) {
    const int64_t N = out_features(w);
    std::vector<float> ref(size_t(rows * N)), got(ref.size());
    cpu::linear(tp_, w, x.data(), ref.data(), rows);
    auto lin = cuda::prepare_cuda_linear(ctx, w);
    Buffer dx = ctx.upload_new(x), dy = ctx.alloc(got.size() * 4);
    lin->run(ctx, dx.f32(), dy.f32(), rows);
    ctx.sync();
    ASSERT_EQ(cudaMemcpy(got.data(), dy.data(), got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_LT(rel_err(got, ref), k_tol_f16) << "N=" << N;
    lin->run_exact(ctx, dx.f32(), dy.f32(), rows);  // 128-column chunks as well
    ctx.sync();
    ASSERT_EQ(cudaMemcpy(got.data(), dy.data(), got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_LT(rel_err(got, ref), 2e-5) << "exact, N=" << N;
  }
}
#endif

// ---- element-wise ops ---------------------------------------------------------------------------

TEST_F(CudaBackendTest, RmsNormOddAndEvenSizesInPlace) {
  for (auto [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {7, 333}, {3, 4096}, {2, 5}}) {
    auto x = test::random_floats(size_t(rows * dim), uint32_t(rows * dim), 3.0f);
    auto w = test::random_floats(size_t(dim), uint32_t(dim));
    std::vector<float> ref(x.size());
    cpu::rms_norm(tp_, x.data(), w.data(), ref.data(), rows, dim, 1e-5f);
    Buffer dx = to_gpu(x), dw = to_gpu(w), dy = gpu().alloc(x.size() * 4);
    gpu().rms_norm(dx.f32(), dw.f32(), dy.f32(), rows, dim, 1e-5f);
    EXPECT_LT(rel_err(from_gpu(dy, x.size()), ref), 1e-5) << rows << "x" << dim;
    gpu().rms_norm(dx.f32(), dw.f32(), dx.f32(), rows, dim, 1e-5f);  // aliasing
    EXPECT_LT(rel_err(from_gpu(dx, x.size()), ref), 1e-5) << rows << "x" << dim << " in place";
  }
}

TEST_F(CudaBackendTest, RopeMatchesCpuAtLargePositions) {
  for (int head_dim : {8, 64, 128}) {
    const int64_t rows = 6;
    const int n_heads = 3;
    RopeTable table;
    for (int i = 0; i < head_dim / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / float(head_dim)));
    table.attn_factor = 1.1f;
    const std::vector<int32_t> pos = {0, 1, 17, 4095, 100000, 131071};
    auto x = test::random_floats(size_t(rows * n_heads * head_dim), uint32_t(head_dim));
    auto ref = x;
    cpu::rope(ref.data(), rows, n_heads, head_dim, pos, table);
    Buffer dx = to_gpu(x);
    gpu().rope(dx.f32(), rows, n_heads, head_dim, pos, table);
    EXPECT_LT(rel_err(from_gpu(dx, x.size()), ref), 1e-5) << head_dim;
  }
  RopeTable bad;
  bad.inv_freq.resize(3);
  Buffer dx = gpu().alloc(64);
  EXPECT_THROW(gpu().rope(dx.f32(), 1, 1, 8, std::vector<int32_t>{0}, bad), Error);
}

TEST_F(CudaBackendTest, AddRmsNormFusedMatchesAddThenNorm) {
  for (auto [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {7, 333}, {3, 4096}, {2, 5}}) {
    auto x = test::random_floats(size_t(rows * dim), uint32_t(rows * dim + 1), 3.0f);
    auto y = test::random_floats(size_t(rows * dim), uint32_t(rows * dim + 2), 2.0f);
    auto w = test::random_floats(size_t(dim), uint32_t(dim + 3));
    auto sum = x;
    cpu::add(sum.data(), y.data(), rows * dim);
    std::vector<float> ref(x.size());
    cpu::rms_norm(tp_, sum.data(), w.data(), ref.data(), rows, dim, 1e-5f);
    Buffer dx = to_gpu(x), dy = to_gpu(y), dw = to_gpu(w), dout = gpu().alloc(x.size() * 4);
    gpu().add_rms_norm(dx.f32(), dy.f32(), dw.f32(), dout.f32(), rows, dim, 1e-5f);
    EXPECT_EQ(from_gpu(dx, x.size()), sum) << rows << "x" << dim << " residual";
    EXPECT_LT(rel_err(from_gpu(dout, x.size()), ref), 1e-5) << rows << "x" << dim;
    Buffer dx2 = to_gpu(x);
    gpu().add_rms_norm(dx2.f32(), dy.f32(), dw.f32(), dx2.f32(), rows, dim, 1e-5f);  // aliasing
    EXPECT_LT(rel_err(from_gpu(dx2, x.size()), ref), 1e-5) << rows << "x" << dim << " in place";
  }
}

TEST_F(CudaBackendTest, RopeQkMatchesTwoRopes) {
  for (auto [head_dim, n_heads, n_kv, rows] : std::vector<std::tuple<int, int, int, int64_t>>{
           {64, 4, 1, 1}, {128, 6, 2, 3}, {8, 3, 3, 5}}) {
    RopeTable table;
    for (int i = 0; i < head_dim / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / float(head_dim)));
    table.attn_factor = 0.9f;
    std::vector<int32_t> pos;
    for (int64_t r = 0; r < rows; ++r) pos.push_back(int32_t(37 * r + 5 * head_dim));
    auto q = test::random_floats(size_t(rows * n_heads * head_dim), uint32_t(head_dim + n_heads));
    auto k = test::random_floats(size_t(rows * n_kv * head_dim), uint32_t(head_dim + n_kv + 50));
    auto rq = q, rk = k;
    cpu::rope(rq.data(), rows, n_heads, head_dim, pos, table);
    cpu::rope(rk.data(), rows, n_kv, head_dim, pos, table);
    Buffer dq = to_gpu(q), dk = to_gpu(k);
    gpu().rope_qk(dq.f32(), dk.f32(), rows, n_heads, n_kv, head_dim, pos, table);
    EXPECT_LT(rel_err(from_gpu(dq, q.size()), rq), 1e-5) << head_dim << " q";
    EXPECT_LT(rel_err(from_gpu(dk, k.size()), rk), 1e-5) << head_dim << " k";
  }
}

TEST_F(CudaBackendTest, SwigluAndAdd) {
  for (int64_t n : {1, 1001, 65536 * 3 + 7}) {
    auto g = test::random_floats(size_t(n), 1, 4.0f), u = test::random_floats(size_t(n), 2);
    std::vector<float> ref(static_cast<size_t>(n));
    cpu::swiglu(g.data(), u.data(), ref.data(), n);
    Buffer dg = to_gpu(g), du = to_gpu(u), dout = gpu().alloc(size_t(n) * 4);
    gpu().swiglu(dg.f32(), du.f32(), dout.f32(), n);
    EXPECT_LT(rel_err(from_gpu(dout, size_t(n)), ref), 1e-6) << n;
    auto sum = g;
    cpu::add(sum.data(), u.data(), n);
    gpu().add(dg.f32(), du.f32(), n);
    EXPECT_EQ(from_gpu(dg, size_t(n)), sum) << n;
  }
}

TEST_F(CudaBackendTest, EmbeddingEveryDtype) {
  const int64_t vocab = 50, dim = 37;
  auto tf = test::random_floats(size_t(vocab * dim), 3);
  std::vector<uint16_t> th(tf.size()), tb(tf.size());
  for (size_t i = 0; i < tf.size(); ++i) th[i] = float_to_half(tf[i]), tb[i] = float_to_bf16(tf[i]);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17, 25, 8};
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    EmbeddingWeights e{vocab, dim, dt,
                       dt == DType::f32 ? static_cast<const void*>(tf.data())
                       : dt == DType::f16 ? static_cast<const void*>(th.data())
                                          : static_cast<const void*>(tb.data())};
    std::vector<float> ref(ids.size() * size_t(dim));
    cpu::embedding(e, ids, ref.data());
    auto p = gpu().prepare_embedding(e);
    Buffer out = gpu().alloc(ref.size() * 4);
    gpu().embedding(*p, ids, out.f32());
    EXPECT_EQ(from_gpu(out, ref.size()), ref) << to_string(dt);
    EXPECT_THROW(gpu().embedding(*p, std::vector<int32_t>{int32_t(vocab)}, out.f32()), Error);
  }
}

// ---- KV cache -----------------------------------------------------------------------------------

std::vector<std::byte> download_pool(Backend& be, KvPool& pool) {
  std::vector<std::byte> bytes(pool.layout.page_bytes() * size_t(pool.num_pages));
  be.download(bytes.data(), cuda_kv_pool_data(pool), bytes.size());
  return bytes;
}

// Compares pools vector by vector: f32/fp16 bytes exactly; q8/q4 identical scales and codes
// within one quantization step.
void expect_pools_match(const KvLayout& L, int num_pages, const std::vector<std::byte>& got,
                        const std::vector<std::byte>& ref) {
  if (L.format == KvFormat::f32 || L.format == KvFormat::fp16) {
    EXPECT_TRUE(got == ref) << to_string(L.format) << " D=" << L.head_dim;
    return;
  }
  int off_by_one = 0, worse = 0, scale_diff = 0;
  for (int page = 0; page < num_pages; ++page) {
    const size_t base = size_t(page) * L.page_bytes();
    for (size_t vec = 0; vec < L.n_vecs_per_page(); ++vec) {
      const size_t so = base + L.scale_offset(vec);
      if (std::memcmp(got.data() + so, ref.data() + so, L.vec_scale_bytes()) != 0) ++scale_diff;
      const size_t d0 = base + L.data_offset(vec);
      for (int d = 0; d < L.head_dim; ++d) {
        int a, b;
        if (L.format == KvFormat::q8) {
          a = int8_t(uint8_t(got[d0 + size_t(d)]));
          b = int8_t(uint8_t(ref[d0 + size_t(d)]));
        } else {
          a = (uint8_t(got[d0 + size_t(d / 2)]) >> (4 * (d % 2))) & 15;
          b = (uint8_t(ref[d0 + size_t(d / 2)]) >> (4 * (d % 2))) & 15;
        }
        off_by_one += std::abs(a - b) == 1;
        worse += std::abs(a - b) > 1;
      }
    }
  }
  EXPECT_EQ(scale_diff, 0) << to_string(L.format) << " D=" << L.head_dim;
  EXPECT_EQ(worse, 0) << to_string(L.format) << " D=" << L.head_dim;
  EXPECT_LE(off_by_one, 8) << to_string(L.format) << " D=" << L.head_dim << " (rounding differences)";
  // Bytes outside the element codes (odd-D q4 padding nibbles) must match exactly too.
  if (L.format == KvFormat::q4 && L.head_dim % 2 == 1)
    for (int page = 0; page < num_pages; ++page)
      for (size_t vec = 0; vec < L.n_vecs_per_page(); ++vec) {
        const size_t last = size_t(page) * L.page_bytes() + L.data_offset(vec) + L.vec_bytes() - 1;
        EXPECT_EQ(uint8_t(got[last]) >> 4, uint8_t(ref[last]) >> 4);
      }
}

TEST_F(CudaBackendTest, KvWriteBytesMatchCpuInEveryFormat) {
  for (KvFormat fmt : {KvFormat::f32, KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (int D : {64, 128, 8, 80, 7}) {
      const KvLayout L{3, 2, D, 16, fmt};
      const int num_pages = 7, n_tok = 41, layer = 2;
      std::vector<int32_t> slots(size_t(num_pages * 16));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), std::mt19937(uint32_t(D)));
      slots.resize(n_tok);
      auto k = test::random_floats(size_t(n_tok * 2 * D), 10 + uint32_t(D), 2.0f);
      auto v = test::random_floats(size_t(n_tok * 2 * D), 20 + uint32_t(D), 2.0f);
      std::vector<std::byte> ref(L.page_bytes() * num_pages);
      cpu::kv_write(L, ref.data(), layer, k.data(), v.data(), slots);
      auto pool = gpu().alloc_kv_pool(L, num_pages);
      Buffer dk = to_gpu(k), dv = to_gpu(v);
      gpu().kv_write(*pool, layer, dk.f32(), dv.f32(), slots);
      expect_pools_match(L, num_pages, download_pool(gpu(), *pool), ref);
    }
  const KvLayout L{1, 1, 8, 16, KvFormat::fp16};
  auto pool = gpu().alloc_kv_pool(L, 2);
  Buffer dk = gpu().alloc(64);
  EXPECT_THROW(gpu().kv_write(*pool, 0, dk.f32(), dk.f32(), std::vector<int32_t>{32}), Error);
  EXPECT_THROW(gpu().kv_write(*pool, 1, dk.f32(), dk.f32(), std::vector<int32_t>{0}), Error);
}

TEST_F(CudaBackendTest, RopeQkKvWriteFusedMatchesCpu) {
  // Rotation as cpu::rope; the cache bytes as cpu::kv_write of the rotated k (taken from the GPU,
  // so only the store is compared bytewise) and of v.
  for (KvFormat fmt : {KvFormat::f32, KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (auto [D, NH, KVH] : std::vector<std::tuple<int, int, int>>{{128, 8, 2}, {64, 4, 4}, {80, 6, 3}, {8, 2, 1}}) {
      const KvLayout L{3, KVH, D, 16, fmt};
      const int num_pages = 5, n_tok = 37, layer = 1;
      std::vector<int32_t> slots(size_t(num_pages * 16));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), std::mt19937(uint32_t(D + NH)));
      slots.resize(n_tok);
      RopeTable table;
      for (int i = 0; i < D / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / float(D)));
      std::vector<int32_t> pos;
      for (int t = 0; t < n_tok; ++t) pos.push_back(3 * t + 100);
      auto q = test::random_floats(size_t(n_tok * NH * D), uint32_t(D + 1), 2.0f);
      auto k = test::random_floats(size_t(n_tok * KVH * D), uint32_t(D + 2), 2.0f);
      auto v = test::random_floats(size_t(n_tok * KVH * D), uint32_t(D + 3), 2.0f);
      auto rq = q, rk = k;
      cpu::rope(rq.data(), n_tok, NH, D, pos, table);
      cpu::rope(rk.data(), n_tok, KVH, D, pos, table);
      auto pool = gpu().alloc_kv_pool(L, num_pages);
      Buffer dq = to_gpu(q), dk = to_gpu(k), dv = to_gpu(v);
      gpu().rope_qk_kv_write(dq.f32(), dk.f32(), dv.f32(), n_tok, NH, KVH, D, pos, table, *pool, layer, slots);
      EXPECT_LT(rel_err(from_gpu(dq, q.size()), rq), 1e-5) << to_string(fmt) << " D=" << D;
      const auto gk = from_gpu(dk, k.size());
      EXPECT_LT(rel_err(gk, rk), 1e-5) << to_string(fmt) << " D=" << D;
      std::vector<std::byte> ref(L.page_bytes() * num_pages);
      cpu::kv_write(L, ref.data(), layer, gk.data(), v.data(), slots);
      expect_pools_match(L, num_pages, download_pool(gpu(), *pool), ref);
    }
}

// The CPU's attention inputs: q, k, v = (rms_norm(x) ⊙ nw, eps 1e-6) · W_{q,k,v}ᵀ, q and k rotated.
std::array<std::vector<float>, 3> cpu_attention_inputs(ThreadPool& tp, const Exl2Matrix& wq, const Exl2Matrix& wk,
                                                       const Exl2Matrix& wv, const std::vector<float>& x,
                                                       const std::vector<float>& nw, int64_t rows,
                                                       std::span<const int32_t> pos, const RopeTable& table) {
  const int64_t dim = wq.in_features, D = int64_t(table.inv_freq.size()) * 2;
  std::vector<float> xn(x.size()), q(size_t(rows * wq.out_features)), k(size_t(rows * wk.out_features)),
      v(size_t(rows * wv.out_features));
  cpu::rms_norm(tp, x.data(), nw.data(), xn.data(), rows, dim, 1e-6f);
  cpu::linear_exl2(tp, wq, xn.data(), q.data(), rows);
  cpu::linear_exl2(tp, wk, xn.data(), k.data(), rows);
  cpu::linear_exl2(tp, wv, xn.data(), v.data(), rows);
  cpu::rope(q.data(), rows, int(wq.out_features / D), int(D), pos, table);
  cpu::rope(k.data(), rows, int(wk.out_features / D), int(D), pos, table);
  return {std::move(q), std::move(k), std::move(v)};
}

TEST_F(CudaBackendTest, AttentionInputsFusedMatchesTheSeparateOps) {
  // Norm, q/k/v projections (with bias), rope and the cache store in one gemv launch (head_dim 128,
  // rows ≤ 2) against the CPU's ops; 5 rows take the separate GPU ops. Cache bytes compared as
  // cpu::kv_write of the GPU's k and v.
  constexpr int D = 128, NH = 4, KVH = 2, dim = 256, layer = 1;
  auto wq = test::random_exl2(dim, NH * D, {{4, 128}, {3, 128}}, 1500, true);
  auto wk = test::random_exl2(dim, KVH * D, {{4, 128}, {3, 128}}, 1501, true);
  auto wv = test::random_exl2(dim, KVH * D, {{4, 128}, {3, 128}}, 1502, true);
  auto pq = gpu().prepare_linear(wq.m), pk = gpu().prepare_linear(wk.m), pv = gpu().prepare_linear(wv.m);
  const PreparedLinear* ws[3] = {pq.get(), pk.get(), pv.get()};
  RopeTable table;
  for (int i = 0; i < D / 2; ++i) table.inv_freq.push_back(std::pow(500000.0f, -2.0f * i / float(D)));
  table.attn_factor = 1.25f;
  for (KvFormat fmt : {KvFormat::f32, KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (int64_t rows : {1, 2, 5}) {
      SCOPED_TRACE(to_string(fmt) + " rows=" + std::to_string(rows));
      const KvLayout L{2, KVH, D, 16, fmt};
      const int num_pages = 3;
      std::vector<int32_t> slots = {37, 5, 20, 46, 11}, pos = {4100, 7, 65, 131071, 0};
      slots.resize(size_t(rows)), pos.resize(size_t(rows));
      const auto x = test::random_floats(size_t(rows * dim), 1510 + uint32_t(rows), 2.0f);
      const auto nw = test::random_floats(size_t(dim), 1520);
      const auto [q, k, v] = cpu_attention_inputs(tp_, wq.m, wk.m, wv.m, x, nw, rows, pos, table);
      auto pool = gpu().alloc_kv_pool(L, num_pages);
      Buffer dx = to_gpu(x), dnw = to_gpu(nw), dxn = gpu().alloc(x.size() * 4), dq = gpu().alloc(q.size() * 4),
             dk = gpu().alloc(k.size() * 4), dv = gpu().alloc(v.size() * 4);
      gpu().attention_inputs({ws, dx.f32(), dnw.f32(), dxn.f32(), dq.f32(), dk.f32(), dv.f32(), rows, dim, 1e-6f, NH,
                              KVH, D, pos, &table, pool.get(), layer, slots});
      EXPECT_LT(rel_err(from_gpu(dq, q.size()), q), k_tol_f32);
      const auto gk = from_gpu(dk, k.size()), gv = from_gpu(dv, v.size());
      EXPECT_LT(rel_err(gk, k), k_tol_f32);
      EXPECT_LT(rel_err(gv, v), k_tol_f32);
      std::vector<std::byte> ref(L.page_bytes() * num_pages);
      cpu::kv_write(L, ref.data(), layer, gk.data(), gv.data(), slots);
      expect_pools_match(L, num_pages, download_pool(gpu(), *pool), ref);
    }
}

TEST_F(CudaBackendTest, AttentionInputsAtTensorCoreSizesMatchTheSeparateOpsBitForBit) {
  // Beyond two rows the norm stages the q/k/v tensor-core set's input and the set's K-slice sums
  // rotate q and k and store k and v (dim 512: four 128-row slices on the emulator's and the H200's
  // multiprocessor counts), or, with one slice (dim 128), a rope kernel follows the set. Either way
  // q, k, v and every cache byte equal those of rms_norm_linears then rope_qk_kv_write on the
  // same backend; against the CPU at tensor-core precision.
  // Also with chains at every row count and every set of one row block run stream-K (its slot
  // sums then rotate and store).
  auto stream_k = backend_with({{"EXL_CUDA_MMA_STREAM_K", "5"}});
  for (Backend* b : {gpu_.get(), stream_k.get()}) {
    active_ = b;
    SCOPED_TRACE(b == gpu_.get() ? "defaults" : "chains to 64 rows, stream-K on 5 blocks");
    constexpr int D = 128, NH = 4, KVH = 2, layer = 1;
    RopeTable table;
    for (int i = 0; i < D / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / float(D)));
    table.attn_factor = 0.75f;
    for (int dim : {512, 128}) {
      auto wq = test::random_exl2(dim, NH * D, {{4, dim / 2}, {6, dim / 2}}, 1530 + uint32_t(dim), true);
      auto wk = test::random_exl2(dim, KVH * D, {{3, dim / 2}, {4, dim / 2}}, 1531 + uint32_t(dim), true);
      auto wv = test::random_exl2(dim, KVH * D, {{5, dim / 2}, {8, dim / 2}}, 1532 + uint32_t(dim), false);
      auto pq = gpu().prepare_linear(wq.m), pk = gpu().prepare_linear(wk.m), pv = gpu().prepare_linear(wv.m);
      const PreparedLinear* ws[3] = {pq.get(), pk.get(), pv.get()};
      for (KvFormat fmt : {KvFormat::fp16, KvFormat::f32, KvFormat::q8, KvFormat::q4})
        for (int64_t rows : {4, 9, 33}) {
          SCOPED_TRACE(to_string(fmt) + " dim=" + std::to_string(dim) + " rows=" + std::to_string(rows));
          const KvLayout L{2, KVH, D, 16, fmt};
          const int num_pages = 4;
          std::vector<int32_t> slots(static_cast<size_t>(rows)), pos(slots.size());
          for (int64_t r = 0; r < rows; ++r) slots[size_t(r)] = int32_t((r * 37 + 5) % 64), pos[size_t(r)] = int32_t(r * 997 % 5000);
          const auto x = test::random_floats(size_t(rows * dim), 1540 + uint32_t(rows), 2.0f);
          const auto nw = test::random_floats(size_t(dim), 1541);
          const auto [q, k, v] = cpu_attention_inputs(tp_, wq.m, wk.m, wv.m, x, nw, rows, pos, table);
          const std::vector<std::byte> zeros(L.page_bytes() * num_pages);
          std::vector<float> got[2][3];
          std::vector<std::byte> pools[2];
          for (int fused = 0; fused < 2; ++fused) {
            auto pool = gpu().alloc_kv_pool(L, num_pages);
            gpu().upload(cuda_kv_pool_data(*pool), zeros.data(), zeros.size());
            Buffer dx = to_gpu(x), dnw = to_gpu(nw), dxn = gpu().alloc(x.size() * 4), dq = gpu().alloc(q.size() * 4),
                   dk = gpu().alloc(k.size() * 4), dv = gpu().alloc(v.size() * 4);
            if (fused) {
              gpu().attention_inputs({ws, dx.f32(), dnw.f32(), dxn.f32(), dq.f32(), dk.f32(), dv.f32(), rows, dim, 1e-6f,
                                      NH, KVH, D, pos, &table, pool.get(), layer, slots});
            } else {
              float* outs[3] = {dq.f32(), dk.f32(), dv.f32()};
              gpu().rms_norm_linears(ws, dx.f32(), dnw.f32(), dxn.f32(), outs, rows, dim, 1e-6f, false);
              gpu().rope_qk_kv_write(dq.f32(), dk.f32(), dv.f32(), rows, NH, KVH, D, pos, table, *pool, layer, slots);
            }
            got[fused][0] = from_gpu(dq, q.size()), got[fused][1] = from_gpu(dk, k.size()),
            got[fused][2] = from_gpu(dv, v.size());
            pools[fused] = download_pool(gpu(), *pool);
          }
          for (int j = 0; j < 3; ++j)
            EXPECT_EQ(std::memcmp(got[0][j].data(), got[1][j].data(), got[0][j].size() * 4), 0) << "output " << j;
          EXPECT_TRUE(pools[0] == pools[1]);
          EXPECT_LT(rel_err(got[1][0], q), k_tol_f16);
          EXPECT_LT(rel_err(got[1][1], k), k_tol_f16);
          EXPECT_LT(rel_err(got[1][2], v), k_tol_f16);
        }
    }
  }
  active_ = nullptr;
}

TEST_F(CudaBackendTest, LayerOutputChainMatchesTheSeparateOpsBitForBit) {
  // rms_norm_mlp_residual with the o projection and the next layer's q/k/v (MlpInputs::o, next_qkv)
  // at 3–64 rows (by default; EXL_CUDA_LAYER_CHAINS=16 on a third backend): o's K-slice sums add into x and
  // stage gate/up's normed input (a norm kernel where o has one slice: 128 inputs), down's sums
  // stage the next q/k/v's, and the next
  // attention_inputs reads that (a staged hand-off, once the backend has seen that op take the
  // tensor-core path). x, q, k, v and every cache byte equal the separate ops' (linear_residual,
  // rms_norm_mlp_residual, attention_inputs) bit for bit; x also the CPU's at fp16 tolerance. A
  // 2,304-wide residual stream spans three blocks of the sums per row (the last one finishing
  // stages the row).
  // Also with every set of one row block run stream-K (its slot sums then stage the next input),
  // and with the chains stopping at 16 rows (33 rows: each op stages its own input, as above 64).
  auto stream_k = backend_with({{"EXL_CUDA_MMA_STREAM_K", "5"}});
  auto short_chains = backend_with({{"EXL_CUDA_LAYER_CHAINS", "16"}});
  for (Backend* b : {gpu_.get(), stream_k.get(), short_chains.get()}) {
    active_ = b;
    SCOPED_TRACE(b == gpu_.get() ? "defaults" : b == stream_k.get() ? "stream-K on 5 blocks" : "chains to 16 rows");
    const int64_t chain_rows = b == short_chains.get() ? 16 : 64;
    constexpr int D = 128, KVH = 2, layer = 0;
    constexpr int64_t I = 384;
    RopeTable table;
    for (int i = 0; i < D / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / float(D)));
    uint32_t seed = 2300;
    for (auto [NH, H] : {std::pair<int, int64_t>{4, 512}, {1, 512}, {2, 2304}}) {
      const int64_t QD = int64_t(NH) * D;
      auto o = test::random_exl2(QD, H, {{4, QD / 2}, {5, QD / 2}}, seed++, true);
      auto gate = test::random_exl2(H, I, {{4, H / 2}, {6, H / 2}}, seed++, true), up = test::random_exl2(H, I, {{4, H}}, seed++);
      up.m.perm = gate.m.perm;
      auto down = test::random_exl2(I, H, {{3, 128}, {4, 256}}, seed++);
      auto wq = test::random_exl2(H, QD, {{4, H}}, seed++), wk = test::random_exl2(H, KVH * D, {{6, H}}, seed++),
           wv = test::random_exl2(H, KVH * D, {{2, H / 2}, {8, H / 2}}, seed++);
      auto po = gpu().prepare_linear(o.m), pg = gpu().prepare_linear(gate.m), pu = gpu().prepare_linear(up.m),
           pd = gpu().prepare_linear(down.m), pq = gpu().prepare_linear(wq.m), pk = gpu().prepare_linear(wk.m),
           pv = gpu().prepare_linear(wv.m);
      const PreparedLinear* qkv[3] = {pq.get(), pk.get(), pv.get()};
      for (int64_t rows : {2, 4, 9, 33}) {
        SCOPED_TRACE("NH=" + std::to_string(NH) + " H=" + std::to_string(H) + " rows=" + std::to_string(rows));
        const KvLayout L{1, KVH, D, 16, KvFormat::fp16};
        std::vector<int32_t> slots(static_cast<size_t>(rows)), pos(slots.size());
        for (int64_t r = 0; r < rows; ++r) slots[size_t(r)] = int32_t((r * 29 + 3) % 48), pos[size_t(r)] = int32_t(r * 13);
        const auto x0 = test::random_floats(size_t(rows * H), seed++, 3.0f), att = test::random_floats(size_t(rows * QD), seed++);
        const auto nw = test::random_floats(size_t(H), seed++, 0.1f), nw_next = test::random_floats(size_t(H), seed++);
        std::vector<float> got_x[3], got_q[3], got_k[3];
        std::vector<std::byte> pools[3];
        // One set of buffers for every run: a freed device buffer makes the backend forget what it
        // learned about the linears (a scratch area that grows too: the second chained run is the
        // one that must read the staged hand-off).
        auto pool = gpu().alloc_kv_pool(L, 3);
        const std::vector<std::byte> zeros(L.page_bytes() * 3);
        Buffer dx = to_gpu(x0), datt = to_gpu(att), dnw = to_gpu(nw), dnn = to_gpu(nw_next),
               dxn = gpu().alloc(x0.size() * 4), dtmp = gpu().alloc(x0.size() * 4), dg = gpu().alloc(size_t(rows * I) * 4),
               du = gpu().alloc(size_t(rows * I) * 4), dq = gpu().alloc(size_t(rows * QD) * 4),
               dk = gpu().alloc(size_t(rows * KVH * D) * 4), dv = gpu().alloc(size_t(rows * KVH * D) * 4);
        for (int run = 0; run < 3; ++run) {
          gpu().upload(cuda_kv_pool_data(*pool), zeros.data(), zeros.size());
          gpu().upload(dx.data(), x0.data(), x0.size() * 4);
          MlpInputs m{pg.get(), pu.get(), pd.get(), dx.f32(), dnw.f32(), dxn.f32(), dg.f32(), du.f32(), dtmp.f32(),
                      rows, H, I, 1e-5f, false};
          const int64_t before = cuda_step_stats(gpu()).handoffs;
          if (run > 0) {
            m.o = po.get(), m.att = datt.f32(), m.next_qkv = qkv, m.next_norm_w = dnn.f32();
          } else {
            gpu().linear_residual(*po, datt.f32(), dx.f32(), dtmp.f32(), rows, false);
          }
          gpu().rms_norm_mlp_residual(m);
          gpu().attention_inputs({qkv, dx.f32(), dnn.f32(), dxn.f32(), dq.f32(), dk.f32(), dv.f32(), rows, H, 1e-5f, NH,
                                  KVH, D, pos, &table, pool.get(), layer, slots});
          if (run == 2 && rows >= cuda_exl2_mma_min_rows) {
            EXPECT_EQ(cuda_step_stats(gpu()).handoffs - before, rows <= chain_rows ? 1 : 0);
          }
          got_x[run] = from_gpu(dx, x0.size()), got_q[run] = from_gpu(dq, size_t(rows * QD)),
          got_k[run] = from_gpu(dk, size_t(rows * KVH * D));
          pools[run] = download_pool(gpu(), *pool);
        }
        for (int run = 1; run < 3; ++run) {
          EXPECT_EQ(got_x[run], got_x[0]) << "run " << run;
          EXPECT_EQ(got_q[run], got_q[0]) << "run " << run;
          EXPECT_EQ(got_k[run], got_k[0]) << "run " << run;
          EXPECT_TRUE(pools[run] == pools[0]) << "run " << run;
        }

        std::vector<float> ref = x0;
        cpu_layer_output(tp_, o.m, att, gate.m, up.m, down.m, nw, ref, rows);
        EXPECT_LT(rel_err(got_x[2], ref), exl2_tol(rows));
      }
    }
  }
  active_ = nullptr;
}

// ---- attention ----------------------------------------------------------------------------------

struct AttnSeqSpec {
  int64_t n_past, n_new;
};

// A CPU pool holding random K/V at `layer` for every sequence of `specs` (pages drawn from a
// shuffled pool), and the batch that reads it: each sequence's n_new rows after its n_past.
struct RandomKv {
  int num_pages = 0;
  std::vector<std::byte> host_pool;
  std::vector<std::vector<int32_t>> tables;
  std::vector<SeqAttn> batch;  // spans into tables
  int64_t rows = 0;
};
RandomKv random_kv(const KvLayout& L, int layer, const std::vector<AttnSeqSpec>& specs, uint32_t& seed) {
  RandomKv r;
  const int page_size = L.page_size, KVH = L.n_kv_heads, D = L.head_dim;
  int64_t pages_needed = 0;
  for (const auto& s : specs) pages_needed += (s.n_past + s.n_new + page_size - 1) / page_size;
  r.num_pages = int(pages_needed) + 3;
  std::vector<int32_t> free_pages(static_cast<size_t>(r.num_pages));
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), std::mt19937(seed));
  r.host_pool.resize(L.page_bytes() * size_t(r.num_pages));
  size_t next = 0;
  for (const auto& s : specs) {
    const int64_t total = s.n_past + s.n_new;
    std::vector<int32_t> table;
    for (int64_t p = 0; p < (total + page_size - 1) / page_size; ++p) table.push_back(free_pages[next++]);
    auto k = test::random_floats(size_t(total * KVH * D), seed++);
    auto v = test::random_floats(size_t(total * KVH * D), seed++);
    std::vector<int32_t> slots;
    for (int64_t p = 0; p < total; ++p) slots.push_back(table[size_t(p / page_size)] * page_size + int32_t(p % page_size));
    cpu::kv_write(L, r.host_pool.data(), layer, k.data(), v.data(), slots);
    r.tables.push_back(std::move(table));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    r.batch.push_back({r.rows, specs[i].n_new, specs[i].n_past, r.tables[i]});
    r.rows += specs[i].n_new;
  }
  return r;
}

// Random K/V for every sequence (random_kv) copied into a GPU pool; GPU attention against the
// CPU's over the same bytes.
void attention_case(Backend& gpu, ThreadPool& tp, KvFormat fmt, int D, int NH, int KVH, int window,
                    const std::vector<AttnSeqSpec>& specs, int page_size, uint32_t seed, double tol = k_tol_f32) {
  const KvLayout L{2, KVH, D, page_size, fmt};
  const int layer = 1;
  const RandomKv kv = random_kv(L, layer, specs, seed);
  const int num_pages = kv.num_pages;
  const std::vector<std::byte>& host_pool = kv.host_pool;
  const std::vector<SeqAttn>& batch = kv.batch;
  const int64_t rows = kv.rows;
  auto q = test::random_floats(size_t(rows * NH * D), seed++);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> ref(q.size());
  cpu::attention(tp, L, host_pool.data(), layer, q.data(), ref.data(), batch, NH, scale, window);

  auto pool = gpu.alloc_kv_pool(L, num_pages);
  gpu.upload(cuda_kv_pool_data(*pool), host_pool.data(), host_pool.size());
  Buffer dq = gpu.alloc(q.size() * 4), dout = gpu.alloc(q.size() * 4);
  gpu.upload(dq.data(), q.data(), q.size() * 4);
  gpu.attention(*pool, layer, dq.f32(), dout.f32(), batch, NH, scale, window);
  std::vector<float> got(q.size());
  gpu.download(got.data(), dout.data(), got.size() * 4);
  EXPECT_LT(rel_err(got, ref), tol) << to_string(fmt) << " D=" << D << " heads " << NH << "/" << KVH
                                          << " window " << window << " page " << page_size;
}

TEST_F(CudaBackendTest, DecodeAttentionStagesTheOutputProjectionsInput) {
  // Decode attention followed by the layer's output op with the o projection (MlpInputs::o) at
  // tensor-core sizes: from the second such pair on, attention stores its output as o's staged
  // input too (AttnArgs::stage; a staged hand-off, no staging kernel for o), written by the decode
  // kernel (short contexts) or by attention_combine (a context over several partitions). x equals
  // what attention, linear_residual and rms_norm_mlp_residual give as separate ops, bit for bit.
  // Also with the streaming decode kernel (which stages up to 512 positions).
  auto stream = backend_with({{"EXL_CUDA_ATTN_DECODE_PART", "512"}});
  for (Backend* b : {gpu_.get(), stream.get()}) {
    active_ = b;
    SCOPED_TRACE(b == gpu_.get() ? "defaults" : "streaming decode kernel");
    constexpr int D = 128, NH = 4, KVH = 2, layer = 0;
    constexpr int64_t H = 256, I = 384, QD = int64_t(NH) * D;
    uint32_t seed = 2500;
    auto o = test::random_exl2(QD, H, {{4, 256}, {6, 256}}, seed++, true);
    auto gate = test::random_exl2(H, I, {{4, 256}}, seed++), up = test::random_exl2(H, I, {{5, 128}, {3, 128}}, seed++);
    up.m.perm = gate.m.perm;
    auto down = test::random_exl2(I, H, {{4, 384}}, seed++);
    auto po = gpu().prepare_linear(o.m), pg = gpu().prepare_linear(gate.m), pu = gpu().prepare_linear(up.m),
         pd = gpu().prepare_linear(down.m);
    for (const auto& specs : std::vector<std::vector<AttnSeqSpec>>{{{30, 1}, {5, 1}, {47, 1}, {12, 1}},
                                                                  {{700, 1}, {3, 1}, {260, 1}, {90, 1}, {0, 1}}}) {
      SCOPED_TRACE("context of sequence 0: " + std::to_string(specs[0].n_past));
      const KvLayout L{1, KVH, D, 16, KvFormat::fp16};
      const RandomKv kv = random_kv(L, layer, specs, seed);
      auto pool = gpu().alloc_kv_pool(L, kv.num_pages);
      gpu().upload(cuda_kv_pool_data(*pool), kv.host_pool.data(), kv.host_pool.size());
      const int64_t rows = kv.rows;
      const auto q = test::random_floats(size_t(rows * QD), seed++), x0 = test::random_floats(size_t(rows * H), seed++);
      const auto nw = test::random_floats(size_t(H), seed++, 0.2f);
      Buffer dq = to_gpu(q), datt = gpu().alloc(q.size() * 4), dnw = to_gpu(nw), dxn = gpu().alloc(x0.size() * 4),
             dtmp = gpu().alloc(x0.size() * 4), dg = gpu().alloc(size_t(rows * I) * 4), du = gpu().alloc(size_t(rows * I) * 4);
      Buffer dx = gpu().alloc(x0.size() * 4);  // one buffer throughout: a free makes the backend forget
      const auto layer_output = [&](bool with_o) {
        gpu().upload(dx.data(), x0.data(), x0.size() * 4);
        gpu().attention(*pool, layer, dq.f32(), datt.f32(), kv.batch, NH, 0.1f, 0);
        MlpInputs m{pg.get(), pu.get(), pd.get(), dx.f32(), dnw.f32(), dxn.f32(), dg.f32(), du.f32(), dtmp.f32(),
                    rows, H, I, 1e-5f, false};
        if (with_o) m.o = po.get(), m.att = datt.f32();
        else gpu().linear_residual(*po, datt.f32(), dx.f32(), dtmp.f32(), rows, false);
        gpu().rms_norm_mlp_residual(m);
        return from_gpu(dx, x0.size());
      };
      const auto separate = layer_output(false);
      for (int round = 0; round < 3; ++round) {
        const int64_t before = cuda_step_stats(gpu()).handoffs;
        EXPECT_EQ(layer_output(true), separate) << "round " << round;
        // The first round teaches attention where o reads (what the backend learned was forgotten
        // when the last case's buffers were freed); the later rounds stage for it.
        EXPECT_EQ(cuda_step_stats(gpu()).handoffs - before, round == 0 ? 0 : 1) << "round " << round;
      }
    }
  }
  active_ = nullptr;
}

TEST_F(CudaBackendTest, AttentionPrefillAndDecodeEveryFormat) {
  // Short contexts (one partition, direct output) and long ones (split over partitions).
  const std::vector<AttnSeqSpec> short_batch = {{0, 21}, {37, 1}, {5, 40}};
  const std::vector<AttnSeqSpec> long_batch = {{700, 1}, {0, 1}, {300, 9}, {1500, 1}};
  uint32_t seed = 300;
  for (KvFormat fmt : {KvFormat::f32, KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (int window : {0, 9, 200}) {
      attention_case(gpu(), tp_, fmt, 64, 6, 2, window, short_batch, 16, seed++);
      attention_case(gpu(), tp_, fmt, 128, 32, 8, window, long_batch, 64, seed++);
      attention_case(gpu(), tp_, fmt, 80, 4, 4, window, long_batch, 16, seed++);
    }
}

TEST_F(CudaBackendTest, AttentionDecodeShortContextsEveryGroup) {
  // Decode rows whose whole context fits one partition (a direct plan: on sm_90 a cluster of
  // blocks per kv head and row whose partials meet in distributed shared memory, with blocks
  // past the context), for every group size the decode kernel serves, each cache format it reads,
  // and windows.
  uint32_t seed = 1700;
  for (KvFormat fmt : {KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (auto [NH, KVH] : std::vector<std::pair<int, int>>{{4, 4}, {8, 4}, {12, 3}, {16, 4}, {16, 2}})
      for (int window : {0, 9})
        attention_case(gpu(), tp_, fmt, 128, NH, KVH, window, {{0, 1}, {37, 1}, {200, 1}, {255, 1}, {31, 1}}, 16,
                       seed++);
}

TEST_F(CudaBackendTest, AttentionHeadDimsAndGroupings) {
  uint32_t seed = 400;
  for (auto [D, NH, KVH] : std::vector<std::tuple<int, int, int>>{
           {8, 8, 4}, {32, 3, 1}, {96, 12, 4}, {256, 8, 1}, {128, 40, 8}, {64, 7, 7}})
    for (KvFormat fmt : {KvFormat::f32, KvFormat::q4}) {
      attention_case(gpu(), tp_, fmt, D, NH, KVH, 0, {{0, 33}, {250, 2}}, 32, seed++);
      attention_case(gpu(), tp_, fmt, D, NH, KVH, 0, {{2000, 1}}, 256, seed++);
    }
}

TEST_F(CudaBackendTest, AttentionDecodeKernelMatchesCpu) {
  // One query token per sequence, fp16/q8/q4 cache, head_dim 128: attention_decode (direct within
  // one partition of k_attn_decode_part positions, partials + combine beyond); f32 caches, groups
  // over 8 and prompts of several tokens stay on the tiled kernel. Again with the streaming
  // kernels that large batches get (direct up to k_attn_decode_part_stream positions, partials
  // beyond): for fp16 caches the tensor-core one, whose split-fp16 operands keep fp32-level
  // precision (fp16 weights alone would be ~1.4e-4 here), and the FMA one it replaces.
  const std::vector<std::vector<AttnSeqSpec>> batches = {
      {{0, 1}}, {{255, 1}}, {{256, 1}, {49, 1}}, {{700, 1}, {0, 1}, {255, 1}, {4100, 1}}, {{50, 1}, {30, 0}, {129, 1}}};
  const std::vector<std::pair<int, int>> heads = {{32, 8}, {8, 8}, {28, 4}, {64, 8}, {16, 1}};
  uint32_t seed = 450;
  const int page_sizes[] = {16, 64, 256};
  for (KvFormat fmt : {KvFormat::fp16, KvFormat::q8, KvFormat::q4, KvFormat::f32})
    for (auto [NH, KVH] : heads)
      for (int window : {0, 9, 200})
        for (const auto& batch : batches) {
          const int page_size = page_sizes[seed % 3];
          attention_case(gpu(), tp_, fmt, 128, NH, KVH, window, batch, page_size, seed++);
        }
  auto stream = backend_with({{"EXL_CUDA_ATTN_DECODE_PART", "512"}});
  for (KvFormat fmt : {KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (auto [NH, KVH] : heads)
      for (int window : {0, 9, 200})
        for (const auto& batch : batches) {
          const int page_size = page_sizes[seed % 3];
          attention_case(*stream, tp_, fmt, 128, NH, KVH, window, batch, page_size, seed++,
                         fmt == KvFormat::fp16 ? 2e-5 : k_tol_f32);
        }
  auto fma = backend_with({{"EXL_CUDA_ATTN_DECODE_PART", "512"}, {"EXL_CUDA_ATTN_DECODE_MMA", "0"}});
  for (auto [NH, KVH] : heads)
    for (int window : {0, 9, 200})
      for (const auto& batch : batches) {
        const int page_size = page_sizes[seed % 3];
        attention_case(*fma, tp_, KvFormat::fp16, 128, NH, KVH, window, batch, page_size, seed++);
      }
}

TEST_F(CudaBackendTest, AttentionFewPositionsPerSequenceMatchCpu) {
  // Verify passes: up to k_attn_decode_max_positions query tokens per sequence take the decode
  // kernel, a row per token; the causal limit of each row is its own position.
  const int M = cuda_attn_decode_max_positions;
  const std::vector<std::vector<AttnSeqSpec>> batches = {
      {{0, 3}}, {{40, M}}, {{254, 4}, {3, 1}}, {{700, 5}, {0, 2}, {30, 0}, {255, 3}}, {{5000, 7}, {17, M}}};
  uint32_t seed = 2100;
  for (KvFormat fmt : {KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (auto [NH, KVH] : std::vector<std::pair<int, int>>{{32, 8}, {6, 2}, {16, 16}})
      for (int window : {0, 9})
        for (const auto& batch : batches) attention_case(gpu(), tp_, fmt, 128, NH, KVH, window, batch, 64, seed++);
  attention_case(gpu(), tp_, KvFormat::fp16, 64, 6, 2, 0, {{100, 5}, {9, 3}}, 16, seed++);
}

TEST_F(CudaBackendTest, AttentionLargePrefillUsesTensorCorePath) {
  // Every sequence served by the long-prompt paths (prefill_attention_serves): fp16 caches with
  // head_dim 64 or 128 on flash_attention.h's kernel, the others through cuBLAS — fp16 queries and
  // probabilities for f32/fp16 caches, split-fp16 operands (fp32-level precision) for q8/q4 caches.
  uint32_t seed = 500;
  for (KvFormat fmt : {KvFormat::f32, KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (int window : {0, 50}) {
      // fp16 rounding of q and P alone would be ~1e-3 here; the split operands stay near fp32.
      const double tol = fmt == KvFormat::q8 || fmt == KvFormat::q4 ? 2e-5 : k_tol_f16;
      attention_case(gpu(), tp_, fmt, 64, 32, 8, window, {{100, 300}, {0, 257}}, 64, seed++, tol);
      attention_case(gpu(), tp_, fmt, 80, 16, 16, window, {{0, 205}, {1000, 65}}, 16, seed++, tol);
      attention_case(gpu(), tp_, fmt, 128, 32, 8, window, {{0, 600}}, 64, seed++, tol);
    }
  // One short sequence keeps the whole batch on the paged kernel (fp32 everywhere).
  attention_case(gpu(), tp_, KvFormat::q8, 64, 8, 2, 50, {{0, 600}, {10, 3}}, 16, seed++);
}

TEST_F(CudaBackendTest, AttentionFlashKernelOnFp16CachesMatchesCpu) {
  // Long prompts on fp16 caches with head_dim 64 or 128 take flash_attention.h's kernel: a suffix
  // on a long cached prefix (a plan split over partitions, merged by attention_combine), several
  // sequences of different lengths, groups of 1 to 8 query heads per kv head, rows that do not
  // fill the last 64-row block, page sizes, windows that start inside a partition or cover it.
  // Whole prompts whose rows fill the device (direct plans) are AttentionLargePrefillUsesTensorCorePath's.
  uint32_t seed = 2600;
  for (int window : {0, 37, 300})
    for (auto [D, NH, KVH] : std::vector<std::tuple<int, int, int>>{{128, 32, 8}, {128, 8, 8}, {64, 12, 2}}) {
      attention_case(gpu(), tp_, KvFormat::fp16, D, NH, KVH, window, {{1000, 64}}, 16, seed++, k_tol_f16);
      attention_case(gpu(), tp_, KvFormat::fp16, D, NH, KVH, window, {{0, 200}, {600, 70}}, 64, seed++, k_tol_f16);
      attention_case(gpu(), tp_, KvFormat::fp16, D, NH, KVH, window, {{2100, 65}}, 256, seed++, k_tol_f16);
    }
}

TEST_F(CudaBackendTest, AttentionRejectsBadPageTables) {
  const KvLayout L{1, 1, 8, 16, KvFormat::f32};
  auto pool = gpu().alloc_kv_pool(L, 2);
  Buffer dq = gpu().alloc(64 * 4);
  const std::vector<int32_t> short_table = {0};
  EXPECT_THROW(gpu().attention(*pool, 0, dq.f32(), dq.f32(), std::vector<SeqAttn>{{0, 1, 16, short_table}}, 1, 1.0f, 0),
               Error);
  const std::vector<int32_t> bad_page = {5};
  EXPECT_THROW(gpu().attention(*pool, 0, dq.f32(), dq.f32(), std::vector<SeqAttn>{{0, 1, 0, bad_page}}, 1, 1.0f, 0),
               Error);
  EXPECT_THROW(gpu().alloc_kv_pool(KvLayout{1, 1, 512, 16, KvFormat::f32}, 1), Error);
}

TEST_F(CudaBackendTest, OpsComposeLikeTheCpuBackend) {
  // norm → linear → swiglu → add, all resident on the device between ops.
  const int64_t rows = 3, dim = 96, hidden = 160;
  auto cpu = make_cpu_backend(2);
  auto gate = test::random_exl2(dim, hidden, {{6, 32}, {4, 64}}, 601);
  auto up = test::random_exl2(dim, hidden, {{5, 96}}, 602);
  auto down = test::random_exl2(hidden, dim, {{4, 128}, {3, 32}}, 603);
  auto x = test::random_floats(size_t(rows * dim), 604);
  auto nw = test::random_floats(size_t(dim), 605);
  auto run = [&](Backend& be) {
    auto pg = be.prepare_linear(gate.m), pu = be.prepare_linear(up.m), pd = be.prepare_linear(down.m);
    Buffer bx = be.alloc(x.size() * 4), bw = be.alloc(nw.size() * 4), bn = be.alloc(x.size() * 4);
    Buffer bg = be.alloc(size_t(rows * hidden) * 4), bu = be.alloc(size_t(rows * hidden) * 4);
    Buffer bo = be.alloc(x.size() * 4);
    be.upload(bx.data(), x.data(), x.size() * 4);
    be.upload(bw.data(), nw.data(), nw.size() * 4);
    be.rms_norm(bx.f32(), bw.f32(), bn.f32(), rows, dim, 1e-6f);
    be.linear(*pg, bn.f32(), bg.f32(), rows);
    be.linear(*pu, bn.f32(), bu.f32(), rows);
    be.swiglu(bg.f32(), bu.f32(), bg.f32(), rows * hidden);
    be.linear(*pd, bg.f32(), bo.f32(), rows);
    be.add(bx.f32(), bo.f32(), rows * dim);
    std::vector<float> out(x.size());
    be.download(out.data(), bx.data(), out.size() * 4);
    return out;
  };
  EXPECT_LT(rel_err(run(gpu()), run(*cpu)), k_tol_f32);
}

// ---- host-side planning (no device needed) ------------------------------------------------------

#ifdef EXL_HAVE_CUDA
TEST(CudaPrefillAttention, TheCublasPathServesLongPromptsOfWideModels) {
  EXPECT_TRUE(cuda::prefill_attention_serves(64, 64, 32, 128));     // llama-7b width, 64 tokens
  EXPECT_TRUE(cuda::prefill_attention_serves(126, 4094, 32, 128));  // a suffix on a long cached prefix
  EXPECT_FALSE(cuda::prefill_attention_serves(63, 4094, 32, 128));  // too few new tokens
  EXPECT_FALSE(cuda::prefill_attention_serves(130, 200, 6, 64));    // demo model: the tiled kernel
  EXPECT_TRUE(cuda::prefill_attention_serves(130, 700, 6, 64));     // ... until the context is long
  EXPECT_TRUE(cuda::prefill_attention_serves(205, 205, 16, 80));    // AttentionLargePrefillUsesTensorCorePath's cases
  EXPECT_TRUE(cuda::prefill_attention_serves(257, 257, 32, 64));
  EXPECT_TRUE(cuda::prefill_attention_serves(8, 205, 16, 80, 8));   // a lower token minimum
}

TEST(CudaAttentionPlan, PartitionsCoverEveryRowsWindow) {
  // For the tiled kernel's 16-row works and flash_attention.h's 64-row ones.
  std::vector<std::vector<int32_t>> tables = {std::vector<int32_t>(40, 0), std::vector<int32_t>(40, 1),
                                              std::vector<int32_t>(40, 2)};
  for (int rows_per_work : {cuda::k_attn_rows, cuda::k_flash_rows})
    for (int window : {0, 100}) {
      const std::vector<SeqAttn> seqs = {{0, 1, 2000, tables[0]}, {1, 70, 900, tables[1]}, {71, 0, 10, tables[2]}};
      const int NH = 8, KVH = 2, group = 4;
      const auto plan = cuda::plan_attention(seqs, NH, KVH, 64, 3, window, 264, cuda::k_attn_min_part, false, 0, 1,
                                             rows_per_work);
      ASSERT_FALSE(plan.direct);
      EXPECT_EQ(plan.part_size % cuda::k_attn_tile, 0);
      EXPECT_GE(plan.part_size, cuda::k_attn_min_part);
      EXPECT_EQ(plan.n_tokens, 71);
      std::vector<int32_t> pos_want = {2000};
      for (int t = 0; t < 70; ++t) pos_want.push_back(900 + t);
      EXPECT_EQ(plan.token_pos, pos_want);
      for (size_t s = 0; s < seqs.size(); ++s)
        for (int h = 0; h < KVH; ++h)
          for (int64_t r = 0; r < seqs[s].n_tokens * group; ++r) {
            const int64_t pos = seqs[s].pos_start + r / group;
            const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
            for (int64_t p = lo / plan.part_size; p <= pos / plan.part_size; ++p) {
              int covered = 0;
              for (const auto& w : plan.works)
                covered += w.seq == int(s) && w.kv_head == h && w.part == p && r >= w.row_begin &&
                           r < w.row_begin + rows_per_work;
              EXPECT_EQ(covered, 1) << "seq " << s << " head " << h << " row " << r << " part " << p << " rows "
                                    << rows_per_work;
            }
          }
      for (const auto& w : plan.works) {
        EXPECT_LT(w.part, plan.max_parts);
        EXPECT_EQ(w.row_begin % rows_per_work, 0);
      }
    }
}

TEST(CudaAttentionPlan, DecodePlansOnlyForOneTokenPerSequence) {
  std::vector<int32_t> table(64, 0);
  const int P = cuda::k_attn_decode_part;
  const std::vector<SeqAttn> decode = {{0, 1, 3 * P + 5, table}, {1, 0, 7, table}, {1, 1, 10, table}};
  auto plan = cuda::plan_attention(decode, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true);
  EXPECT_TRUE(plan.decode);
  EXPECT_TRUE(plan.works.empty());
  EXPECT_EQ(plan.part_size, P);
  EXPECT_EQ(plan.max_parts, 4);
  EXPECT_FALSE(plan.direct);
  EXPECT_EQ(plan.token_pos, (std::vector<int32_t>{3 * P + 5, 10}));
  // A window inside one partition keeps the output direct.
  plan = cuda::plan_attention(decode, 32, 8, 64, 1, 4, 264, cuda::k_attn_min_part, true);
  EXPECT_TRUE(plan.decode && plan.direct);
  plan = cuda::plan_attention(decode, 32, 8, 64, 1, 10, 264, cuda::k_attn_min_part, true);
  EXPECT_TRUE(plan.decode && !plan.direct);
  const std::vector<SeqAttn> short_ctx = {{0, 1, P - 1, table}};
  plan = cuda::plan_attention(short_ctx, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true);
  EXPECT_TRUE(plan.decode && plan.direct);
  EXPECT_EQ(plan.max_parts, 1);
  EXPECT_FALSE(cuda::plan_attention(decode, 32, 8, 64, 1, 0, 264).decode);                              // not asked
  EXPECT_FALSE(cuda::plan_attention(decode, 32, 2, 64, 1, 0, 264, cuda::k_attn_min_part, true).decode);  // group 16
  const std::vector<SeqAttn> verify = {{0, 2, 40, table}};
  EXPECT_FALSE(cuda::plan_attention(verify, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true).decode);
  // Up to decode_max_positions query tokens per sequence: one decode row per token, each at its
  // own position over a copy of its sequence's pages.
  const std::vector<int32_t> table2 = {0, 0, 0};
  const std::vector<SeqAttn> verify2 = {{0, 3, P - 2, table}, {3, 1, 9, table2}, {4, 0, 5, table2}, {4, 2, 60, table2}};
  plan = cuda::plan_attention(verify2, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true, 0, 3);
  EXPECT_TRUE(plan.decode && plan.works.empty());
  EXPECT_FALSE(plan.direct);  // the third row of the first sequence is in its second partition
  ASSERT_EQ(plan.seqs.size(), 7u);
  const std::vector<std::array<int32_t, 3>> rows = {{0, 1, P - 2}, {1, 1, P - 1}, {2, 1, P}, {3, 1, 9}, {4, 0, 5},
                                                    {4, 1, 60}, {5, 1, 61}};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(plan.seqs[i].token_begin, rows[i][0]) << i;
    EXPECT_EQ(plan.seqs[i].n_tokens, rows[i][1]) << i;
    EXPECT_EQ(plan.seqs[i].pos_start, rows[i][2]) << i;
  }
  // Rows of one table share its entries, as many as its longest context needs: `table`'s 5 for
  // position P (64-slot pages), then table2's one for positions 9..61.
  const std::vector<int32_t> offsets = {0, 0, 0, 5, 5, 5, 5};
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(plan.seqs[i].page_offset, offsets[i]) << i;
  EXPECT_EQ(plan.pages.size(), size_t(cuda::k_attn_min_pages));
  EXPECT_EQ(plan.token_pos, (std::vector<int32_t>{P - 2, P - 1, P, 9, 60, 61}));
  EXPECT_FALSE(cuda::plan_attention(verify2, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true, 0, 2).decode);
  // Where the decode kernel does not serve (group over 8 here), the tiled kernel's works are
  // those of the one-row sequences.
  const auto tiled = cuda::plan_attention(verify2, 32, 2, 64, 1, 0, 264, cuda::k_attn_min_part, true, 0, 3);
  EXPECT_FALSE(tiled.decode);
  ASSERT_EQ(tiled.seqs.size(), 7u);
  for (const auto& w : tiled.works) {
    EXPECT_EQ(tiled.seqs[size_t(w.seq)].n_tokens, 1);
    EXPECT_EQ(w.row_begin, 0);
  }
  // The shorter partitions: twice as many, and a context of P - 1 no longer direct.
  const int S = cuda::k_attn_decode_part_short;
  plan = cuda::plan_attention(decode, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true, S);
  EXPECT_TRUE(plan.decode && !plan.direct);
  EXPECT_EQ(plan.part_size, S);
  EXPECT_EQ(plan.max_parts, int(pow2_ceil((3 * P + 6 + S - 1) / S)));  // 7 partitions, bucketed
  EXPECT_FALSE(cuda::plan_attention(short_ctx, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true, S).direct);
  EXPECT_THROW(cuda::plan_attention(decode, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true, 32), Error);
  // The streaming kernel's partitions.
  const int Q = cuda::k_attn_decode_part_stream;
  plan = cuda::plan_attention(decode, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true, Q);
  EXPECT_TRUE(plan.decode && !plan.direct);
  EXPECT_EQ(plan.max_parts, int(pow2_ceil((3 * P + 6 + Q - 1) / Q)));
  // Chosen by the plan: short partitions only for small grids over several long partitions.
  const std::vector<SeqAttn> one = {{0, 1, 600, table}};
  EXPECT_EQ(cuda::plan_attention(one, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true).part_size, S);
  EXPECT_EQ(cuda::plan_attention(short_ctx, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true).part_size, P);
  const std::vector<SeqAttn> long_one = {{0, 1, 4000, table}};
  EXPECT_EQ(cuda::plan_attention(long_one, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true).part_size, P);
  // The streaming kernel once the (kv head, sequence) pairs reach k_attn_decode_stream_from per
  // multiprocessor (264 target blocks: 132 multiprocessors), whatever the context.
  const int64_t pairs = 132 * cuda::k_attn_decode_stream_from;
  for (int64_t ctx : {int64_t(100), int64_t(3000)}) {
    std::vector<SeqAttn> batch(size_t((pairs + 7) / 8), SeqAttn{0, 1, ctx, table});
    for (size_t i = 0; i < batch.size(); ++i) batch[i].token_begin = int64_t(i);
    EXPECT_EQ(cuda::plan_attention(batch, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true).part_size, Q) << ctx;
    batch.pop_back();
    EXPECT_NE(cuda::plan_attention(batch, 32, 8, 64, 1, 0, 264, cuda::k_attn_min_part, true).part_size, Q) << ctx;
  }
}

// What a replayed step's graph depends on (step_graph.h): the grid, the staged arrays' sizes and
// offsets, the partitioning. A verify pass (several positions of one sequence, or of a few) whose
// context grows by a few positions per step keeps one shape per power-of-two bucket of the
// context, not one per partition, and every row still gets each partition it needs exactly once.
struct PlanShape {
  size_t works, pages, seqs, pos;
  int part_size, max_parts;
  bool direct;
  bool operator<(const PlanShape& o) const {
    return std::tie(works, pages, seqs, pos, part_size, max_parts, direct) <
           std::tie(o.works, o.pages, o.seqs, o.pos, o.part_size, o.max_parts, o.direct);
  }
};

TEST(CudaAttentionPlan, VerifyPassShapesChangeOnlyAtContextBuckets) {
  std::vector<int32_t> table_a(16), table_b(16);
  for (int i = 0; i < 16; ++i) table_a[size_t(i)] = 2 * i, table_b[size_t(i)] = 2 * i + 1;
  const int NH = 6, KVH = 2, page = 64, pool_pages = 32;
  for (int window : {0, 4096}) {  // a window that covers the context is no window
    std::set<PlanShape> one, two;
    for (int64_t pos = 33; pos + 8 <= 1000; ++pos) {
      const std::vector<SeqAttn> solo = {{0, 5, pos, table_a}};
      const std::vector<SeqAttn> pair = {{0, 1, pos + 7, table_a}, {1, 4, pos, table_b}};
      for (const auto* seqs : {&solo, &pair}) {
        const auto plan = cuda::plan_attention(*seqs, NH, KVH, page, pool_pages, window, 264);
        ASSERT_FALSE(plan.decode);
        (seqs == &solo ? one : two)
            .insert({plan.works.size(), plan.pages.size(), plan.seqs.size(), plan.token_pos.size(), plan.part_size,
                     plan.max_parts, plan.direct});
        EXPECT_EQ(plan.pages.size() & (plan.pages.size() - 1), 0u) << "a power of two";
        EXPECT_GE(plan.pages.size(), size_t(cuda::k_attn_min_pages));
        for (size_t s = 0; s < seqs->size(); ++s) {
          const SeqAttn& sa = (*seqs)[s];
          const int64_t used = (sa.pos_start + sa.n_tokens + page - 1) / page;
          for (int64_t p = 0; p < used; ++p)
            EXPECT_EQ(plan.pages[size_t(plan.seqs[s].page_offset + p)], sa.page_table[size_t(p)]);
          for (int h = 0; h < KVH; ++h)
            for (int64_t r = 0; r < sa.n_tokens * (NH / KVH); ++r)
              for (int64_t p = 0; p <= (sa.pos_start + r / (NH / KVH)) / plan.part_size; ++p) {
                int covered = 0;
                for (const auto& w : plan.works)
                  covered += w.seq == int(s) && w.kv_head == h && w.part == p && r >= w.row_begin &&
                             r < w.row_begin + cuda::k_attn_rows;
                EXPECT_EQ(covered, 1) << "pos " << pos << " seq " << s << " row " << r << " part " << p;
              }
        }
        for (const auto& w : plan.works) EXPECT_LT(w.part, plan.max_parts);
      }
    }
    // Contexts 38..1000 in partitions of 32: max_parts 2, 4, 8, 16, 32; pages 16.
    EXPECT_LE(one.size(), 5u) << "window " << window;
    EXPECT_LE(two.size(), 5u) << "window " << window;
  }
}

// The same for verify passes on the decode kernel (one row per position): the demo model's
// shape (6 heads over 2 kv heads, 64-slot pages) for 2..16 positions of one sequence over contexts
// up to 2,048 plans one shape per power-of-two bucket of the context and row count, and each row
// still reads its own pages.
TEST(CudaAttentionPlan, DecodeVerifyPassShapesChangeOnlyAtContextBuckets) {
  std::vector<int32_t> table(32);
  for (int i = 0; i < 32; ++i) table[size_t(i)] = 31 - i;
  const int NH = 6, KVH = 2, page = 64;
  for (int64_t n = 2; n <= cuda::k_attn_decode_max_positions; ++n) {
    std::set<PlanShape> shapes;
    for (int64_t pos = 0; pos + n <= 2048; pos += 3) {
      const std::vector<SeqAttn> solo = {{0, n, pos, table}};
      const auto plan = cuda::plan_attention(solo, NH, KVH, page, 32, 0, 264, cuda::k_attn_min_part, true, 0,
                                             cuda::k_attn_decode_max_positions);
      ASSERT_TRUE(plan.decode);
      ASSERT_EQ(plan.seqs.size(), size_t(n));
      shapes.insert({plan.works.size(), plan.pages.size(), plan.seqs.size(), plan.token_pos.size(), plan.part_size,
                     plan.max_parts, plan.direct});
      EXPECT_EQ(plan.max_parts & (plan.max_parts - 1), 0) << "a power of two";
      EXPECT_GE(int64_t(plan.max_parts) * plan.part_size, pos + n);
      for (int64_t t = 0; t < n; ++t) {
        const auto& d = plan.seqs[size_t(t)];
        EXPECT_EQ(d.pos_start, pos + t);
        for (int64_t p = 0; p <= (pos + t) / page; ++p)
          EXPECT_EQ(plan.pages[size_t(d.page_offset + p)], table[size_t(p)]) << "n " << n << " pos " << pos;
      }
    }
    // Buckets ..256 (direct), ..512, ..1024, ..2048; the row count may move the partition size
    // (short partitions while the grid is small) inside a bucket once.
    EXPECT_LE(shapes.size(), 5u) << n << " positions";
  }
}

TEST(CudaAttentionPlan, BigBatchesAreDirectAndBadTablesThrow) {
  std::vector<int32_t> table(64, 0);
  const std::vector<SeqAttn> prefill = {{0, 2048, 0, table}};
  const auto plan = cuda::plan_attention(prefill, 32, 8, 64, 1, 0, 264);
  EXPECT_TRUE(plan.direct);
  EXPECT_EQ(plan.works.size(), size_t(8 * (2048 * 4 / cuda::k_attn_rows)));
  for (const auto& w : plan.works) EXPECT_EQ(w.part, 0);
  EXPECT_GE(plan.part_size, 2048);
  const std::vector<SeqAttn> too_long = {{0, 1, 64 * 64, table}};
  EXPECT_THROW(cuda::plan_attention(too_long, 32, 8, 64, 1, 0, 264), Error);
  const std::vector<SeqAttn> bad_heads = {{0, 1, 0, table}};
  EXPECT_THROW(cuda::plan_attention(bad_heads, 6, 4, 64, 1, 0, 264), Error);
  const std::vector<int32_t> bad_page = {3};
  EXPECT_THROW(cuda::plan_attention(std::vector<SeqAttn>{{0, 1, 0, bad_page}}, 4, 4, 64, 2, 0, 264), Error);
}

TEST(CudaLinearPlan, Exl2SegmentsAreRunsOfWholeBlocks) {
  using G = cuda::Exl2GroupDesc;
  cuda::Exl2Segment s[cuda::k_exl2_max_segments];
  // 8-bit 32-row groups, then 4-bit 128-row groups (the last shorter), then one 3-bit group.
  const std::vector<G> a = {{8, 0, 32, 0},    {8, 32, 32, 8},   {4, 64, 128, 16},
                            {4, 192, 128, 32}, {4, 320, 64, 48}, {3, 384, 128, 56}};
  ASSERT_EQ(cuda::exl2_segments(a.data(), int(a.size()), 512, s), 3);
  EXPECT_EQ(s[0].row_start, 0);
  EXPECT_EQ(s[0].rows, 64);
  EXPECT_EQ(s[0].bits, 8);
  EXPECT_EQ(s[0].group_rows, 32);
  EXPECT_EQ(s[0].block_shift, 0);
  EXPECT_EQ(s[1].block_shift, 2);
  EXPECT_EQ(s[1].row_start, 64);
  EXPECT_EQ(s[1].rows, 320);
  EXPECT_EQ(s[1].qrow_start, 16);
  EXPECT_EQ(s[1].group0, 2);
  EXPECT_EQ(s[1].group_rows, 128);
  EXPECT_EQ(s[2].row_start, 384);
  EXPECT_EQ(s[2].rows, 128);
  EXPECT_EQ(s[2].qrow_start, 56);
  EXPECT_EQ(s[2].group0, 5);
  // A short group in the middle of a run splits it; 16-row groups and gaps are not streamable.
  const std::vector<G> b = {{4, 0, 128, 0}, {4, 128, 64, 16}, {4, 192, 128, 24}};
  ASSERT_EQ(cuda::exl2_segments(b.data(), int(b.size()), 320, s), 2);
  EXPECT_EQ(s[0].rows, 192);
  EXPECT_EQ(s[1].row_start, 192);
  EXPECT_EQ(s[1].group0, 2);
  // 96-row groups: the group of a block is found by division, not a shift.
  const std::vector<G> d = {{4, 0, 96, 0}, {4, 96, 96, 12}};
  ASSERT_EQ(cuda::exl2_segments(d.data(), int(d.size()), 192, s), 1);
  EXPECT_EQ(s[0].group_rows, 96);
  EXPECT_EQ(s[0].block_shift, -1);
  const std::vector<G> c = {{2, 0, 16, 0}, {2, 16, 80, 1}};
  EXPECT_EQ(cuda::exl2_segments(c.data(), int(c.size()), 96, s), 0);
  EXPECT_EQ(cuda::exl2_segments(a.data(), int(a.size()), 640, s), 0);
}

TEST(CudaLinearPlan, StageGatherMapIsTheStageMapSeenFromTheOutput) {
  // A row's staged input as 16-byte units (what whole-row producers store): entry 8u + k % 8 of
  // the gather map names the input feature whose (permuted row, slot) the stage map gives, under
  // the layout's own formula (unit u = 2·(8·chunk + step) + k-half, step = slot / 4, k = 2t +
  // 8·((slot / 2) % 2) + slot % 2 for quad lane t = (row / 32) % 4); every other entry is padding.
  // Widths 2, 4 and 8 pack their fragment slots out of row order, 3, 5 and 6 keep it; K = 352 ends
  // in a partial chunk.
  using G = cuda::Exl2GroupDesc;
  const int K = 352;
  const int widths[] = {2, 3, 4, 5, 6, 8, 4, 2, 8, 3, 6};
  std::vector<G> groups;
  std::vector<int32_t> group_of_row;
  for (int b = 0, q = 0; b < K / 32; ++b) {
    groups.push_back({widths[b], 32 * b, 32, q});
    q += widths[b];
    group_of_row.insert(group_of_row.end(), 32, b);
  }
  std::vector<int32_t> perm(K);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(2207);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> at(K), from(size_t(cuda::exl2_mma_stage_gather_entries(K)), -7);
  ASSERT_EQ(from.size(), 384u);
  cuda::exl2_mma_stage_map(groups.data(), group_of_row.data(), perm.data(), K, at.data());
  cuda::exl2_mma_stage_gather_map(groups.data(), group_of_row.data(), perm.data(), K, from.data());
  std::vector<int> named(from.size(), 0);
  for (int n = 0; n < K; ++n) {
    const int j = at[size_t(n)] >> 5, p = at[size_t(n)] & 31, t = (j >> 5) & 3;
    const int k = 2 * t + 8 * ((p >> 1) & 1) + (p & 1), u = 2 * (8 * (j >> 7) + (p >> 2)) + (k >> 3);
    const size_t e = size_t(8 * u + (k & 7));
    ASSERT_LT(e, from.size());
    EXPECT_EQ(from[e], n) << "feature " << n;
    ++named[e];
  }
  for (size_t e = 0; e < from.size(); ++e) {
    if (!named[e]) {
      EXPECT_EQ(from[e], -1) << "entry " << e;
    }
  }
  // The padding is the partial chunk's last 32 rows: 32 entries, in the last chunk's units.
  EXPECT_EQ(std::count(from.begin(), from.end(), -1), 32);
  EXPECT_EQ(std::count(from.begin(), from.begin() + 256, -1), 0);
}

TEST(CudaLinearPlan, Exl2BlocksNameEachBlocksWordsWidthAndGroup) {
  using G = cuda::Exl2GroupDesc;
  // Runs of 32- and 128-row groups, a shorter 4-bit group, 96-row groups, one 3-bit group.
  const std::vector<G> a = {{8, 0, 32, 0},     {8, 32, 32, 8},    {4, 64, 128, 16}, {4, 192, 64, 32},
                            {4, 256, 96, 40},  {4, 352, 96, 52},  {3, 448, 128, 64}};
  const int K = 576;
  std::vector<cuda::Exl2Block> b(K / 32, cuda::Exl2Block{-1, -1});
  cuda::exl2_blocks(a.data(), int(a.size()), b.data());
  for (int kb = 0; kb < K / 32; ++kb) {
    const int row = 32 * kb;
    int g = 0;
    while (!(row >= a[size_t(g)].row_start && row < a[size_t(g)].row_start + a[size_t(g)].rows)) ++g;
    const G& gd = a[size_t(g)];
    // The block's first value sits at bit (row − row_start)·bits of the group's stream: a whole word.
    EXPECT_EQ(b[size_t(kb)].qrow, gd.qrow_start + (row - gd.row_start) * gd.bits / 32) << "block " << kb;
    EXPECT_EQ(b[size_t(kb)].meta & 15, gd.bits) << "block " << kb;
    EXPECT_EQ(b[size_t(kb)].meta >> 4, g) << "block " << kb;
  }
}

TEST(CudaLinearPlan, TensorCoreBlocksFitTheMultiprocessorsSharedMemory) {
  constexpr size_t h100 = 233472;  // shared memory per multiprocessor of sm_90
  const cuda::Exl2MmaForm mma_sync{}, wgmma{false, true};
  for (const cuda::Exl2MmaForm& f : {mma_sync, wgmma})
    for (int rows : {3, 8, 16, 20, 32, 64, 200})
      for (int wrows = 2; wrows <= 8; ++wrows) {
        const int n = cuda::exl2_mma_resident_blocks(rows, wrows, f, h100);
        EXPECT_GE(n, 1);
        EXPECT_LE(n, cuda::exl2_mma_blocks_per_sm(rows));
        EXPECT_LE(size_t(n) * (cuda::exl2_mma_smem_bytes(rows, wrows, f) + 1024), h100) << rows << " " << wrows;
        if (wrows > 2) {
          EXPECT_LE(cuda::exl2_mma_smem_bytes(rows, wrows, f), cuda::exl2_mma_smem_bytes(rows, wrows - 1, f) + 8192);
        }
      }
  // An 8-row block of 8-bit words: 2 stages · 128 lanes · (8 · 16 + 12) bytes of ring and 2 · 2 KiB
  // of activations, 39,936 bytes. 64-row wgmma blocks of 4-bit words hold 3 · 64 · 256 + 2 · 128 ·
  // (64 + 12) bytes, 68,608: three fit, as the registers allow.
  EXPECT_EQ(cuda::exl2_mma_smem_bytes(8, 8, mma_sync), 39936u);
  EXPECT_EQ(cuda::exl2_mma_smem_bytes(64, 4, wgmma), 68608u);
  EXPECT_EQ(cuda::exl2_mma_resident_blocks(64, 4, wgmma, h100), 3);
  EXPECT_EQ(cuda::exl2_mma_resident_blocks(64, 4, {false, true, true}, h100), 3);
  EXPECT_EQ(cuda::exl2_mma_resident_blocks(64, 8, {false, true, true}, h100), 2);
}

TEST(CudaLinearPlan, StreamKSharesUnitsEquallyAndRunsWhereSlicesUnderfill) {
  // Block p of P holds units [⌊pU/P⌋, ⌊(p + 1)U/P⌋): every unit in exactly one block, shares
  // differing by at most one, and a tile's slots are the blocks that hold its units.
  for (auto [tiles, chunks, P] : {std::tuple{224, 32, 396}, {7, 9, 11}, {3, 5, 15}, {48, 32, 396}, {1, 1, 1}}) {
    const int64_t U = int64_t(tiles) * chunks;
    std::vector<int> holder(size_t(U), -1);
    int64_t least = U, most = 0;
    for (int p = 0; p < P; ++p) {
      const int64_t b = int64_t(p) * U / P, e = int64_t(p + 1) * U / P;
      least = std::min(least, e - b), most = std::max(most, e - b);
      for (int64_t u = b; u < e; ++u) holder[size_t(u)] = p;
    }
    EXPECT_LE(most - least, 1);
    int widest = 0;
    for (int t = 0; t < tiles; ++t) {
      std::set<int> blocks;
      for (int c = 0; c < chunks; ++c) {
        const int64_t u = int64_t(t) * chunks + c;
        ASSERT_GE(holder[size_t(u)], 0);
        EXPECT_EQ(cuda::exl2_mma_stream_block(u, U, P), holder[size_t(u)]) << u;
        blocks.insert(holder[size_t(u)]);
      }
      EXPECT_EQ(cuda::exl2_mma_stream_tile_slots(t, chunks, U, P), int(blocks.size())) << t;
      widest = std::max(widest, int(blocks.size()));
    }
    EXPECT_EQ(cuda::exl2_mma_stream_slots(tiles, chunks, P), widest);
  }
  // llama3-8b at 64 rows on 132 multiprocessors of 3 blocks: gate/up's 224 tiles of one K-slice
  // fill 224 of 396 places, so it runs stream-K on 396 blocks (18 or 19 chunks each, 3 slots at
  // most); q/k/v (48 tiles, 8 slices: 384) and down (32 tiles, K 14,336: 12 slices) stay K-sliced.
  const int target = 396;
  const auto blocks = [&](int64_t K, int64_t N, int64_t rows, int mode) {
    const int ks = cuda::exl2_mma_k_slice(K, N, rows, target);
    return cuda::exl2_mma_stream_blocks(K, (N + 127) / 128, rows, ks, target, mode);
  };
  EXPECT_EQ(blocks(4096, 2 * 14336, 64, 1), 396);
  EXPECT_EQ(cuda::exl2_mma_stream_slots(224, 32, 396), 3);
  EXPECT_EQ(blocks(4096, 6144, 64, 1), 0);
  EXPECT_EQ(blocks(14336, 4096, 64, 1), 0);
  EXPECT_EQ(blocks(4096, 2 * 14336, 64, 0), 0);    // off
  EXPECT_EQ(blocks(4096, 2 * 14336, 65, 1), 0);    // two row blocks
  EXPECT_EQ(blocks(4096, 2 * 14336, 64, 1000), 1000);
  EXPECT_EQ(blocks(256, 256, 8, 1000), 4);          // forced: no more blocks than units
  EXPECT_EQ(blocks(256, 2 * 14336, 64, 1), 0);      // 448 units: under two a block
}

TEST(CudaLinearPlan, GemvKSlicesAreAlignedAndBounded) {
  for (int64_t K : {32, 96, 1000, 4096, 14336})
    for (int64_t N : {8, 512, 4096, 128256})
      for (int64_t rows : {1, 4, 16}) {
        const int ks = cuda::gemv_k_slice(K, N, rows, 528);
        EXPECT_EQ(ks % 32, 0);
        EXPECT_GE(ks, std::min<int64_t>(64, (K + 31) / 32 * 32));
        EXPECT_LE(ks, 1024);
        const int ke = cuda::exl2_gemv_k_slice(K, N, rows, 1056);
        EXPECT_EQ(ke % 32, 0);
        if (K >= 128) {
          EXPECT_EQ(ke % 128, 0) << K;
        }
        EXPECT_GE(ke, std::min<int64_t>(128, (K + 31) / 32 * 32));
        EXPECT_LE(ke, 1024);
      }
}
#endif

}  // namespace cuda_backend_test
}  // namespace exl
