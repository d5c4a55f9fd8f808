// The forward pass against independent references: llama2.c-derived logits for stories260K and
// the exl2-ref models' transformers / float64 logits, in prefill, decode and chunked modes.
#include "engine/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace exl {
namespace {

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

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

int argmax_agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  int agree = 0;
  for (size_t r = 0; r < a.size() / size_t(vocab); ++r) {
    auto am = std::max_element(a.begin() + r * vocab, a.begin() + (r + 1) * vocab) - (a.begin() + r * vocab);
    auto bm = std::max_element(b.begin() + r * vocab, b.begin() + (r + 1) * vocab) - (b.begin() + r * vocab);
    agree += am == bm;
  }
  return agree;
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

}  // namespace
}  // namespace exl

namespace exl {
namespace {

std::vector<int32_t> exl2_ref_ids() {
  auto j = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"));
  return j["input_ids"].get<std::vector<int32_t>>();
}

class Exl2RefModels : public ::testing::TestWithParam<const char*> {};

TEST_P(Exl2RefModels, Fp16ForwardMatchesTransformers) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  const auto base = test::shared_dir() / "data/exl2-ref" / GetParam();
  auto ids = exl2_ref_ids();
  auto ref = test::read_f32(base / "hf_logits_f32.bin");
  ModelDir dir(base / "hf");
  auto be = make_cpu_backend(2);
  Model m(dir, *be);
  for (int64_t chunk : {0, 1, 7}) {
    auto got = run_chunked(m, *be, ids, chunk);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(rel_l2(got, ref), 1e-4) << GetParam() << " chunk " << chunk;
    EXPECT_EQ(argmax_agreement(got, ref, 512), 96) << GetParam() << " chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(All, Exl2RefModels, ::testing::Values("llama-gqa", "qwen2-bias", "llama3-rope"));

}  // namespace
}  // namespace exl
