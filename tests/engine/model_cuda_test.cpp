// The whole model on the CUDA backend against the CPU backend (same cache format): logits within
// 1e-2 relative L2 and ≥ 98% argmax agreement in prefill, decode, chunked and prefix-cached runs,
// for every cache format; stories260K's greedy text identical. Skips without a CUDA device.
// With q8/q4 caches, prefill runs its linears exact (Backend::linears_exact: split-fp16 GEMMs) and
// attention on the fp32 paged kernel: fp16 tensor-core rounding anywhere upstream of a layer's K/V
// (~1e-3) moved values across the caches' rounding steps, reaching 3.8e-2 / 92.7% argmax (q4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "engine/generate/generator.h"
#include "engine/generate/speculation.h"
#include "engine/model.h"
#include "engine/generate/page_cache.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "cuda_test_support.h"
#include "speculation_identity.h"
#include "test_support.h"

namespace exl {
namespace model_cuda_test {

// mode: 0 prefill, 1 decode, 7 chunked; prefix: first 64 tokens from the page cache.
std::vector<float> run(Model& m, Backend& be, const std::vector<int32_t>& ids, int64_t chunk, bool prefix,
                       KvFormat fmt) {
  CacheConfig cc{int(m.config().num_layers), int(m.config().num_kv_heads), int(m.config().head_dim), 16, 16, fmt, 1};
  PageCache cache(cc);
  auto pool = be.alloc_kv_pool(m.kv_layout(fmt, 16), 16);
  std::vector<float> out;
  int64_t start = 0;
  if (prefix) {
    const SeqId a = cache.create_sequence();
    std::vector<int32_t> first(ids.begin(), ids.begin() + 64);
    EXPECT_TRUE(cache.reserve(a, 64));
    ForwardSeq s{first, 0, cache.page_table(a), true};
    out = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
    cache.append_tokens(a, first);
    cache.release(a);
  }
  const SeqId b = cache.create_sequence();
  if (prefix) start = cache.match_prefix(b, ids);
  EXPECT_EQ(start, prefix ? 64 : 0);
  EXPECT_TRUE(cache.reserve(b, int(ids.size())));
  out.resize(size_t(start * m.vocab_size()));
  if (chunk <= 0) chunk = int64_t(ids.size());
  for (int64_t p = start; p < int64_t(ids.size()); p += chunk) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(ids.size()) - p);
    ForwardSeq s{std::span<const int32_t>(ids).subspan(size_t(p), size_t(n)), p, cache.page_table(b), true};
    auto l = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

class CudaModels : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModels, GpuMatchesCpuInEveryModeAndCacheFormat) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  auto ids = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"))["input_ids"]
                 .get<std::vector<int32_t>>();
  ModelDir dir(test::shared_dir() / "data/exl2-ref" / GetParam());
  auto cpu = make_cpu_backend(0);
  auto gpu = make_cuda_backend(0);
  Model mc(dir, *cpu), mg(dir, *gpu);
  for (KvFormat fmt : {KvFormat::fp16, KvFormat::q8, KvFormat::q4, KvFormat::f32})
    for (auto [chunk, prefix] : std::vector<std::pair<int64_t, bool>>{{0, false}, {1, false}, {7, false}, {0, true}}) {
      auto a = run(mg, *gpu, ids, chunk, prefix, fmt);
      auto b = run(mc, *cpu, ids, chunk, prefix, fmt);
      const double e = test::rel_l2(a, b), agr = test::argmax_agreement(a, b, mc.vocab_size());
      std::cout << GetParam() << " " << to_string(fmt) << " chunk " << chunk << (prefix ? " prefix" : "")
                << ": rel_l2 " << e << " argmax " << agr << "\n";
      EXPECT_LT(e, 1e-2) << to_string(fmt) << " chunk " << chunk << " prefix " << prefix;
      EXPECT_GE(agr, 0.98) << to_string(fmt) << " chunk " << chunk << " prefix " << prefix;
    }
  // The decode steps (chunk 1) of the EXL2 models ran with act-order hand-offs between ops
  // (cuda/handoff.h); dense models have no permutation to hand off.
  const int64_t handoffs = cuda_step_stats(*gpu).handoffs;
  std::cout << GetParam() << ": " << handoffs << " hand-offs\n";
  if (GetParam().find("exl2") != std::string::npos) EXPECT_GT(handoffs, 0);
  else EXPECT_EQ(handoffs, 0);
}

INSTANTIATE_TEST_SUITE_P(ExlRef, CudaModels,
                         ::testing::Values("llama-gqa/exl2-4.0bpw", "qwen2-bias/exl2-4.0bpw", "llama3-rope/exl2-4.0bpw",
                                           "llama-gqa/hf", "qwen2-bias/hf", "llama3-rope/hf"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(CudaStories, GreedyTextIdenticalToCpu) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("models/stories260K/reference/expected_greedy_200.txt");
  test::CudaStories st;
  Model& m = st.model;
  ASSERT_TRUE(m.can_sample_on_device());  // the generator below samples on the GPU
  GeneratorOptions o;
  o.cache_format = KvFormat::fp16;
  Generator g(m, *st.tok, o);
  std::string text;
  GenerationJob j;
  j.prompt = {1};
  j.sampling.temperature = 0;
  j.max_new_tokens = 200;
  j.on_event = [&](const GenerationEvent& e) { text += e.text; };
  g.submit(std::move(j));
  g.run_until_idle();
  EXPECT_EQ(text, test::read_file(test::shared_dir() / "models/stories260K/reference/expected_greedy_200.txt"));
}

// Greedy decode of two sequences with a page table each: every step sampled and read before
// the next (sample_device), or pipelined (forward_device_fed reads the deferred sampling's ids
// on the device). Returns the tokens of each sequence.
std::vector<std::vector<int32_t>> greedy_pair(Model& m, Backend& be, bool pipelined, int steps) {
  const std::vector<std::vector<int32_t>> prompts = {{1}, {1, 400, 300, 90, 17}};
  const int page = 16, pages = 20;
  auto pool = be.alloc_kv_pool(m.kv_layout(KvFormat::fp16, page), 2 * pages);
  std::vector<std::vector<int32_t>> tables(2), out(2);
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < pages; ++i) tables[size_t(s)].push_back(s * pages + i);
  std::vector<RowSampling> greedy(2);
  for (int s = 0; s < 2; ++s) greedy[size_t(s)].row = s, greedy[size_t(s)].temperature = 0.0f;
  std::vector<ForwardSeq> batch;
  for (int s = 0; s < 2; ++s) batch.push_back({prompts[size_t(s)], 0, tables[size_t(s)], false});
  m.forward_device(batch, *pool);
  std::vector<int32_t> ids(2);
  if (pipelined) EXPECT_TRUE(m.sample_device_deferred(greedy));
  else EXPECT_TRUE(m.sample_device(greedy, ids));
  for (int st = 0; st < steps; ++st) {
    std::vector<int32_t> placeholder = {-7, -7};
    batch.clear();
    for (int s = 0; s < 2; ++s)
      batch.push_back({std::span<const int32_t>(pipelined ? placeholder : ids).subspan(size_t(s), 1),
                       int64_t(prompts[size_t(s)].size()) + st, tables[size_t(s)], false});
    if (pipelined) {
      m.forward_device_fed(batch, *pool);
      m.collect_samples(ids);
      for (int s = 0; s < 2; ++s) out[size_t(s)].push_back(ids[size_t(s)]);
      EXPECT_TRUE(m.sample_device_deferred(greedy));
    } else {
      for (int s = 0; s < 2; ++s) out[size_t(s)].push_back(ids[size_t(s)]);
      m.forward_device(batch, *pool);
      EXPECT_TRUE(m.sample_device(greedy, ids));
    }
  }
  if (pipelined) m.collect_samples(ids);
  for (int s = 0; s < 2; ++s) out[size_t(s)].push_back(ids[size_t(s)]);
  return out;
}

TEST(CudaStories, PipelinedDecodeMatchesStepByStepAndTheGenerator) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("models/stories260K/reference/expected_greedy_200.txt");
  test::CudaStories st;
  Model& m = st.model;
  const int steps = 199;
  const CudaStepStats before = cuda_step_stats(*st.gpu);
  const auto piped = greedy_pair(m, *st.gpu, true, steps);
  const CudaStepStats after = cuda_step_stats(*st.gpu);
  const auto plain = greedy_pair(m, *st.gpu, false, steps);
  EXPECT_EQ(piped, plain);
  ASSERT_EQ(piped[0].size(), size_t(steps + 1));
  // Sequence 0 (prompt {1}) is the generator's greedy run, whose text the test above checks.
  GeneratorOptions o;
  o.cache_format = KvFormat::fp16;
  Generator g(m, *st.tok, o);
  std::vector<int32_t> generated;
  GenerationJob j;
  j.prompt = {1};
  j.sampling.temperature = 0;
  j.max_new_tokens = steps + 1;
  j.on_event = [&](const GenerationEvent& e) {
    if (e.type == GenerationEvent::Type::token) generated.push_back(e.token);
  };
  g.submit(std::move(j));
  g.run_until_idle();
  EXPECT_EQ(piped[0], generated);
  // Every fed step ran as a graph, nearly all of them replays: a capture per attention plan shape
  // (which changes as the 16-token pages fill, at bucket boundaries).
  const char* graphs = std::getenv("EXL_CUDA_GRAPHS");
  if (!(graphs && std::string(graphs) == "0")) {
    EXPECT_EQ(after.graph_launches - before.graph_launches, steps);
    EXPECT_LE(after.graph_captures - before.graph_captures, 2 * (steps / 16 + 2));
  }
}

using test::greedy_job;

// Prompt lookup on the GPU: the verify passes (several positions of the sequence) run as step
// graphs once their shape has come back, and the greedy tokens are those of one token per pass.
TEST(CudaStories, SpeculativeVerifyPassesReplayAsGraphsWithTheSameTokens) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  test::CudaStories st;
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play in the park. "
      "One day, Lily went to the park with her mom. Once upon a time, there was a little";
  GeneratorOptions o;
  o.cache_format = KvFormat::fp16;
  Generator g(st.model, *st.tok, o);
  GenerationStats plain_stats, first_stats, second_stats;
  const auto plain = greedy_job(g, *st.tok, story, Speculation::none, &plain_stats);
  const CudaStepStats before = cuda_step_stats(*st.gpu);
  const auto first = greedy_job(g, *st.tok, story, Speculation::ngram, &first_stats);
  const CudaStepStats mid = cuda_step_stats(*st.gpu);
  const auto second = greedy_job(g, *st.tok, story, Speculation::ngram, &second_stats);
  const CudaStepStats after = cuda_step_stats(*st.gpu);
  EXPECT_EQ(first, plain);
  EXPECT_EQ(second, plain);
  EXPECT_GT(first_stats.n_accepted, 0);
  EXPECT_LT(first_stats.n_decode_passes, first_stats.n_generated);
  EXPECT_GT(mid.multi_steps - before.multi_steps, 10);
  const char* graphs = std::getenv("EXL_CUDA_GRAPHS");
  if (!(graphs && std::string(graphs) == "0")) {
    // The second job's passes have the first one's shapes (the same context lengths and drafts):
    // all of those the first job saw twice replay, the others are captured now.
    const int64_t steps = after.multi_steps - mid.multi_steps;
    const int64_t launches = after.multi_graph_launches - mid.multi_graph_launches;
    EXPECT_GT(steps, 10);
    EXPECT_GE(4 * launches, 3 * steps) << launches << " of " << steps << " verify passes replayed";
    EXPECT_LE(after.multi_graph_captures - mid.multi_graph_captures, steps / 4);
  }
}

// Prompt lookup on the GPU keeps the greedy tokens: its verify passes run several positions per
// sequence through the tensor-core kernel and the staged norms, where plain decoding runs the
// one-row gemv (speculation_identity.h).
TEST(CudaSpeculation, GreedyTokensAreTheSameOnTheDemoAndExl2RefModels) {
  EXL_REQUIRE_CUDA();
  test::expect_speculation_keeps_greedy_tokens([] { return make_cuda_backend(0); });
}

TEST(CudaStories, PipelinedDecodeRejectsMisuse) {
  EXL_REQUIRE_CUDA();
  EXL_REQUIRE_SHARED("models/stories260K-hf/config.json");
  test::CudaStories st;
  Model& m = st.model;
  auto pool = st.gpu->alloc_kv_pool(m.kv_layout(KvFormat::fp16, 16), 4);
  const std::vector<int32_t> table = {0, 1, 2, 3}, two = {1, 2};
  std::vector<int32_t> ids(1);
  std::vector<RowSampling> greedy(1);
  greedy[0].temperature = 0.0f;
  EXPECT_THROW(m.collect_samples(ids), Error);  // nothing deferred
  ForwardSeq s{two, 0, table, false};
  EXPECT_THROW(m.forward_device_fed(std::span<const ForwardSeq>(&s, 1), *pool), Error);  // two tokens
  m.forward_device(std::span<const ForwardSeq>(&s, 1), *pool);
  ASSERT_TRUE(m.sample_device_deferred(greedy));
  EXPECT_THROW(m.sample_device(greedy, ids), Error);  // the deferred one is not collected
  EXPECT_THROW(m.sample_device_deferred(greedy), Error);
  std::vector<int32_t> wrong(2);
  EXPECT_THROW(m.collect_samples(wrong), Error);
  m.collect_samples(ids);
  EXPECT_GE(ids[0], 0);
  EXPECT_LT(ids[0], m.vocab_size());
}

}  // namespace model_cuda_test
}  // namespace exl
