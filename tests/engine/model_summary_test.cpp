// Model summaries (`exlagent info`) of the reference directories: bits per weight, head bits,
// weight bytes and KV-cache sizes against numbers computed independently here.
#include "engine/model_summary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace exl {
namespace model_summary_test {

namespace fs = std::filesystem;

// Σ tensor bytes straight from the file's header.
int64_t tensor_bytes_of(const fs::path& file) {
  std::string b = test::read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  return int64_t(b.size() - 8 - n);
}

TEST(ModelSummary, Exl2ReferenceModels) {
  for (const char* model : {"llama-gqa", "qwen2-bias", "llama3-rope"}) {
    const fs::path dir = test::shared_dir() / "data/exl2-ref" / model / "exl2-4.0bpw";
    if (!fs::exists(dir / "output.safetensors")) GTEST_SKIP() << "shared asset missing: " << dir;
    SCOPED_TRACE(model);
    ModelDir md(dir);
    ModelSummary s = summarize_model(md);
    EXPECT_NEAR(s.avg_bpw_layers, 4.0, 0.15);
    EXPECT_EQ(s.head_bits, 6);
    EXPECT_EQ(s.head.format, WeightFormat::exl2);
    EXPECT_EQ(s.head.tensor_prefix, "lm_head");
    EXPECT_GT(s.head_bpw, 6.0);
    EXPECT_LT(s.head_bpw, 7.5);
    EXPECT_EQ(s.weight_bytes, tensor_bytes_of(dir / "output.safetensors"));
    ASSERT_EQ(int64_t(s.layers.size()), md.config().num_layers);
    std::map<int, int64_t> widths;
    for (const auto& layer : s.layers) {
      ASSERT_EQ(layer.size(), 7u);
      for (const auto& l : layer) {
        EXPECT_EQ(l.format, WeightFormat::exl2) << l.name;
        int64_t rows = 0;
        for (auto [b, r] : l.rows_per_bits) rows += r, widths[b] += r;
        EXPECT_EQ(rows, l.in_features) << l.name;
      }
    }
    EXPECT_EQ(s.layer_weights_per_bits.size(), widths.size());
    auto j = to_json(s);
    for (const char* key : {"architecture", "num_layers", "avg_bpw_layers", "head_bits", "weight_bytes",
                            "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                            "vocab_size", "rope", "layers", "kv_cache_bytes_per_1k"})
      EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j["layers"][0]["linears"][0]["format"], "exl2");
  }
}

TEST(ModelSummary, ExactBpwOfOneLayerFromTensorSizes) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/output.safetensors");
  ModelDir md(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  ModelSummary s = summarize_model(md);
  // model.layers.0.mlp.down_proj: q_weight [136, 384] I32, q_scale [32, 48] I32, q_scale_max [32] F16,
  // q_groups [64] I16, q_invperm [1024] I32; K = 1024, N = 384.
  const double bytes = 136 * 384 * 4 + 32 * 48 * 4 + 32 * 2 + 64 * 2 + 1024 * 4;
  const LinearSummary& down = s.layers[0][6];
  EXPECT_EQ(down.name, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(down.storage_bytes, int64_t(bytes));
  EXPECT_DOUBLE_EQ(down.bpw, 8 * bytes / (1024.0 * 384));
  EXPECT_EQ(s.head.rows_per_bits, (std::map<int, int64_t>{{8, 128}, {6, 256}}));
}

TEST(ModelSummary, KvCacheBytes) {
  ModelConfig c;
  c.num_layers = 3, c.num_kv_heads = 2, c.head_dim = 64;
  KvCacheBytes b = kv_cache_bytes(c, 1024);
  const int64_t values = 1024 * 3 * 2 * 2 * 64;  // tokens × layers × (K, V) × kv heads × head_dim
  EXPECT_EQ(b.fp16, values * 2);
  EXPECT_EQ(b.q8, values + values / 32 * 2);
  EXPECT_EQ(b.q4, values / 2 + values / 32 * 2);
  c.head_dim = 8;  // one short block per head
  b = kv_cache_bytes(c, 1024);
  const int64_t vectors = 1024 * 3 * 2 * 2;
  EXPECT_EQ(b.q8, vectors * 8 + vectors * 2);
  EXPECT_EQ(b.q4, vectors * 4 + vectors * 2);
}

TEST(ModelSummary, DenseModels) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  ModelDir stories(test::shared_dir() / "models/stories260K-hf");
  ModelSummary s = summarize_model(stories);
  EXPECT_EQ(s.avg_bpw_layers, 32.0);
  EXPECT_EQ(s.head_bits, 32);
  EXPECT_EQ(s.head.tensor_prefix, "model.embed_tokens");
  EXPECT_EQ(s.layers.size(), 5u);
  EXPECT_EQ(s.weight_bytes, tensor_bytes_of(test::shared_dir() / "models/stories260K-hf/model.safetensors"));

  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/hf/model.safetensors");
  ModelDir hf(test::shared_dir() / "data/exl2-ref/llama-gqa/hf");
  s = summarize_model(hf);
  EXPECT_EQ(s.avg_bpw_layers, 16.0);
  EXPECT_EQ(s.head_bits, 16);
  EXPECT_EQ(s.head.tensor_prefix, "lm_head");
}

}  // namespace model_summary_test
}  // namespace exl
