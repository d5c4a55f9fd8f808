// GPTQ loading and dequantization on synthetic checkpoints written here: act-order g_idx, the
// v1/v2 zero conventions, the implied group size, bias handling and malformed tensors.
#include "engine/formats/gptq_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/formats/linear_loader.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/error.h"
#include "kernels/half.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace exl {
namespace gptq_loader_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string k_down = "model.layers.0.mlp.down_proj";

// K = 64 inputs, N = 16 outputs, G = 4 groups of 16 rows assigned in act order.
struct GptqSynth {
  int64_t k = 64, n = 16, g = 4;
  std::vector<int> q, zero;          // [K][N], [G][N]
  std::vector<uint16_t> scale;       // [G][N] fp16
  std::vector<int32_t> g_idx;        // [K]

  explicit GptqSynth(uint32_t seed) {
    std::mt19937 rng(seed);
    for (int64_t i = 0; i < k * n; ++i) q.push_back(int(rng() % 16));
    for (int64_t i = 0; i < g * n; ++i) zero.push_back(int(rng() % 16));
    for (int64_t i = 0; i < g * n; ++i) scale.push_back(float_to_half(0.001f + float(rng() % 1000) * 1e-5f));
    for (int64_t i = 0; i < k; ++i) g_idx.push_back(int32_t(i * g / k));
    std::shuffle(g_idx.begin(), g_idx.end(), rng);
  }

  void add_to(test::SafetensorsWriter& w) const {
    std::vector<uint32_t> qweight(size_t(k / 8 * n), 0), qzeros(size_t(g * n / 8), 0);
    for (int64_t r = 0; r < k; ++r)
      for (int64_t c = 0; c < n; ++c) qweight[(r / 8) * n + c] |= uint32_t(q[r * n + c]) << (4 * (r % 8));
    for (int64_t gr = 0; gr < g; ++gr)
      for (int64_t c = 0; c < n; ++c) qzeros[gr * (n / 8) + c / 8] |= uint32_t(zero[gr * n + c]) << (4 * (c % 8));
    w.add(k_down + ".qweight", "I32", {k / 8, n}, qweight);
    w.add(k_down + ".qzeros", "I32", {g, n / 8}, qzeros);
    w.add(k_down + ".scales", "F16", {g, n}, scale);
    w.add(k_down + ".g_idx", "I32", {k}, g_idx);
  }

  // W[c, r] from the definition, visiting groups and columns first.
  std::vector<double> reference(bool v2, const std::vector<int32_t>& groups) const {
    std::vector<double> w(size_t(n * k), NAN);
    for (int64_t gr = 0; gr < g; ++gr)
      for (int64_t c = 0; c < n; ++c) {
        const double s = half_to_float(scale[gr * n + c]);
        const int z = zero[gr * n + c] + (v2 ? 0 : 1);
        for (int64_t r = 0; r < k; ++r)
          if (groups[r] == gr) w[c * k + r] = (q[r * n + c] - z) * s;
      }
    return w;
  }
};

json config(bool v2) {
  json c = test::tiny_llama_config(16, 64);
  if (v2) c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"checkpoint_format", "gptq_v2"}};
  return c;
}

// A loaded matrix with the directory whose mapped files it points into.
struct Loaded {
  std::unique_ptr<ModelDir> dir;
  GptqMatrix m;
};

Loaded load(const std::string& name, const test::SafetensorsWriter& w, bool v2) {
  fs::path dir = test::temp_dir("gptq_" + name);
  test::write_model_dir(dir, config(v2), w, "model.safetensors");
  Loaded l{std::make_unique<ModelDir>(dir), {}};
  l.m = std::get<GptqMatrix>(load_linear(*l.dir, k_down, 64, 16));
  return l;
}

void expect_matches(const GptqMatrix& m, const std::vector<double>& ref) {
  std::vector<float> out(ref.size());
  dequantize(m, out);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-6 * std::abs(ref[i])) << i;
}

TEST(GptqLoader, ActOrderV1MatchesDefinition) {
  GptqSynth s(1);
  test::SafetensorsWriter w;
  s.add_to(w);
  Loaded l = load("v1", w, false);
  const GptqMatrix& m = l.m;
  EXPECT_FALSE(m.zeros_v2);
  EXPECT_EQ(m.num_groups, 4);
  EXPECT_EQ(m.g_idx, s.g_idx);
  EXPECT_TRUE(m.bias.empty());
  expect_matches(m, s.reference(false, s.g_idx));
}

TEST(GptqLoader, V2ZerosAreStoredValues) {
  GptqSynth s(2);
  test::SafetensorsWriter w;
  s.add_to(w);
  std::vector<float> v1(64 * 16), v2(64 * 16);
  Loaded l1 = load("v1b", w, false), l2 = load("v2", w, true);
  dequantize(l1.m, v1);
  const GptqMatrix& m2 = l2.m;
  EXPECT_TRUE(m2.zeros_v2);
  expect_matches(m2, s.reference(true, s.g_idx));
  dequantize(m2, v2);
  for (int64_t c = 0; c < 16; ++c)
    for (int64_t r = 0; r < 64; ++r)
      ASSERT_NEAR(v2[c * 64 + r] - v1[c * 64 + r], half_to_float(s.scale[s.g_idx[r] * 16 + c]), 1e-6);
}

TEST(GptqLoader, ImpliedGroupSizeWithoutGIdx) {
  EXPECT_EQ(gptq_implied_group_size(64, 4), 16);
  EXPECT_EQ(gptq_implied_group_size(64, 3), 32);
  EXPECT_EQ(gptq_implied_group_size(4096, 32), 128);
  EXPECT_EQ(gptq_implied_group_size(11008, 86), 128);
  EXPECT_EQ(gptq_implied_group_size(100, 1), 128);
  std::vector<int32_t> sequential(64);
  for (int r = 0; r < 64; ++r) sequential[r] = r / 16;
  GptqSynth s(3);
  for (bool all_zero : {false, true}) {
    SCOPED_TRACE(all_zero ? "all-zero g_idx" : "no g_idx");
    test::SafetensorsWriter w;
    s.add_to(w);
    if (all_zero) w.add(k_down + ".g_idx", "I32", {64}, std::vector<int32_t>(64, 0));
    else w.remove(k_down + ".g_idx");
    Loaded l = load("no_gidx", w, false);
    const GptqMatrix& m = l.m;
    EXPECT_EQ(m.g_idx, sequential);
    expect_matches(m, s.reference(false, sequential));
  }
}

TEST(GptqLoader, BiasIsDroppedWhenAllZero) {
  GptqSynth s(4);
  test::SafetensorsWriter w;
  s.add_to(w);
  w.add(k_down + ".bias", "F16", {16}, std::vector<uint16_t>(16, 0));
  EXPECT_TRUE(load("zero_bias", w, false).m.bias.empty());
  std::vector<float> bias(16, 0.0f);
  bias[3] = 0.25f;
  w.add(k_down + ".bias", "F32", {16}, bias);
  EXPECT_EQ(load("bias", w, false).m.bias, bias);
}

TEST(GptqLoader, MalformedTensorsGiveClearErrors) {
  struct Case {
    std::string what;
    std::function<void(test::SafetensorsWriter&)> edit;
    std::vector<std::string> expect;
  };
  const std::string gi = "tensor '" + k_down + ".g_idx'";
  std::vector<Case> cases = {
      {"g_idx out of range", [](auto& w) { w.template data<int32_t>(k_down + ".g_idx")[5] = 4; },
       {"'model.safetensors'", gi, "row 5 has group 4, outside [0, 4)"}},
      {"g_idx negative", [](auto& w) { w.template data<int32_t>(k_down + ".g_idx")[0] = -1; },
       {gi, "row 0 has group -1"}},
      {"g_idx wrong length", [](auto& w) { w.add(k_down + ".g_idx", "I32", {32}, std::vector<int32_t>(32, 1)); },
       {gi, "has shape [32], expected [64]"}},
      {"qweight wrong shape", [](auto& w) { w.find(k_down + ".qweight")->shape = {16, 8}; },
       {"tensor '" + k_down + ".qweight'", "has shape [16, 8], expected [8, 16]"}},
      {"scales F32",
       [](auto& w) { w.add(k_down + ".scales", "F32", {4, 16}, std::vector<float>(64, 1.0f)); },
       {"tensor '" + k_down + ".scales'", "has dtype F32, expected F16"}},
      {"qzeros wrong groups", [](auto& w) { w.add(k_down + ".qzeros", "I32", {3, 2}, std::vector<int32_t>(6, 0)); },
       {"tensor '" + k_down + ".qzeros'", "has shape [3, 2], expected [4, 2]"}},
      {"missing qzeros", [](auto& w) { w.remove(k_down + ".qzeros"); },
       {"missing tensor '" + k_down + ".qzeros'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    GptqSynth s(5);
    test::SafetensorsWriter w;
    s.add_to(w);
    c.edit(w);
    std::string msg;
    try {
      load("malformed", w, false);
    } catch (const Error& e) {
      msg = e.what();
    }
    ASSERT_FALSE(msg.empty()) << "no error";
    for (const auto& e : c.expect) EXPECT_NE(msg.find(e), std::string::npos) << "message: " << msg << "\nmissing: " << e;
  }
}

TEST(GptqLoader, RejectsOtherBitWidths) {
  GptqSynth s(7);
  test::SafetensorsWriter w;
  s.add_to(w);
  fs::path dir = test::temp_dir("gptq_bits");
  json c = config(false);
  c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 8}};
  test::write_model_dir(dir, c, w, "model.safetensors");
  ModelDir md(dir);
  try {
    load_linear(md, k_down, 64, 16);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json': quantization_config.bits is 8; only 4-bit GPTQ"),
              std::string::npos) << e.what();
  }
  c["quantization_config"]["bits"] = 4;
  fs::path dir4 = test::temp_dir("gptq_bits4");
  test::write_model_dir(dir4, c, w, "model.safetensors");
  ModelDir ok(dir4);
  EXPECT_NO_THROW(load_linear(ok, k_down, 64, 16));
}

TEST(GptqLoader, RejectsDimensionsNotDivisibleBy8) {
  GptqSynth s(6);
  test::SafetensorsWriter w;
  s.add_to(w);
  fs::path dir = test::temp_dir("gptq_dims");
  test::write_model_dir(dir, config(false), w, "model.safetensors");
  ModelDir md(dir);
  try {
    load_gptq_matrix(md, k_down, 60, 16);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by 8, got 60 and 16"), std::string::npos) << e.what();
  }
}

}  // namespace gptq_loader_test
}  // namespace exl
