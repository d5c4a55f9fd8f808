// The forward pass against independent references: llama2.c-derived logits for stories260K and
// the exl2-ref models' transformers / float64 logits, in prefill, decode and chunked modes.
#include "engine/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/generate/page_cache.h"
#include "kernels/error.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace exl {
namespace model_forward_test {

struct Run {
  std::vector<float> logits;  // [n, vocab]
};

// Runs `ids` through the model in chunks of `chunk` tokens (0 = one prefill), all logits.
std::vector<float> run_chunked(Model& m, Backend& be, const std::vector<int32_t>& ids, int64_t chunk,
                               KvFormat fmt = KvFormat::f32) {
  KvLayout layout = m.kv_layout(fmt, 16);
  int pages = int((ids.size() + 15) / 16);
  auto pool = be.alloc_kv_pool(layout, pages + 2);
  std::vector<int32_t> table;
  for (int i = 0; i < pages; ++i) table.push_back(pages + 1 - i);  // non-trivial page order
  std::vector<float> out;
  if (chunk <= 0) chunk = int64_t(ids.size());
  for (size_t b = 0; b < ids.size(); b += size_t(chunk)) {
    size_t e = std::min(ids.size(), b + size_t(chunk));
    ForwardSeq s{std::span<const int32_t>(ids).subspan(b, e - b), int64_t(b), table, true};
    auto l = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

TEST(ModelForward, Stories260kMatchesLlama2cLogits) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  auto ref_json = nlohmann::json::parse(test::read_file(test::shared_dir() / "models/stories260K/reference/reference.json"));
  std::vector<int32_t> ids = ref_json["logits_file"]["input_ids"].get<std::vector<int32_t>>();
  auto ref = test::read_f32(test::shared_dir() / "models/stories260K/reference/logits_greedy_pos0-15.f32");
  ModelDir dir(test::shared_dir() / "models/stories260K-hf");
  auto be = make_cpu_backend(2);
  Model m(dir, *be);
  for (int64_t chunk : {0, 1, 7}) {
    auto got = run_chunked(m, *be, ids, chunk);
    ASSERT_EQ(got.size(), ref.size());
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(double(got[i]) - ref[i]));
    EXPECT_LT(max_diff, 1e-4) << "chunk " << chunk;
  }
}

std::vector<int32_t> exl2_ref_ids() {
  auto j = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"));
  return j["input_ids"].get<std::vector<int32_t>>();
}

class Exl2RefModels : public ::testing::TestWithParam<const char*> {};

INSTANTIATE_TEST_SUITE_P(All, Exl2RefModels, ::testing::Values("llama-gqa", "qwen2-bias", "llama3-rope"));

// Prefix-cached run: a first sequence computes all ids; a second one gets the first 64 tokens
// from the page cache and computes only the rest. Returns the second run's logits for the rows
// it computed, preceded by the first run's rows for the cached part.
std::vector<float> run_prefix_cached(Model& m, Backend& be, const std::vector<int32_t>& ids, int64_t* n_cached) {
  CacheConfig cc{int(m.config().num_layers), int(m.config().num_kv_heads), int(m.config().head_dim), 16, 16,
                 KvFormat::f32, 42};
  PageCache cache(cc);
  auto pool = be.alloc_kv_pool(m.kv_layout(KvFormat::f32, 16), 16);
  const SeqId a = cache.create_sequence();
  const std::vector<int32_t> first(ids.begin(), ids.begin() + 64);
  EXPECT_TRUE(cache.reserve(a, 64));
  ForwardSeq fa{first, 0, cache.page_table(a), true};
  auto la = m.forward(std::span<const ForwardSeq>(&fa, 1), *pool);
  cache.append_tokens(a, first);
  cache.release(a);  // pages stay cached
  const SeqId b = cache.create_sequence();
  *n_cached = cache.match_prefix(b, ids);
  EXPECT_TRUE(cache.reserve(b, int(ids.size())));
  ForwardSeq fb{std::span<const int32_t>(ids).subspan(size_t(*n_cached)), *n_cached, cache.page_table(b), true};
  auto lb = m.forward(std::span<const ForwardSeq>(&fb, 1), *pool);
  la.resize(size_t(*n_cached * m.vocab_size()));
  la.insert(la.end(), lb.begin(), lb.end());
  return la;
}

// The logits of `ids` on the CPU backend — one prefill, chunks of 1 and of 7 tokens, and
// prefix-cached — each within 1e-4 relative L2 of `ref` with every argmax the same.
void expect_logits_match(const ModelDir& dir, const std::vector<int32_t>& ids, const std::vector<float>& ref) {
  auto be = make_cpu_backend(2);
  Model m(dir, *be);
  for (int64_t chunk : {0, 1, 7}) {
    auto got = run_chunked(m, *be, ids, chunk);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(test::rel_l2(got, ref), 1e-4) << "chunk " << chunk;
    EXPECT_EQ(test::argmax_agreement(got, ref, 512), 1.0) << "chunk " << chunk;
  }
  int64_t n_cached = 0;
  auto got = run_prefix_cached(m, *be, ids, &n_cached);
  EXPECT_EQ(n_cached, 64);
  EXPECT_LT(test::rel_l2(got, ref), 1e-4) << "prefix-cached";
  EXPECT_EQ(test::argmax_agreement(got, ref, 512), 1.0) << "prefix-cached";
}

// qwen2-bias's reference_logits_f32.bin was computed without the q_proj biases (the file has them,
// and ExLlamaV2 and transformers apply them): dropping exactly those reproduces it to ~4e-7, while
// the full model differs by ~4e-2. So for qwen2-bias the reference comparison runs on a copy of the
// directory whose safetensors file lacks the q_proj.bias tensors, and a separate check shows the
// biases are the only difference.
std::filesystem::path exl2_dir_for_reference(const std::string& name) {
  const auto base = test::shared_dir() / "data/exl2-ref" / name / "exl2-4.0bpw";
  if (name != "qwen2-bias") return base;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = test::temp_dir(cat("qwen2-bias-no-q-bias-", info->test_suite_name(), "-", info->name()));
  SafetensorsFile f(base / "output.safetensors");
  test::SafetensorsWriter w;
  for (const auto& t : f.header().tensors) {
    if (t.name.ends_with("q_proj.bias")) continue;
    auto v = f.view(t);
    w.add({t.name, std::string(to_string(t.dtype)), t.shape, std::string(reinterpret_cast<const char*>(v.data.data()), v.data.size())});
  }
  w.write(dir / "output.safetensors");
  for (const char* j : {"config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json", "tokenizer.model"})
    std::filesystem::copy_file(base / j, dir / j);
  return dir;
}

TEST(Exl2RefQwen2, ReferenceOmitsOnlyTheQProjBias) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/exl2-4.0bpw/output.safetensors");
  const auto base = test::shared_dir() / "data/exl2-ref/qwen2-bias/exl2-4.0bpw";
  auto ids = exl2_ref_ids();
  auto ref = test::read_f32(base / "reference_logits_f32.bin");
  auto be = make_cpu_backend(2);
  ModelDir full(base);
  Model m(full, *be);
  auto got = run_chunked(m, *be, ids, 0);
  EXPECT_GT(test::rel_l2(got, ref), 1e-2);  // the q bias matters...
  ModelDir no_q_bias(exl2_dir_for_reference("qwen2-bias"));
  Model m2(no_q_bias, *be);
  EXPECT_LT(test::rel_l2(run_chunked(m2, *be, ids, 0), ref), 1e-5);  // ...and is the only difference
}

TEST_P(Exl2RefModels, Exl2ForwardMatchesFloat64Reference) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  const auto base = exl2_dir_for_reference(GetParam());
  auto ids = exl2_ref_ids();
  auto ref = test::read_f32(test::shared_dir() / "data/exl2-ref" / GetParam() / "exl2-4.0bpw/reference_logits_f32.bin");
  expect_logits_match(ModelDir(base), ids, ref);
}

TEST_P(Exl2RefModels, Fp16ForwardMatchesTransformers) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  const auto base = test::shared_dir() / "data/exl2-ref" / GetParam();
  expect_logits_match(ModelDir(base / "hf"), exl2_ref_ids(), test::read_f32(base / "hf_logits_f32.bin"));
}

}  // namespace model_forward_test
}  // namespace exl
