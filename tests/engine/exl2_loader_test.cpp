// EXL2 loading and dequantization: against ExLlamaV2-converted reference files
// (../shared/data/exl2-ref/*/exl2-4.0bpw/dequant_checks.json), against synthetic matrices packed
// bit by bit here, and malformed files that must fail with a clear message.
#include "engine/formats/exl2_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/formats/linear_loader.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/error.h"
#include "kernels/half.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace exl {
namespace exl2_loader_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* const k_ref_models[] = {"llama-gqa", "qwen2-bias", "llama3-rope"};

std::map<std::string, LinearSpec> all_linears(const ModelConfig& c) {
  std::map<std::string, LinearSpec> out;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (auto& s : decoder_layer_linears(c, l)) out[s.name] = s;
  out["lm_head"] = head_linear(c);
  return out;
}

TEST(Exl2Loader, ReferenceModelsMatchDequantChecks) {
  for (const char* model : k_ref_models) {
    const fs::path dir = test::shared_dir() / "data/exl2-ref" / model / "exl2-4.0bpw";
    if (!fs::exists(dir / "dequant_checks.json")) GTEST_SKIP() << "shared asset missing: " << dir;
    ModelDir md(dir);
    const json checks = json::parse(test::read_file(dir / "dequant_checks.json"));
    const auto specs = all_linears(md.config());
    ASSERT_EQ(checks["tensors"].size(), specs.size()) << model;
    for (const auto& [name, c] : checks["tensors"].items()) {
      SCOPED_TRACE(std::string(model) + ": " + name);
      const LinearSpec& spec = specs.at(name);
      LinearWeights w = load_linear(md, name, spec.in_features, spec.out_features);
      const auto& m = std::get<Exl2Matrix>(w);
      const int64_t rows = c["shape_out_in_padded"][0], cols = c["shape_out_in_padded"][1];
      ASSERT_EQ(rows, m.padded_out);
      ASSERT_EQ(cols, spec.in_features);
      std::vector<float> out(size_t(rows * cols));
      dequantize(m, out);
      double sum = 0, sumsq = 0;
      for (float v : out) sum += v, sumsq += double(v) * v;
      const double ref_sum = c["sum"], ref_sumsq = c["sumsq"];
      // Scales are exact in float, so the sums agree to rounding; samples use the spec's 2e-3.
      EXPECT_NEAR(sum, ref_sum, 1e-6 * std::max(std::abs(ref_sum), std::sqrt(ref_sumsq)));
      EXPECT_NEAR(sumsq, ref_sumsq, 1e-6 * ref_sumsq);
      ASSERT_EQ(c["samples"].size(), 256u);
      for (const auto& s : c["samples"]) {
        const int64_t n = s[0], k = s[1];
        const double ref = s[2];
        ASSERT_NEAR(out[n * cols + k], ref, 2e-3 * std::abs(ref) + 1e-9) << "[" << n << ", " << k << "]";
      }
      if (m.padded_out > m.out_features) {
        for (int64_t i = m.out_features * cols; i < rows * cols; ++i) ASSERT_EQ(out[i], 0.0f);
      }
    }
  }
}

TEST(Exl2Loader, TiedHeadIsStoredUnderLmHead) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/exl2-4.0bpw/output.safetensors");
  ModelDir md(test::shared_dir() / "data/exl2-ref/qwen2-bias/exl2-4.0bpw");
  EXPECT_TRUE(md.config().tie_word_embeddings);
  EXPECT_EQ(resolve_linear_prefix(md, "lm_head"), "lm_head");
  const Exl2Matrix m = std::get<Exl2Matrix>(load_linear(md, "lm_head", 256, 512));
  EXPECT_EQ(m.groups.front().bits, 8);
  EXPECT_EQ(m.groups.back().bits, 6);
  const Exl2Matrix q = std::get<Exl2Matrix>(load_linear(md, "model.layers.0.self_attn.q_proj", 256, 256));
  ASSERT_EQ(q.bias.size(), 256u);
  auto raw = md.require("model.layers.0.self_attn.q_proj.bias");
  const auto* h = reinterpret_cast<const uint16_t*>(raw.data.data());
  for (int i = 0; i < 256; ++i) ASSERT_EQ(q.bias[i], half_to_float(h[i]));
}

// ---------------------------------------------------------------------------------------------
// Synthetic EXL2 matrices, packed here bit by bit straight from the §1.5–1.8 description.

struct Synth {
  int64_t k = 0, n = 0, np = 0;
  std::vector<std::pair<int, int64_t>> groups;  // (bits, rows), in file order
  std::vector<uint32_t> q;                      // [K][Np], permuted row order
  std::vector<int> s4;                          // [G][Np]
  std::vector<uint16_t> smax;                   // [G], fp16 bits
  std::vector<int32_t> invperm;                 // [K]
};

Synth make_synth(uint32_t seed, int64_t k, int64_t n, std::vector<std::pair<int, int64_t>> groups) {
  std::mt19937 rng(seed);
  Synth s;
  s.k = k, s.n = n, s.np = (n + 31) / 32 * 32, s.groups = std::move(groups);
  s.q.resize(size_t(k * s.np));
  int64_t row = 0;
  for (auto [bits, rows] : s.groups) {
    for (int64_t j = row; j < row + rows; ++j)
      for (int64_t c = 0; c < s.np; ++c) s.q[j * s.np + c] = c < n ? rng() % (1u << bits) : 1u << (bits - 1);
    row += rows;
    for (int64_t c = 0; c < s.np; ++c) s.s4.push_back(int(rng() % 16));
    s.smax.push_back(float_to_half(0.01f + float(rng() % 1000) * 1e-4f));
  }
  std::vector<int32_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  s.invperm.resize(size_t(k));
  for (int64_t j = 0; j < k; ++j) s.invperm[perm[j]] = int32_t(j);
  return s;
}

int64_t q_rows_of(const Synth& s) {
  int64_t words = 0;
  for (auto [bits, rows] : s.groups) words += (rows * bits + 31) / 32;
  return words;
}

void add_synth(test::SafetensorsWriter& w, const std::string& prefix, const Synth& s, bool invperm_i16 = false) {
  const int64_t qr = q_rows_of(s);
  std::vector<uint32_t> qw(size_t(qr * s.np), 0);
  std::vector<int16_t> qg;
  int64_t row = 0, word_row = 0;
  for (auto [bits, rows] : s.groups) {
    qg.push_back(int16_t(bits));
    qg.push_back(int16_t(word_row));
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t c = 0; c < s.np; ++c)
        for (int b = 0; b < bits; ++b)
          if ((s.q[(row + j) * s.np + c] >> b) & 1) {
            const int64_t bit = j * bits + b;
            qw[(word_row + bit / 32) * s.np + c] |= 1u << (bit % 32);
          }
    row += rows;
    word_row += (rows * bits + 31) / 32;
  }
  const int64_t g = int64_t(s.groups.size());
  std::vector<uint32_t> qs(size_t(g * s.np / 8), 0);
  for (int64_t i = 0; i < g * s.np; ++i) qs[i / 8] |= uint32_t(s.s4[i]) << (4 * (i % 8));
  w.add(prefix + ".q_weight", "I32", {qr, s.np}, qw);
  w.add(prefix + ".q_scale", "I32", {g, s.np / 8}, qs);
  w.add(prefix + ".q_scale_max", "F16", {g}, s.smax);
  w.add(prefix + ".q_groups", "I16", {2 * g}, qg);
  if (invperm_i16)
    w.add(prefix + ".q_invperm", "I16", {s.k}, std::vector<int16_t>(s.invperm.begin(), s.invperm.end()));
  else
    w.add(prefix + ".q_invperm", "I32", {s.k}, s.invperm);
}

// W[c, k] straight from the definition.
double expected(const Synth& s, int64_t c, int64_t k) {
  const int64_t j = s.invperm[k];
  int64_t start = 0;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    auto [bits, rows] = s.groups[g];
    if (j < start + rows) {
      const double scale = double((s.s4[g * s.np + c] + 1) * (s.s4[g * s.np + c] + 1)) *
                           double(half_to_float(s.smax[g])) / 256.0;
      return (double(s.q[j * s.np + c]) - double(1 << (bits - 1))) * scale;
    }
    start += rows;
  }
  return NAN;
}

const std::string k_up = "model.layers.0.mlp.up_proj";

void check_round_trip(const std::string& dir_name, const Synth& s, bool invperm_i16) {
  fs::path dir = test::temp_dir(dir_name);
  test::SafetensorsWriter w;
  add_synth(w, k_up, s, invperm_i16);
  test::write_model_dir(dir, test::tiny_llama_config(s.k, s.n), w);
  ModelDir md(dir);
  Exl2Matrix m = load_exl2_matrix(md, k_up, s.k, s.n);
  EXPECT_EQ(m.padded_out, s.np);
  EXPECT_EQ(m.q_rows, q_rows_of(s));
  ASSERT_EQ(m.groups.size(), s.groups.size());
  int64_t start = 0;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    EXPECT_EQ(m.groups[g].bits, s.groups[g].first);
    EXPECT_EQ(m.groups[g].rows, s.groups[g].second);
    EXPECT_EQ(m.groups[g].row_start, start);
    start += s.groups[g].second;
  }
  EXPECT_TRUE(m.bias.empty());
  std::vector<float> out(static_cast<size_t>(s.np * s.k));
  dequantize(m, out);
  for (int64_t c = 0; c < s.np; ++c)
    for (int64_t k = 0; k < s.k; ++k) {
      const double e = c < s.n ? expected(s, c, k) : 0.0;
      ASSERT_NEAR(out[c * s.k + k], e, 1e-6 * std::abs(e)) << "[" << c << ", " << k << "]";
    }
  std::vector<float> unpadded(static_cast<size_t>(s.n * s.k));
  dequantize(m, unpadded);
  EXPECT_TRUE(std::equal(unpadded.begin(), unpadded.end(), out.begin()));
}

TEST(Exl2Loader, SyntheticEveryWidthRoundTrips) {
  // Every width and a 2-bit group of 16 rows; N = 80 is padded to 96.
  Synth s = make_synth(7, 336, 80, {{8, 32}, {6, 64}, {5, 32}, {4, 96}, {3, 32}, {2, 16}, {2, 64}});
  for (bool i16 : {false, true}) {
    SCOPED_TRACE(i16 ? "I16 invperm" : "I32 invperm");
    check_round_trip("exl2_every_width", s, i16);
  }
}

TEST(Exl2Loader, SyntheticShortLastGroupRoundTrips) {
  check_round_trip("exl2_short_last_4", make_synth(8, 56, 32, {{6, 32}, {4, 24}}), false);  // 4-bit last group: 3 words
  check_round_trip("exl2_short_last_8", make_synth(9, 52, 7, {{8, 32}, {8, 20}}), false);   // 8-bit last group: 5 words
}

// ---------------------------------------------------------------------------------------------
// Malformed files: each case edits a valid synthetic layer (K = 64, N = 80, groups 6/2/2-bit
// of 32/16/16 rows, so q_weight is [8, 96]) and names the substrings the error must contain.

struct BadCase {
  std::string what;
  std::function<void(test::SafetensorsWriter&, json&)> edit;
  std::vector<std::string> expect;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.what; }

std::string load_error(const BadCase& c) {
  Synth s = make_synth(11, 64, 80, {{6, 32}, {2, 16}, {2, 16}});
  test::SafetensorsWriter w;
  add_synth(w, k_up, s);
  w.add(k_up + ".bias", "F16", {80}, std::vector<uint16_t>(80, float_to_half(0.5f)));
  json config = test::tiny_llama_config(64, 80);
  c.edit(w, config);
  std::string dir_name = "exl2_malformed_" + c.what;
  std::replace(dir_name.begin(), dir_name.end(), ' ', '_');
  fs::path dir = test::temp_dir(dir_name);
  test::write_model_dir(dir, config, w);
  try {
    ModelDir md(dir);
    load_linear(md, k_up, 64, 80);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void set_groups(test::SafetensorsWriter& w, std::vector<int16_t> g) {
  w.add(k_up + ".q_groups", "I16", {int64_t(g.size())}, g);
}

TEST(Exl2Loader, ValidBaseCaseLoads) {
  EXPECT_EQ(load_error({"none", [](auto&, auto&) {}, {}}), "");
}

std::vector<BadCase> malformed_cases() {
  const std::string qg = "tensor '" + k_up + ".q_groups'";
  const std::string qi = "tensor '" + k_up + ".q_invperm'";
  const std::string qw = "tensor '" + k_up + ".q_weight'";
  const std::string file = "'output.safetensors'";
  return {
      {"groups not descending", [](auto& w, auto&) { set_groups(w, {6, 0, 2, 6, 3, 7}); },
       {file, qg, "not sorted by bit width descending: group 2 has 3 bits after group 1 with 2"}},
      {"bit width 7", [](auto& w, auto&) { set_groups(w, {7, 0, 2, 6, 2, 7}); },
       {file, qg, "group 0 has bit width 7, expected one of 2, 3, 4, 5, 6, 8"}},
      {"bit width negative", [](auto& w, auto&) { set_groups(w, {6, 0, -2, 6, 2, 7}); },
       {qg, "group 1 has bit width -2"}},
      {"first group not at row 0", [](auto& w, auto&) { set_groups(w, {6, 1, 2, 6, 2, 7}); },
       {qg, "group 0 starts at q_weight row 1, expected 0"}},
      {"qrow_start not increasing", [](auto& w, auto&) { set_groups(w, {6, 0, 2, 6, 2, 6}); },
       {qg, "qrow_start is not strictly increasing: group 2"}},
      {"last group past q_weight", [](auto& w, auto&) { set_groups(w, {6, 0, 2, 6, 2, 9}); },
       {qg, "last group starts at q_weight row 9 but q_weight has only 8 rows"}},
      {"group not whole rows", [](auto& w, auto&) { set_groups(w, {6, 0, 2, 5, 2, 7}); },
       {qg, "group 0 spans 5 q_weight rows, which is not a whole number of 6-bit rows"}},
      {"group rows not a multiple of 32", [](auto& w, auto&) { set_groups(w, {4, 0, 4, 6}); },
       {qg, "group 0 has 48 rows at 4 bits, not a multiple of 32"}},
      {"odd q_groups length", [](auto& w, auto&) { set_groups(w, {6, 0, 2}); },
       {qg, "has 3 elements, expected a positive even count"}},
      {"rows do not add up",
       [](auto& w, auto&) {
         auto* t = w.find(k_up + ".q_weight");
         t->shape[0] = 9;
         t->bytes += std::string(96 * 4, '\0');
       },
       {qg, "groups cover 80 rows", "expected in_features = 64"}},
      {"invperm duplicate",
       [](auto& w, auto&) { w.template data<int32_t>(k_up + ".q_invperm")[5] = w.template data<int32_t>(k_up + ".q_invperm")[9]; },
       {file, qi, "is not a permutation: value"}},
      {"invperm out of range", [](auto& w, auto&) { w.template data<int32_t>(k_up + ".q_invperm")[3] = 64; },
       {qi, "is not a permutation: entry 3 is 64, outside [0, 64)"}},
      {"invperm wrong length",
       [](auto& w, auto&) { w.add(k_up + ".q_invperm", "I32", {63}, std::vector<int32_t>(63, 0)); },
       {qi, "has shape [63], expected [64]"}},
      {"q_weight wrong dtype", [](auto& w, auto&) { w.find(k_up + ".q_weight")->dtype = "F32"; },
       {file, qw, "has dtype F32, expected I32"}},
      {"q_weight unpadded columns",
       [](auto& w, auto&) { w.add(k_up + ".q_weight", "I32", {8, 80}, std::vector<int32_t>(8 * 80, 0)); },
       {qw, "has 80 columns, expected 96 (out_features 80 padded to 32)"}},
      {"q_weight rank 1", [](auto& w, auto&) { w.find(k_up + ".q_weight")->shape = {8 * 96}; },
       {qw, "has rank 1, expected 2"}},
      {"missing q_scale_max", [](auto& w, auto&) { w.remove(k_up + ".q_scale_max"); },
       {"layer '" + k_up + "': missing tensor '" + k_up + ".q_scale_max'"}},
      {"q_scale shape mismatch",
       [](auto& w, auto&) { w.add(k_up + ".q_scale", "I32", {3, 10}, std::vector<int32_t>(30, 0)); },
       {"tensor '" + k_up + ".q_scale'", "has shape [3, 10], expected [3, 12]"}},
      {"q_scale_max wrong dtype", [](auto& w, auto&) { w.find(k_up + ".q_scale_max")->dtype = "BF16"; },
       {"tensor '" + k_up + ".q_scale_max'", "has dtype BF16, expected F16"}},
      {"q_scale_max not finite", [](auto& w, auto&) { w.template data<uint16_t>(k_up + ".q_scale_max")[1] = 0x7c00; },
       {"tensor '" + k_up + ".q_scale_max'", "group 1 has non-finite value inf"}},
      {"bias wrong shape",
       [](auto& w, auto&) { w.add(k_up + ".bias", "F16", {96}, std::vector<uint16_t>(96, 0)); },
       {"tensor '" + k_up + ".bias'", "has shape [96], expected [80]"}},
      {"bias not float", [](auto& w, auto&) { w.find(k_up + ".bias")->dtype = "I16"; },
       {"tensor '" + k_up + ".bias'", "has dtype I16, expected F16, BF16 or F32"}},
      {"no weights at all",
       [](auto& w, auto&) {
         for (const char* t : {".q_weight", ".q_scale", ".q_scale_max", ".q_groups", ".q_invperm", ".bias"})
           w.remove(k_up + t);
         w.add("other.weight", "F16", {1}, std::vector<uint16_t>(1, 0));
       },
       {"no weights for layer '" + k_up + "'"}},
      {"config missing key", [](auto&, auto& c) { c.erase("hidden_size"); },
       {"config.json", "missing key 'hidden_size'"}},
      {"config unsupported architecture", [](auto&, auto& c) { c["architectures"] = {"GPT2LMHeadModel"}; },
       {"config.json", "unsupported architecture 'GPT2LMHeadModel'"}},
  };
}

class Exl2Malformed : public testing::TestWithParam<BadCase> {};

TEST_P(Exl2Malformed, GivesClearError) {
  const BadCase& c = GetParam();
  std::string msg = load_error(c);
  ASSERT_FALSE(msg.empty()) << "no error";
  for (const auto& e : c.expect) EXPECT_NE(msg.find(e), std::string::npos) << "message: " << msg << "\nmissing: " << e;
}

INSTANTIATE_TEST_SUITE_P(Exl2Loader, Exl2Malformed, testing::ValuesIn(malformed_cases()),
                         [](const testing::TestParamInfo<BadCase>& info) {
                           std::string name = info.param.what;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(Exl2Loader, TruncatedFileIsRejected) {
  Synth s = make_synth(3, 64, 80, {{6, 32}, {2, 16}, {2, 16}});
  test::SafetensorsWriter w;
  add_synth(w, k_up, s);
  fs::path dir = test::temp_dir("exl2_truncated");
  test::write_file(dir / "config.json", test::tiny_llama_config(64, 80).dump());
  std::string bytes = w.serialize();
  test::write_file(dir / "output.safetensors", bytes.substr(0, bytes.size() - 100));
  try {
    ModelDir md(dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("output.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated file?"), std::string::npos) << msg;
  }
}

TEST(Exl2Loader, MisalignedDataIsRejected) {
  Synth s = make_synth(5, 64, 80, {{6, 32}, {2, 16}, {2, 16}});
  test::SafetensorsWriter w;
  add_synth(w, k_up, s);
  fs::path dir = test::temp_dir("exl2_misaligned");
  test::write_file(dir / "config.json", test::tiny_llama_config(64, 80).dump());
  test::write_file(dir / "output.safetensors", w.serialize(2));  // data section starts at 8·m + 2
  ModelDir md(dir);
  try {
    load_linear(md, k_up, 64, 80);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte aligned"), std::string::npos) << e.what();
  }
}

}  // namespace exl2_loader_test
}  // namespace exl
