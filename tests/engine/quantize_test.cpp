// The EXL2 writer and `quantize` against independent references: the bitstream packing examples
// of exl2-engine.md §1.6, the spec-derived naive dequantizer of tests/kernels/random_weights.h,
// and on the exl2-ref models the transformers FP16 logits and ExLlamaV2's own converter's files
// (ours must load in our engine, carry the same tensor set, hit the requested average bpw, and
// at 4.0 bpw be within 0.9x of the converter's KL divergence from FP16).
#include "engine/quantize/quantize_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "../kernels/random_weights.h"
#include "engine/formats/exl2_writer.h"
#include "engine/model.h"
#include "engine/model_summary.h"
#include "engine/rope.h"
#include "engine/quantize/quantize_alloc.h"
#include "engine/quantize/quantize_linear.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace quantize_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// One 32-row block of `bits`-bit codes q[i] packed into group 0 of a K=32, N=32 layer; column 0's words.
std::vector<uint32_t> pack_block(int bits, const std::vector<uint32_t>& q) {
  std::vector<int32_t> perm(32);
  std::iota(perm.begin(), perm.end(), 0);
  const std::pair<int, int64_t> g[] = {{bits, 32}};
  Exl2Tensors t = make_exl2_tensors(32, 32, make_exl2_groups(g, 32), perm);
  for (int64_t j = 0; j < 32; ++j) set_code(t, 0, j, 0, q[size_t(j)]);
  std::vector<uint32_t> words;
  for (int64_t r = 0; r < t.q_rows; ++r) words.push_back(t.q_weight[size_t(r * t.padded_out)]);
  return words;
}

TEST(Exl2Writer, PacksTheSpecsWorkedExamples) {
  std::vector<uint32_t> q2, q3, q5, q6;
  for (uint32_t i = 0; i < 32; ++i) q2.push_back(i % 4), q3.push_back(i % 8), q5.push_back(i), q6.push_back(i);
  EXPECT_EQ(pack_block(2, q2), (std::vector<uint32_t>{0xe4e4e4e4, 0xe4e4e4e4}));
  EXPECT_EQ(pack_block(3, q3), (std::vector<uint32_t>{0x88fac688, 0xc688fac6, 0xfac688fa}));
  EXPECT_EQ(pack_block(5, q5), (std::vector<uint32_t>{0x8a418820, 0xc5a92839, 0xca307b9a, 0x38bdab49, 0xffbbcdeb}));
  EXPECT_EQ(pack_block(6, q6),
            (std::vector<uint32_t>{0x440c2040, 0xa2481c61, 0x3ce34c2c, 0x544d2450, 0xa6585d65, 0x7de75c6d}));
}

TEST(Exl2Writer, CodesAndScalesRoundTripThroughTheSpecDequantizer) {
  const int64_t K = 32 + 64 + 32 + 32 + 96 + 16 + 16, N = 40;  // N padded to 64
  const std::vector<std::pair<int, int64_t>> g = {{8, 32}, {6, 64}, {5, 32}, {4, 32}, {3, 96}, {2, 16}, {2, 16}};
  std::mt19937 rng(7);
  std::vector<int32_t> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  Exl2Tensors t = make_exl2_tensors(K, N, make_exl2_groups(g, K), perm);
  for (size_t gi = 0; gi < t.groups.size(); ++gi) {
    t.q_scale_max[gi] = float_to_half(0.01f * float(gi + 1));
    for (int64_t n = 0; n < N; ++n) set_scale_code(t, gi, n, rng() % 16);
    for (int64_t j = 0; j < t.groups[gi].rows; ++j)
      for (int64_t n = 0; n < N; ++n) set_code(t, gi, j, n, rng() % (1u << t.groups[gi].bits));
  }
  const Exl2Matrix m = t.view();
  const std::vector<double> want = test::naive_dequant(m);
  std::vector<float> got(static_cast<size_t>(t.padded_out * K));
  dequantize(m, got);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) ASSERT_NEAR(got[size_t(n * K + k)], want[size_t(n * K + k)], 1e-6) << n << "," << k;
  for (int64_t n = N; n < t.padded_out; ++n)
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(got[size_t(n * K + k)], 0.0f) << "padding column " << n;
  const auto inv = t.q_invperm();
  for (int64_t j = 0; j < K; ++j) EXPECT_EQ(inv[size_t(perm[size_t(j)])], j);
  EXPECT_EQ(8 * t.storage_bytes(), exl2_storage_bits(g, K, N));
}

TEST(Exl2Writer, RejectsLayoutsTheKernelsCannotRun) {
  const std::vector<std::pair<int, int64_t>> ascending = {{4, 32}, {6, 32}};
  EXPECT_THAT([&] { make_exl2_groups(ascending, 64); }, ::testing::ThrowsMessage<Error>(HasSubstr("must descend")));
  const std::vector<std::pair<int, int64_t>> ragged = {{4, 48}, {4, 16}};
  EXPECT_THAT([&] { make_exl2_groups(ragged, 64); }, ::testing::ThrowsMessage<Error>(HasSubstr("multiple of 32")));
  const std::vector<std::pair<int, int64_t>> short_cover = {{4, 32}};
  EXPECT_THAT([&] { make_exl2_groups(short_cover, 64); }, ::testing::ThrowsMessage<Error>(HasSubstr("cover 32 rows")));
  const std::vector<std::pair<int, int64_t>> width7 = {{7, 32}};
  EXPECT_THROW(make_exl2_groups(width7, 32), Error);
}

TEST(QuantizeLinear, OptionsFollowTheSegmentRuleAndDescend) {
  for (const auto& o : {head_quant_option(2), head_quant_option(3), head_quant_option(4), head_quant_option(5),
                        head_quant_option(6), head_quant_option(8)}) {
    const auto g = option_groups(o, 384);
    int64_t rows = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      rows += g[i].second;
      if (i) {
        EXPECT_LE(g[i].first, g[i - 1].first) << to_string(o);
      }
    }
    EXPECT_EQ(rows, 384) << to_string(o);
  }
  // 8:0.15,6:0.85@128 over 384 rows: ceil(57.6/128) = 1 group of 8-bit, then 2 of 6-bit.
  EXPECT_EQ(option_groups(head_quant_option(6), 384),
            (std::vector<std::pair<int, int64_t>>{{8, 128}, {6, 128}, {6, 128}}));
  EXPECT_THROW(head_quant_option(7), Error);
  EXPECT_THROW(option_groups(head_quant_option(6), 100), Error);
}

TEST(QuantizeLinear, ErrorShrinksWithBitsAndMatchesTheDequantizedWeights) {
  const int64_t K = 256, N = 96;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(N * K));
  for (auto& x : w) x = nd(rng);
  for (int64_t n = 0; n < N; ++n) w[size_t(n * K + 17)] *= 8.0f;  // one salient input feature
  const auto perm = saliency_order(w, N, K);
  EXPECT_EQ(perm[0], 17);
  double prev = INFINITY;
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const std::pair<int, int64_t> g[] = {{bits, 128}, {bits, 128}};
    double sq = 0;
    Exl2Tensors t = quantize_exl2(w, N, K, perm, g, &sq);
    std::vector<float> back(w.size());
    dequantize(t.view(), back);
    double check = 0, norm = 0;
    for (size_t i = 0; i < w.size(); ++i) check += double(back[i] - w[i]) * (back[i] - w[i]), norm += double(w[i]) * w[i];
    EXPECT_NEAR(check, sq, 1e-6 * norm) << bits;
    // Uniform-quantizer noise scale: error per weight ~ step²/12 with step ≈ 2·max/2^b.
    EXPECT_LT(sq, prev) << bits;
    EXPECT_LT(std::sqrt(sq / norm), 4.0 / std::ldexp(1.0, bits)) << bits;
    prev = sq;
  }
}

std::vector<float> prefill_logits(const fs::path& dir_path) {
  auto j = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"));
  const auto ids = j["input_ids"].get<std::vector<int32_t>>();
  ModelDir dir(dir_path);
  auto be = make_cpu_backend(2);
  Model m(dir, *be);
  KvLayout layout = m.kv_layout(KvFormat::f32, 16);
  const int pages = int((ids.size() + 15) / 16);
  auto pool = be->alloc_kv_pool(layout, pages);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  ForwardSeq s{ids, 0, table, true};
  return m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
}

// Options for the exl2-ref models: the calibration the tests use (self-generated, kRows x
// kLength tokens), 2 threads, the CPU.
constexpr int64_t kRows = 16, kLength = 256;
QuantizeOptions ref_options(double bpw, int head_bits = 6) {
  QuantizeOptions o;
  o.bpw = bpw;
  o.head_bits = head_bits;
  o.threads = 2;
  o.rope_table = [](const ModelConfig& c) { return make_rope_table(c.rope, int(c.head_dim), c.max_position_embeddings); };
  o.cal_rows = kRows;
  o.cal_length = kLength;
  o.backend = "cpu";  // the reference path the numbers in BENCHMARKS.md come from
  return o;
}

// Mean over positions of KL(softmax(ref) ‖ softmax(got)), in double.
double mean_kl(const std::vector<float>& ref, const std::vector<float>& got, int64_t vocab) {
  const int64_t rows = int64_t(ref.size()) / vocab;
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    auto log_softmax = [&](const std::vector<float>& v) {
      std::vector<double> out(v.begin() + r * vocab, v.begin() + (r + 1) * vocab);
      const double mx = *std::max_element(out.begin(), out.end());
      double s = 0;
      for (double x : out) s += std::exp(x - mx);
      for (double& x : out) x -= mx + std::log(s);
      return out;
    };
    const auto p = log_softmax(ref), q = log_softmax(got);
    for (int64_t i = 0; i < vocab; ++i) total += std::exp(p[size_t(i)]) * (p[size_t(i)] - q[size_t(i)]);
  }
  return total / double(rows);
}

// The 4.0 bpw conversion of an exl2-ref model with the tests' calibration, made once per process;
// its measurement.json serves the other bit rates.
const fs::path& converted_4bpw(const std::string& model) {
  static std::map<std::string, fs::path> done;
  auto it = done.find(model);
  if (it != done.end()) return it->second;
  const auto out = test::temp_dir(cat("quantize-", model, "-40")) / "q";
  quantize_model(test::shared_dir() / "data/exl2-ref" / model / "hf", out, ref_options(4.0));
  return done[model] = out;
}

// Suites named *Slow convert at the full test calibration (minutes of CPU); the sanitizer run
// skips them. Issue #22's target: at 4.0 bpw, KL(FP16 ‖ ours) ≤ 0.9 · KL(FP16 ‖ ExLlamaV2's converter's file)
// over the reference inputs, both run on our CPU backend, FP16 as transformers computed it. The
// files load in our engine, report the requested average bpw, and carry ExLlamaV2's tensor set.
class QuantizeKlSlow : public ::testing::TestWithParam<const char*> {};

TEST_P(QuantizeKlSlow, BeatsExllamav2sConverterAt4Bpw) {
  const std::string model = GetParam();
  EXL_REQUIRE_SHARED(cat("data/exl2-ref/", model, "/hf/config.json"));
  const auto base = test::shared_dir() / "data/exl2-ref" / model;
  const fs::path& out = converted_4bpw(model);
  ModelDir dir(out);
  const ModelSummary s = summarize_model(dir);
  EXPECT_LE(s.avg_bpw_layers, 4.0 + 1e-9);
  EXPECT_NEAR(s.avg_bpw_layers, 4.0, 0.1);
  EXPECT_EQ(s.head.format, WeightFormat::exl2);
  EXPECT_EQ(s.head_bits, 6);
  EXPECT_EQ(dir.config().quant_method, "exl2");
  EXPECT_TRUE(fs::exists(out / "tokenizer.model"));
  EXPECT_TRUE(fs::exists(out / "measurement.json"));
  EXPECT_FALSE(dir.has("model.layers.0.self_attn.q_proj.weight"));
  ModelDir theirs(base / "exl2-4.0bpw");
  auto sorted_names = [](const ModelDir& d) {
    auto v = d.tensor_names();
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted_names(dir), sorted_names(theirs));
  for (const auto& name : theirs.tensor_names()) {
    EXPECT_EQ(dir.require(name).info->dtype, theirs.require(name).info->dtype) << name;
    if (!name.ends_with(".q_weight") && !name.ends_with(".q_scale") && !name.ends_with(".q_scale_max") &&
        !name.ends_with(".q_groups")) {
      EXPECT_EQ(dir.require(name).info->shape, theirs.require(name).info->shape) << name;
    }
  }

  const auto ref = test::read_f32(base / "hf_logits_f32.bin");
  const auto ours = prefill_logits(out), exl = prefill_logits(base / "exl2-4.0bpw");
  ASSERT_EQ(ours.size(), ref.size());
  const double kl_ours = mean_kl(ref, ours, 512), kl_exl = mean_kl(ref, exl, 512);
  std::printf("[ quantize ] %s 4.0 bpw: achieved %.3f, KL(FP16 || ours) %.5f, KL(FP16 || ExLlamaV2) %.5f, ratio %.3f\n",
              model.c_str(), s.avg_bpw_layers, kl_ours, kl_exl, kl_ours / kl_exl);
  EXPECT_LE(kl_ours, 0.9 * kl_exl) << model;
}

INSTANTIATE_TEST_SUITE_P(All, QuantizeKlSlow, ::testing::Values("llama-gqa", "qwen2-bias", "llama3-rope"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Other bit rates from the 4.0 conversion's measurement (no new measurement): the KL from FP16
// falls with every bit and the average lands at the target.
TEST(QuantizeModelSlow, MeasurementServesOtherBitRates) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/hf/config.json");
  const auto base = test::shared_dir() / "data/exl2-ref/llama-gqa";
  const auto ref = test::read_f32(base / "hf_logits_f32.bin");
  double prev = mean_kl(ref, prefill_logits(converted_4bpw("llama-gqa")), 512);
  for (double bpw : {5.0, 8.0}) {
    QuantizeOptions o = ref_options(bpw);
    o.measurement = converted_4bpw("llama-gqa") / "measurement.json";
    const auto out = test::temp_dir(cat("quantize-llama-gqa-", bpw)) / "q";
    const QuantizeReport r = quantize_model(base / "hf", out, o);
    EXPECT_TRUE(r.measurement_reused);
    EXPECT_LE(r.layers_bpw, bpw + 1e-9);
    EXPECT_NEAR(summarize_model(ModelDir(out)).avg_bpw_layers, bpw, 0.25);
    const double kl = mean_kl(ref, prefill_logits(out), 512);
    std::printf("[ quantize ] llama-gqa %.1f bpw: achieved %.3f, KL %.5f\n", bpw, r.layers_bpw, kl);
    EXPECT_LT(kl, prev) << bpw;
    prev = kl;
  }
  EXPECT_LT(prev, 0.002);
}

TEST(QuantizeModelSlow, TiedHeadIsWrittenAsLmHead) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto out = test::temp_dir("quantize-tied") / "q";
  QuantizeOptions o = ref_options(5.0, 8);
  o.measurement = converted_4bpw("qwen2-bias") / "measurement.json";
  quantize_model(test::shared_dir() / "data/exl2-ref/qwen2-bias/hf", out, o);
  ModelDir dir(out);
  EXPECT_TRUE(dir.has("lm_head.q_weight"));
  EXPECT_TRUE(dir.has("model.embed_tokens.weight"));
  EXPECT_TRUE(dir.has("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_EQ(dir.require("model.embed_tokens.weight").info->dtype, DType::f16);
}

// Copies the llama-gqa HF directory with config.json edited by `edit`.
fs::path edited_copy(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const auto src = test::shared_dir() / "data/exl2-ref/llama-gqa/hf";
  const auto dst = test::temp_dir(name) / "hf";
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dst / e.path().filename());
  auto cfg = nlohmann::json::parse(test::read_file(dst / "config.json"));
  edit(cfg);
  fs::permissions(dst / "config.json", fs::perms::owner_write, fs::perm_options::add);
  test::write_file(dst / "config.json", cfg.dump());
  return dst;
}

TEST(QuantizeModel, BadInputIsAClearErrorAndLeavesNoOutput) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/hf/config.json");
  const auto hf = test::shared_dir() / "data/exl2-ref/llama-gqa/hf";
  const auto tmp = test::temp_dir("quantize-bad");
  auto expect_error = [&](const fs::path& in, QuantizeOptions o, const std::string& needle) {
    const auto out = tmp / "q";
    o.rope_table = ref_options(4.0).rope_table;
    EXPECT_THAT([&] { quantize_model(in, out, o); }, ::testing::ThrowsMessage<Error>(HasSubstr(needle)));
    EXPECT_FALSE(fs::exists(out)) << needle;
    EXPECT_FALSE(fs::exists(tmp / ".q.partial")) << needle;
  };
  expect_error(hf, ref_options(9.0, 6), "--bpw must be in [2.5, 8.0]");
  expect_error(hf, ref_options(2.0, 6), "--bpw must be in [2.5, 8.0]");
  expect_error(hf, ref_options(4.0, 7), "--head-bits must be 2, 3, 4, 5, 6 or 8");
  expect_error(edited_copy("quantize-arch", [](auto& c) { c["architectures"] = {"GPTNeoXForCausalLM"}; }), ref_options(4.0, 6),
               "unsupported architecture 'GPTNeoXForCausalLM'");
  expect_error(edited_copy("quantize-missing", [](auto& c) { c["num_hidden_layers"] = 4; }), ref_options(4.0, 6),
               "model.layers.3.self_attn.q_proj");
  expect_error(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw", ref_options(4.0, 6), "already quantized");
  fs::create_directories(tmp / "q");
  EXPECT_THAT([&] { quantize_model(hf, tmp / "q", ref_options(4.0)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("already exists")));
}

}  // namespace quantize_test
}  // namespace exl
