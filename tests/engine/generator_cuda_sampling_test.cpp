// The generator sampling on the CUDA device (Backend::sample_rows) on stories260K: greedy text
// identical to the llama2.c reference; seeded sampling with top_k, top_p, min_p and penalties
// identical to host sampling of the same GPU logits and to the CPU backend's run with the same
// seed. Skips without a CUDA device. Filter: CudaGeneratorSampling.*
#include <gtest/gtest.h>

#include "engine/generator.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "test_support.h"

namespace exl {
namespace {

#define EXL_REQUIRE_CUDA() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_device_description()

std::vector<int32_t> generate(Backend& be, KvFormat fmt, const SamplerSettings& s, int n, bool device) {
  ModelDir dir(test::shared_dir() / "models/stories260K-hf");
  auto tok = load_tokenizer(dir.path());
  Model m(dir, be);
  GeneratorOptions o;
  o.cache_format = fmt;
  o.device_sampling = device;
  Generator g(m, *tok, o);
  std::vector<int32_t> tokens;
  GenerationJob j;
  j.prompt = {1};
  j.sampling = s;
  j.max_new_tokens = n;
  j.on_event = [&](const GenerationEvent& e) {
    if (e.type == GenerationEvent::Type::token) tokens.push_back(e.token);
    else EXPECT_NE(e.reason, FinishReason::error) << e.error;
  };
  g.submit(std::move(j));
  g.run_until_idle();
  return tokens;
}

TEST(CudaGeneratorSampling, GreedyAndSeededRunsMatchTheHost) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("models/stories260K/reference/expected_greedy_200.txt");
  // Greedy 200 tokens through the device sampler equal to the reference text: CudaStories
  // (model_cuda_test.cpp), whose generator samples on the device.
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(2);
  SamplerSettings s;
  s.temperature = 0.8f, s.top_k = 40, s.top_p = 0.9f, s.min_p = 0.02f, s.repetition_penalty = 1.1f;
  s.frequency_penalty = 0.1f, s.seed = 4242;
  const auto device = generate(*gpu, KvFormat::f32, s, 200, true);
  EXPECT_EQ(device.size(), 200u);
  EXPECT_EQ(device, generate(*gpu, KvFormat::f32, s, 200, false)) << "device vs host sampling, same GPU logits";
  EXPECT_EQ(device, generate(*cpu, KvFormat::f32, s, 200, true)) << "CUDA vs CPU backend";
  SamplerSettings plain;
  plain.seed = 7;
  EXPECT_EQ(generate(*gpu, KvFormat::f32, plain, 200, true), generate(*cpu, KvFormat::f32, plain, 200, true));
}

}  // namespace
}  // namespace exl
