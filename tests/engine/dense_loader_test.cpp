// Dense (FP16/BF16/F32) linears, the tied-head fallback and float tensor helpers, checked against
// the raw bytes of the published files read independently here.
#include "engine/formats/dense_loader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/formats/linear_loader.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/error.h"
#include "kernels/half.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace exl {
namespace dense_loader_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A safetensors file read with nothing but nlohmann::json and byte arithmetic.
struct RawFile {
  std::string bytes;
  json header;
  size_t data_start = 0;

  explicit RawFile(const fs::path& p) : bytes(test::read_file(p)) {
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    header = json::parse(bytes.substr(8, n));
    data_start = 8 + n;
  }
  template <typename T>
  T at(const std::string& tensor, int64_t index) const {
    T v;
    std::memcpy(&v, bytes.data() + data_start + header[tensor]["data_offsets"][0].get<size_t>() + index * sizeof(T),
                sizeof(T));
    return v;
  }
};

void spot_check_f16(const ModelDir& md, const RawFile& raw, const LinearSpec& spec, std::mt19937& rng) {
  SCOPED_TRACE(spec.name);
  LinearWeights w = load_linear(md, spec.name, spec.in_features, spec.out_features);
  const auto& d = std::get<DenseMatrix>(w);
  EXPECT_EQ(d.dtype, DType::f16);
  std::vector<float> out(size_t(spec.out_features * spec.in_features));
  dequantize(d, out);
  const std::string tensor = *resolve_linear_prefix(md, spec.name) + ".weight";
  for (int i = 0; i < 64; ++i) {
    const int64_t idx = int64_t(rng() % out.size());
    ASSERT_EQ(out[idx], half_to_float(raw.at<uint16_t>(tensor, idx))) << tensor << "[" << idx << "]";
  }
  ASSERT_EQ(out.back(), half_to_float(raw.at<uint16_t>(tensor, int64_t(out.size()) - 1)));
}

TEST(DenseLoader, HfReferenceWeightsMatchRawBytes) {
  std::mt19937 rng(1);
  for (const char* model : {"llama-gqa", "qwen2-bias", "llama3-rope"}) {
    const fs::path dir = test::shared_dir() / "data/exl2-ref" / model / "hf";
    if (!fs::exists(dir / "model.safetensors")) GTEST_SKIP() << "shared asset missing: " << dir;
    SCOPED_TRACE(model);
    ModelDir md(dir);
    RawFile raw(dir / "model.safetensors");
    for (int64_t l = 0; l < md.config().num_layers; ++l)
      for (const auto& spec : decoder_layer_linears(md.config(), l)) spot_check_f16(md, raw, spec, rng);
    spot_check_f16(md, raw, head_linear(md.config()), rng);
  }
}

TEST(DenseLoader, HeadFallsBackToTiedEmbeddings) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/model.safetensors");
  ModelDir tied(test::shared_dir() / "data/exl2-ref/qwen2-bias/hf");
  EXPECT_EQ(resolve_linear_prefix(tied, "lm_head"), "model.embed_tokens");
  ModelDir untied(test::shared_dir() / "data/exl2-ref/llama-gqa/hf");
  EXPECT_EQ(resolve_linear_prefix(untied, "lm_head"), "lm_head");
  EXPECT_EQ(resolve_linear_prefix(untied, "model.layers.9.mlp.up_proj"), std::nullopt);

  RawFile raw(test::shared_dir() / "data/exl2-ref/qwen2-bias/hf/model.safetensors");
  const DenseMatrix k = std::get<DenseMatrix>(load_linear(tied, "model.layers.1.self_attn.k_proj", 256, 128));
  ASSERT_EQ(k.bias.size(), 128u);
  for (int i = 0; i < 128; ++i)
    ASSERT_EQ(k.bias[i], half_to_float(raw.at<uint16_t>("model.layers.1.self_attn.k_proj.bias", i)));
}

TEST(DenseLoader, StoriesF32WeightsAndNorms) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  const fs::path dir = test::shared_dir() / "models/stories260K-hf";
  ModelDir md(dir);
  RawFile raw(dir / "model.safetensors");
  const DenseMatrix d = std::get<DenseMatrix>(load_linear(md, "model.layers.4.mlp.down_proj", 172, 64));
  EXPECT_EQ(d.dtype, DType::f32);
  std::vector<float> out(64 * 172);
  dequantize(d, out);
  for (int64_t i = 0; i < 64 * 172; i += 37)
    ASSERT_EQ(out[i], raw.at<float>("model.layers.4.mlp.down_proj.weight", i)) << i;

  const int64_t norm_shape[] = {64};
  std::vector<float> norm = load_f32(md, "model.norm.weight", norm_shape);
  ASSERT_EQ(norm.size(), 64u);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(norm[i], raw.at<float>("model.norm.weight", i));
  const int64_t emb_shape[] = {512, 64};
  EXPECT_EQ(load_f32(md, "model.embed_tokens.weight", emb_shape).size(), 512u * 64);

  const int64_t wrong[] = {65};
  try {
    load_f32(md, "model.norm.weight", wrong);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'model.norm.weight' has shape [64], expected [65]"),
              std::string::npos) << e.what();
  }
}

TEST(DenseLoader, Bf16AndMalformedDenseTensors) {
  const std::string up = "model.layers.0.mlp.up_proj";
  std::vector<uint16_t> bf(80 * 64);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = float_to_bf16(float(int(i % 64) - 32) * 0.25f);
  auto attempt = [&](const std::function<void(test::SafetensorsWriter&)>& edit) -> std::string {
    test::SafetensorsWriter w;
    w.add(up + ".weight", "BF16", {80, 64}, bf);
    edit(w);
    fs::path dir = test::temp_dir("dense_case");
    test::write_model_dir(dir, test::tiny_llama_config(64, 80), w, "model.safetensors");
    ModelDir md(dir);
    try {
      const DenseMatrix d = std::get<DenseMatrix>(load_linear(md, up, 64, 80));
      std::vector<float> out(80 * 64);
      dequantize(d, out);
      for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], float(int(i % 64) - 32) * 0.25f) << i;
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(attempt([](auto&) {}), "");
  std::string msg = attempt([&](auto& w) { w.find(up + ".weight")->shape = {64, 80}; });
  EXPECT_NE(msg.find("tensor '" + up + ".weight': has shape [64, 80], expected [80, 64]"), std::string::npos) << msg;
  msg = attempt([&](auto& w) { w.find(up + ".weight")->dtype = "I16"; });
  EXPECT_NE(msg.find("has dtype I16, expected F16, BF16 or F32"), std::string::npos) << msg;
}

}  // namespace dense_loader_test
}  // namespace exl
