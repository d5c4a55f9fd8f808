// A model split by layers over 2 and 3 CPU backends (engine/model.h's ModelPart) computes the
// single-backend logits: prefill, decode steps, chunked prefill, a batch of several sequences, a
// q8 cache, page copies, and generation through the prefix cache; bad parts and foreign pools are
// errors. The CPU backends are separate instances, so a layer that ran on the wrong backend or a
// residual stream that was not handed over shows up as wrong logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/generate/generator.h"
#include "engine/model.h"
#include "generation_harness.h"
#include "kernels/error.h"
#include "model_logits.h"
#include "test_support.h"

namespace exl {
namespace model_split_test {

// Backends and a model over them, split at `ends` (the end layer of each part).
struct SplitModel {
  std::vector<std::unique_ptr<Backend>> backends;
  std::unique_ptr<Model> model;
  SplitModel(const ModelDir& dir, std::vector<int64_t> ends) {
    std::vector<ModelPart> parts;
    int64_t b = 0;
    for (int64_t e : ends) {
      backends.push_back(make_cpu_backend(1));
      parts.push_back({backends.back().get(), b, e});
      b = e;
    }
    model = std::make_unique<Model>(dir, parts);
  }
};



// Three sequences of different lengths prefilled in one batch, then four decode steps of all
// three in one batch; the logits of every call, concatenated.
std::vector<float> run_batched(Model& m, const std::vector<int32_t>& ids) {
  auto pool = m.alloc_kv_pool(KvFormat::f32, 8, 24);
  const size_t lens[3] = {13, 5, 21};
  std::vector<std::vector<int32_t>> tables(3), toks(3);
  for (int s = 0; s < 3; ++s) {
    for (int p = 0; p < 8; ++p) tables[size_t(s)].push_back(p * 3 + (2 - s));
    toks[size_t(s)].assign(ids.begin() + s * 7, ids.begin() + s * 7 + int(lens[s]) + 4);
  }
  std::vector<float> out;
  std::vector<ForwardSeq> batch;
  for (int s = 0; s < 3; ++s)
    batch.push_back({std::span<const int32_t>(toks[size_t(s)]).first(lens[s]), 0, tables[size_t(s)], s == 1});
  auto l = m.forward(batch, *pool);
  out.insert(out.end(), l.begin(), l.end());
  for (size_t step = 0; step < 4; ++step) {
    batch.clear();
    for (int s = 0; s < 3; ++s)
      batch.push_back({std::span<const int32_t>(toks[size_t(s)]).subspan(lens[s] + step, 1), int64_t(lens[s] + step),
                       tables[size_t(s)], false});
    l = m.forward(batch, *pool);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

std::vector<int32_t> test_ids() {
  std::vector<int32_t> ids{1};
  uint32_t s = 12345;
  for (int i = 1; i < 60; ++i) {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5;
    ids.push_back(int32_t(3 + s % 500));
  }
  return ids;
}

struct SplitCase {
  const char* model;  // under the shared dir
  std::vector<int64_t> ends;
};

class ModelSplit : public ::testing::TestWithParam<SplitCase> {};

TEST_P(ModelSplit, LogitsEqualTheSingleBackendModel) {
  const SplitCase& c = GetParam();
  EXL_REQUIRE_SHARED(c.model);
  ModelDir dir(test::shared_dir() / c.model);
  auto one = make_cpu_backend(1);
  Model single(dir, *one);
  SplitModel split(dir, c.ends);
  ASSERT_EQ(split.model->parts().size(), c.ends.size());
  const auto ids = test_ids();
  for (int64_t chunk : {0, 1, 7}) {
    const auto want = test::run_chunked(single, ids, chunk, KvFormat::f32);
    const auto got = test::run_chunked(*split.model, ids, chunk, KvFormat::f32);
    EXPECT_LE(test::rel_err(got, want), 1e-5) << c.model << " chunk " << chunk;
  }
  const auto want_q8 = test::run_chunked(single, ids, 9, KvFormat::q8);
  EXPECT_LE(test::rel_err(test::run_chunked(*split.model, ids, 9, KvFormat::q8), want_q8), 1e-5)
      << c.model << " q8";
  EXPECT_LE(test::rel_err(run_batched(*split.model, ids), run_batched(single, ids)), 1e-5)
      << c.model << " batched";
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelSplit,
    ::testing::Values(SplitCase{"models/stories260K-hf", {3, 5}}, SplitCase{"models/stories260K-hf", {1, 4, 5}},
                      SplitCase{"data/exl2-ref/llama-gqa/exl2-4.0bpw", {1, 3}},
                      SplitCase{"data/exl2-ref/llama-gqa/exl2-4.0bpw", {1, 2, 3}},
                      SplitCase{"data/exl2-ref/llama-gqa/hf", {2, 3}},
                      SplitCase{"data/exl2-ref/qwen2-bias/exl2-4.0bpw", {1, 2}},
                      SplitCase{"data/exl2-ref/llama3-rope/exl2-4.0bpw", {1, 2}}));

TEST(ModelSplitPool, EveryPartHoldsItsLayersAndCopiesPages) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  ModelDir dir(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  SplitModel split(dir, {1, 3});
  Model& m = *split.model;
  auto pool = m.alloc_kv_pool(KvFormat::f32, 16, 4);
  EXPECT_EQ(pool->layout.n_layers, 3);
  EXPECT_EQ(pool->num_pages, 4);
  // Positions 0..15 on page 0, then the same tokens' last logits from page 2 after copying it there.
  const auto ids = test_ids();
  const std::vector<int32_t> first(ids.begin(), ids.begin() + 16), next(ids.begin() + 16, ids.begin() + 17);
  const std::vector<int32_t> t0{0, 1}, t2{2, 1};
  ForwardSeq s{first, 0, t0, false};
  m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
  ForwardSeq d0{next, 16, t0, false};
  const auto want = m.forward(std::span<const ForwardSeq>(&d0, 1), *pool);
  m.kv_copy(*pool, 0, 2, 16);
  ForwardSeq d2{next, 16, t2, false};
  EXPECT_EQ(m.forward(std::span<const ForwardSeq>(&d2, 1), *pool), want);
}

TEST(ModelSplitPool, ForeignPoolsAndBadPartsAreErrors) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  ModelDir dir(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  SplitModel split(dir, {2, 3});
  auto foreign = split.backends[0]->alloc_kv_pool(split.model->kv_layout(KvFormat::f32, 16), 2);
  const std::vector<int32_t> ids{1, 5, 9}, table{0};
  ForwardSeq s{ids, 0, table, false};
  EXPECT_THROW(split.model->forward(std::span<const ForwardSeq>(&s, 1), *foreign), Error);

  auto be = make_cpu_backend(1);
  const ModelPart gap[2] = {{be.get(), 0, 1}, {be.get(), 2, 3}};
  EXPECT_THROW(Model(dir, gap), Error);
  const ModelPart short_of_layers[1] = {{be.get(), 0, 2}};
  EXPECT_THROW(Model(dir, short_of_layers), Error);
  const ModelPart empty_part[2] = {{be.get(), 0, 0}, {be.get(), 0, 3}};
  EXPECT_THROW(Model(dir, empty_part), Error);
  const ModelPart no_backend[1] = {{nullptr, 0, 3}};
  EXPECT_THROW(Model(dir, no_backend), Error);
}

GenerationJob greedy_job(std::vector<int32_t> prompt, test::GenerationRecord* r) {
  GenerationJob j;
  j.prompt = std::move(prompt);
  j.sampling.temperature = 0;
  j.max_new_tokens = 6;
  j.top_logprobs = 0;
  j.on_event = test::record_events(r);
  return j;
}

// Two jobs sharing a 40-token prefix, the second served from the prefix cache (a partial page
// copied on write), generate on the split model what they generate on one backend.
std::vector<test::GenerationRecord> generate_pair(Model& m, const Tokenizer& tok) {
  GeneratorOptions o;
  o.page_size = 16;
  o.num_pages = 32;
  o.device_sampling = false;
  Generator g(m, tok, o);
  const auto ids = test_ids();
  std::vector<int32_t> a(ids.begin(), ids.begin() + 40), b = a;
  a.insert(a.end(), ids.begin() + 40, ids.begin() + 45);
  b.insert(b.end(), ids.begin() + 50, ids.begin() + 53);
  std::vector<test::GenerationRecord> r(2);
  g.submit(greedy_job(a, &r[0]));
  g.run_until_idle();
  g.submit(greedy_job(b, &r[1]));
  g.run_until_idle();
  return r;
}

TEST(ModelSplitGeneration, PrefixCacheJobsMatchTheSingleBackendModel) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  const auto path = test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw";
  test::CpuModel single(path);
  SplitModel split(single.dir, {1, 2, 3});
  const auto want = generate_pair(*single.model, *single.tok);
  const auto got = generate_pair(*split.model, *single.tok);
  ASSERT_TRUE(got[1].done) << got[1].error;
  EXPECT_GE(got[1].stats.n_cached_tokens, 32);
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_EQ(got[j].tokens, want[j].tokens) << "job " << j;
    EXPECT_EQ(got[j].stats.n_cached_tokens, want[j].stats.n_cached_tokens) << "job " << j;
  }
}

}  // namespace model_split_test
}  // namespace exl
