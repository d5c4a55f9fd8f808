// The converter's --backend: the CUDA path end to end on a small model against the same job on
// the CPU, Hessians of rows in device memory, and bad backend names. The GPU test skips without a CUDA device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "engine/quantize/quantize_model.h"
#include "engine/rope.h"
#include "kernels/cuda_backend.h"
#include "kernels/gptq_device.h"
#include "cuda_test_support.h"

namespace exl {
namespace quantize_backend_test {

using ::testing::HasSubstr;

// The converter on the GPU: a small model converted with --backend cuda reports it, stays under
// the target and lands near the CPU run's weight error (the self-generated calibration text and
// the block errors differ at fp32/fp16 rounding level, so layouts and codes may too).
TEST(QuantizeModelCuda, ConvertsOnTheGpuNearTheCpuRun) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = test::shared_dir() / "data/exl2-ref/qwen2-bias/hf";
  const auto tmp = test::temp_dir("quantize-cuda");
  QuantizeOptions o;
  o.threads = 2;
  o.rope_table = [](const ModelConfig& c) { return make_rope_table(c.rope, int(c.head_dim), c.max_position_embeddings); };
  o.cal_rows = 8;
  o.cal_length = 128;
  o.backend = "cpu";
  const QuantizeReport cpu = quantize_model(hf, tmp / "cpu", o);
  o.backend = "cuda";
  const QuantizeReport gpu = quantize_model(hf, tmp / "cuda", o);
  EXPECT_EQ(cpu.backend, "cpu");
  EXPECT_EQ(gpu.backend, "cuda");
  EXPECT_LE(gpu.layers_bpw, 4.0);
  EXPECT_GT(gpu.layers_bpw, 3.8);
  ASSERT_EQ(gpu.layers.size(), cpu.layers.size());
  EXPECT_NEAR(gpu.mean_rel_error / cpu.mean_rel_error, 1.0, 0.25);
  for (const auto& b : gpu.blocks) EXPECT_LT(b.output_error, 0.05) << b.name;
  EXPECT_TRUE(std::filesystem::exists(tmp / "cuda" / "output.safetensors"));
}

// Rows a CUDA backend already holds (the converter's activations, never copied to the host) give
// the Hessian that the same rows from the host give: the same chunks, the same arithmetic.
TEST(GptqDeviceResident, RowsInDeviceMemoryGiveTheHostRowsHessian) {
  EXL_REQUIRE_CUDA();
  const int64_t rows = 4500, K = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * K));
  for (auto& v : x) v = nd(rng);
  auto be = make_cuda_backend(0);
  Buffer resident = be->alloc(x.size() * sizeof(float));
  be->upload(resident.data(), x.data(), x.size() * sizeof(float));
  be->synchronize();
  auto dev = make_cuda_gptq_device(0);
  auto from_host = dev->make_hessian(K), from_device = dev->make_hessian(K);
  dev->accumulate(*from_host, x.data(), rows);
  dev->accumulate_resident(*from_device, resident.f32(), rows);
  EXPECT_EQ(from_device->rows, rows);
  const std::vector<double> want = dev->diag(*from_host), got = dev->diag(*from_device);
  EXPECT_EQ(got, want);
  double sum = 0;
  for (int64_t t = 0; t < rows; ++t) sum += 2.0 * double(x[size_t(t * K + 3)]) * x[size_t(t * K + 3)];
  EXPECT_NEAR(got[3], sum, 1e-4 * sum);
}

TEST(QuantizeModelBackend, UnknownNamesAndCudaWithoutADeviceAreErrors) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = test::shared_dir() / "data/exl2-ref/qwen2-bias/hf";
  const auto tmp = test::temp_dir("quantize-backend");
  QuantizeOptions o;
  o.rope_table = [](const ModelConfig& c) { return make_rope_table(c.rope, int(c.head_dim), c.max_position_embeddings); };
  o.backend = "gpu";
  EXPECT_THAT([&] { quantize_model(hf, tmp / "q", o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("--backend must be cpu, cuda or auto, got 'gpu'")));
  if (cuda_device_count() == 0) {
    o.backend = "cuda";
    EXPECT_THAT([&] { quantize_model(hf, tmp / "q", o); }, ::testing::ThrowsMessage<Error>(HasSubstr("--backend cuda")));
    EXPECT_THROW(make_cuda_gptq_device(0), Error);
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "q"));
  EXPECT_FALSE(std::filesystem::exists(tmp / ".q.partial"));
}

}  // namespace quantize_backend_test
}  // namespace exl
