// A model split by layers over two CUDA backends (devices 0 and 1, or two backends of device 0
// on a one-GPU machine) computes what one CUDA backend computes: prefill, decode steps (each part
// replayed as its own CUDA graph) and chunked prefill, and greedy generation on device-sampled
// tokens. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cuda_test_support.h"
#include "engine/generate/generator.h"
#include "engine/model.h"
#include "generation_harness.h"
#include "model_logits.h"
#include "test_support.h"

namespace exl {
namespace model_split_cuda_test {

std::vector<int32_t> greedy_tokens(Model& m, const Tokenizer& tok, const std::vector<int32_t>& prompt) {
  GeneratorOptions o;
  o.page_size = 16;
  o.num_pages = 16;
  Generator g(m, tok, o);
  test::GenerationRecord r;
  GenerationJob j;
  j.prompt = prompt;
  j.sampling.temperature = 0;
  j.max_new_tokens = 24;
  j.on_event = test::record_events(&r);
  g.submit(std::move(j));
  g.run_until_idle();
  EXPECT_TRUE(r.done) << r.error;
  return r.tokens;
}

TEST(ModelSplitCuda, TwoBackendsComputeWhatOneComputes) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  ModelDir dir(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  auto tok = load_tokenizer(dir.path());
  auto one = make_cuda_backend(0);
  Model single(dir, *one);
  auto a = make_cuda_backend(0);
  auto b = make_cuda_backend(cuda_device_count() > 1 ? 1 : 0);
  const ModelPart parts[2] = {{a.get(), 0, 2}, {b.get(), 2, 3}};
  Model split(dir, parts);
  std::vector<int32_t> ids{1};
  for (int i = 1; i < 48; ++i) ids.push_back(int32_t(3 + (i * 37) % 500));
  for (int64_t chunk : {0, 1, 7})
    EXPECT_LE(test::rel_err(test::run_chunked(split, ids, chunk), test::run_chunked(single, ids, chunk)), 1e-5)
        << "chunk " << chunk;
  EXPECT_GT(cuda_step_stats(*b).graph_launches, 0);  // the second part's decode steps replayed as graphs
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 20);
  EXPECT_EQ(greedy_tokens(split, *tok, prompt), greedy_tokens(single, *tok, prompt));
}

}  // namespace model_split_cuda_test
}  // namespace exl
