// The converter's --backend: the CUDA path end to end on a small model against the same job on
// the CPU, and bad backend names. The GPU test skips without a CUDA device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/quantize/quantize_model.h"
#include "engine/rope.h"
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
