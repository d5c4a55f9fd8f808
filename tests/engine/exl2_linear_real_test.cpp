// The CPU backend's on-the-fly EXL2 linear against dequantize-then-multiply, for every quantized
// tensor of the real converter outputs in ../shared/data/exl2-ref.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/formats/linear_loader.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/ops.h"
#include "test_support.h"

namespace exl {
namespace exl2_linear_real_test {

TEST(Exl2LinearReal, OnTheFlyMatchesDequantizedMatmul) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  ThreadPool tp(2);
  for (const char* name : {"llama-gqa", "qwen2-bias", "llama3-rope"}) {
    ModelDir dir(test::shared_dir() / "data/exl2-ref" / name / "exl2-4.0bpw");
    std::vector<LinearSpec> specs;
    for (int64_t l = 0; l < dir.config().num_layers; ++l)
      for (auto& s : decoder_layer_linears(dir.config(), l)) specs.push_back(s);
    specs.push_back(head_linear(dir.config()));
    for (const auto& s : specs) {
      auto w = load_linear(dir, s.name, s.in_features, s.out_features);
      const int64_t K = s.in_features, N = s.out_features, rows = 3;
      std::vector<float> W(size_t(N * K));
      dequantize(w, W);
      std::vector<float> x(size_t(rows * K));
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) + 0.1f;
      std::vector<float> y(size_t(rows * N));
      cpu::linear(tp, w, x.data(), y.data(), rows);
      const auto& bias = std::get<Exl2Matrix>(w).bias;
      double err = 0, scale = 0;
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t n = 0; n < N; ++n) {
          double ref = bias.empty() ? 0.0 : bias[size_t(n)];
          for (int64_t k = 0; k < K; ++k) ref += double(W[size_t(n * K + k)]) * x[size_t(t * K + k)];
          err = std::max(err, std::fabs(ref - y[size_t(t * N + n)]));
          scale = std::max(scale, std::fabs(ref));
        }
      EXPECT_LT(err / scale, 1e-5) << name << " " << s.name;
    }
  }
}

}  // namespace exl2_linear_real_test
}  // namespace exl
