// Logit error of the quantized KV cache formats against the exact f32 cache, on real models.
//
// Bounds. Each K/V element is stored with error ≤ s/2, s = max|x|/qmax over a block of 32
// (fp16: relative 2^-11). For roughly Gaussian blocks max|x| ≈ 2.5–3σ, so the rms storage error is
// ≈ s/√12: ≈ 0.7% of σ for q8 (qmax 127) and ≈ 12% of σ for q4 (qmax 7); fp16 ≈ 0.03%. K and V
// errors add (≈ √2) and compound over layers; trained models attenuate them, random-weight ones
// (exl2-ref) barely do. So we require the relative L2 logit error to stay within about twice
// the storage error: fp16 < 1e-3, q8 < 2e-2, q4 < 0.3, ordered fp16 < q8 < q4, and q8 agreeing
// with the exact cache on ≥ 90% of argmaxes. Measured values are printed (all four models:
// fp16 2–4e-4, q8 0.7–1.0e-2, q4 0.08–0.17).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "test_support.h"

namespace exl {
namespace cache_format_test {

std::vector<float> logits_with(Model& m, Backend& be, const std::vector<int32_t>& ids, KvFormat fmt) {
  auto pool = be.alloc_kv_pool(m.kv_layout(fmt, 16), int(ids.size() + 15) / 16);
  std::vector<int32_t> table;
  for (int i = 0; i < pool->num_pages; ++i) table.push_back(i);
  std::vector<float> out;
  for (size_t b = 0; b < ids.size(); b += 8) {  // decode-like: earlier positions come from the cache
    ForwardSeq s{std::span<const int32_t>(ids).subspan(b, std::min<size_t>(8, ids.size() - b)), int64_t(b), table, true};
    auto l = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

class CacheFormats : public ::testing::TestWithParam<const char*> {};

TEST_P(CacheFormats, QuantizedCacheLogitErrorIsBounded) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  auto j = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"));
  auto ids = j["input_ids"].get<std::vector<int32_t>>();
  const auto path = std::string(GetParam()) == "stories260K" ? test::shared_dir() / "models/stories260K-hf"
                                                             : test::shared_dir() / "data/exl2-ref" / GetParam() / "hf";
  ModelDir dir(path);
  auto be = make_cpu_backend(2);
  Model m(dir, *be);
  auto exact = logits_with(m, *be, ids, KvFormat::f32);
  const double e16 = test::rel_l2(logits_with(m, *be, ids, KvFormat::fp16), exact);
  auto q8 = logits_with(m, *be, ids, KvFormat::q8);
  const double e8 = test::rel_l2(q8, exact);
  const double e4 = test::rel_l2(logits_with(m, *be, ids, KvFormat::q4), exact);
  std::cout << GetParam() << ": fp16 " << e16 << ", q8 " << e8 << ", q4 " << e4 << "\n";
  EXPECT_LT(e16, 1e-3);
  EXPECT_LT(e8, 2e-2);
  EXPECT_LT(e4, 0.3);
  EXPECT_LT(e16, e8);
  EXPECT_LT(e8, e4);
  EXPECT_GE(test::argmax_agreement(q8, exact, m.vocab_size()), 0.90);
}

INSTANTIATE_TEST_SUITE_P(Models, CacheFormats, ::testing::Values("stories260K", "llama-gqa", "qwen2-bias", "llama3-rope"));

}  // namespace cache_format_test
}  // namespace exl
