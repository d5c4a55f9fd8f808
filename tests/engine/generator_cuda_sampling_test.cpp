// The generator sampling on the CUDA device (Backend::sample_rows) on stories260K: greedy text
// identical to the llama2.c reference; seeded sampling with top_k, top_p, min_p and penalties
// identical to host sampling of the same GPU logits and to the CPU backend's run with the same
// seed. Skips without a CUDA device. Filter: CudaGeneratorSampling.*
#include <gtest/gtest.h>

#include "engine/generate/generator.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "cuda_test_support.h"
#include "test_support.h"

namespace exl {
namespace generator_cuda_sampling_test {

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

// Three seeded jobs, one with a stop token, one submitted while the others decode: pipelined
// decoding (GeneratorOptions::pipelined) gives every job the tokens and finish reasons of
// step-by-step decoding.
struct JobRun {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::error;
};
std::vector<JobRun> three_jobs(Model& m, const Tokenizer& tok, bool pipelined, int32_t stop_token) {
  GeneratorOptions o;
  o.cache_format = KvFormat::fp16;
  o.page_size = 16;
  o.pipelined = pipelined;
  Generator g(m, tok, o);
  std::vector<JobRun> runs(3);
  auto job = [&](int i, std::vector<int32_t> prompt, int max_new, uint64_t seed) {
    GenerationJob j;
    j.prompt = std::move(prompt);
    j.sampling.temperature = 0.9f, j.sampling.top_k = 30, j.sampling.seed = seed;
    j.sampling.repetition_penalty = 1.05f;
    j.max_new_tokens = max_new;
    if (i == 1) j.stop_tokens = {stop_token};
    j.on_event = [&, i](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::token) {
        runs[size_t(i)].tokens.push_back(e.token);
        if (i == 0 && runs[0].tokens.size() == 5) {  // the third job arrives mid-run
          GenerationJob late;
          late.prompt = {1, 320, 471};
          late.sampling.temperature = 0.7f, late.sampling.seed = 99;
          late.max_new_tokens = 30;
          late.on_event = [&](const GenerationEvent& e2) {
            if (e2.type == GenerationEvent::Type::token) runs[2].tokens.push_back(e2.token);
            else runs[2].reason = e2.reason;
          };
          g.submit(std::move(late));
        }
      } else {
        runs[size_t(i)].reason = e.reason;
      }
    };
    g.submit(std::move(j));
  };
  job(0, {1}, 60, 11);
  job(1, {1, 403, 271}, 80, 12);
  g.run_until_idle();
  return runs;
}

TEST(CudaGeneratorSampling, PipelinedDecodingMatchesStepByStep) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("models/stories260K-hf/config.json");
  test::CudaStories st;
  Model& m = st.model;
  // The stop token: job 1's 20th token when it runs without one.
  const auto free_run = three_jobs(m, *st.tok, false, -5);
  ASSERT_GE(free_run[1].tokens.size(), 20u);
  const int32_t stop = free_run[1].tokens[19];
  const auto plain = three_jobs(m, *st.tok, false, stop);
  const auto piped = three_jobs(m, *st.tok, true, stop);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(piped[size_t(i)].tokens, plain[size_t(i)].tokens) << "job " << i;
    EXPECT_EQ(piped[size_t(i)].reason, plain[size_t(i)].reason) << "job " << i;
  }
  EXPECT_EQ(plain[0].tokens.size(), 60u);
  EXPECT_EQ(plain[1].reason, FinishReason::stop_token);
  EXPECT_LE(plain[1].tokens.size(), 20u);
  EXPECT_EQ(plain[2].tokens.size(), 30u);
}

}  // namespace generator_cuda_sampling_test
}  // namespace exl
