// The measurement file and the allocation: ExLlamaV2's candidate tables (exl2-engine.md §8.5),
// layout text round trips, measurement.json round trips and its malformed forms, and the
// allocation's optimum on cases where spending bits by best error-per-bit first is not optimal.
#include "engine/quantize/measurement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/quantize/quantize_alloc.h"
#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace quantize_measurement_test {

using ::testing::HasSubstr;

TEST(QuantizeMeasurement, CandidateTablesAreTheConvertersAndValidLayouts) {
  ASSERT_EQ(attention_candidates().size(), 19u);
  ASSERT_EQ(mlp_candidates().size(), 17u);
  for (const auto& c : attention_candidates()) EXPECT_EQ(c.size(), 4u);
  for (const auto& c : mlp_candidates()) EXPECT_EQ(c.size(), 3u);
  // Row 3 of the attention table: v gets 4:.1,3:.9@128 while q, k and o get 3:.1,2:.9@64.
  EXPECT_EQ(to_string(attention_candidates()[2][2]), "4:0.1@128,3@128");
  EXPECT_EQ(to_string(attention_candidates()[2][0]), "3:0.1@64,2@64");
  // MLP row 1's down: three segments of two group sizes. Over K = 1024: ceil(51.2/32) = 2 groups
  // of 6-bit 32 rows, ceil(204.8/64) = 4 of 3-bit 64 rows, then the 704 rows left as 11 2-bit groups.
  const auto g = option_groups(mlp_candidates()[0][2], 1024);
  ASSERT_EQ(g.size(), 2u + 4u + 11u);
  EXPECT_EQ(g[0], (std::pair<int, int64_t>{6, 32}));
  EXPECT_EQ(g[2], (std::pair<int, int64_t>{3, 64}));
  EXPECT_EQ(g.back(), (std::pair<int, int64_t>{2, 64}));
  for (const auto& table : {attention_candidates(), mlp_candidates()})
    for (const auto& c : table)
      for (const auto& o : c) {
        EXPECT_EQ(to_string(parse_quant_option(to_string(o))), to_string(o));
        EXPECT_NO_THROW(make_exl2_groups(option_groups(o, 384), 384)) << to_string(o);
      }
}

TEST(QuantizeMeasurement, BadLayoutTextIsAnErrorNamingIt) {
  for (const char* bad : {"4", "7@128", "4@100", "4:1.5@128", "4:x@128", "4@128,", "a@32"})
    EXPECT_THAT([&] { parse_quant_option(bad); }, ::testing::ThrowsMessage<Error>(HasSubstr(cat("'", bad, "'"))));
}

TEST(QuantizeMeasurement, JsonRoundTripsAndMalformedFilesAreErrors) {
  Measurement m{"LlamaForCausalLM layers 1", "self-generated", {}};
  m.blocks.push_back({"model.layers.0.self_attn", 0.5, {{attention_candidates()[6], 1000, 0.25, 0.5}}});
  m.blocks.push_back({"model.layers.0.mlp", 2.0, {{mlp_candidates()[0], 500, 1.5, 0.75}, {mlp_candidates()[16], 900, 0.01, 0.005}}});
  const auto file = test::temp_dir("measurement-json") / "measurement.json";
  save_measurement(m, file);
  const Measurement back = load_measurement(file);
  EXPECT_EQ(to_json(back), to_json(m));
  ASSERT_EQ(back.blocks.size(), 2u);
  EXPECT_EQ(back.blocks[1].options[1].bits, 900);
  EXPECT_EQ(to_string(back.blocks[1].options[0].layout[2]), to_string(mlp_candidates()[0][2]));
  EXPECT_DOUBLE_EQ(back.blocks[0].sensitivity, 0.5);

  auto expect_bad = [](const nlohmann::json& j, const std::string& needle) {
    EXPECT_THAT([&] { measurement_from_json(j, "m.json"); },
                ::testing::ThrowsMessage<Error>(HasSubstr(needle)))
        << j.dump();
  };
  nlohmann::json good = to_json(m);
  expect_bad(nlohmann::json::array(), "not an exlagent measurement");
  auto j = good;
  j["blocks"] = 3;
  expect_bad(j, "no \"blocks\" array");
  j = good;
  j["blocks"][0]["options"] = nlohmann::json::array();
  expect_bad(j, "without \"name\" or \"options\"");
  j = good;
  j["blocks"][1]["options"][0]["bits"] = 1.5;
  expect_bad(j, "integer \"bits\"");
  j = good;
  j["blocks"][1]["options"][0]["layout"][1] = "9@128";
  expect_bad(j, "'9@128'");
  j = good;
  j["blocks"][0]["sensitivity"] = -1;
  expect_bad(j, "negative");
}

TEST(QuantizeAlloc, MinimizesTotalErrorWithinBudget) {
  // Layer 0 gains 90 per 100 bits, layer 1 gains 10.
  std::vector<LayerOptions> layers = {{{100, 200, 300}, {100, 10, 5}}, {{100, 200}, {20, 10}}};
  EXPECT_EQ(allocate_bits(layers, 300), (std::vector<size_t>{1, 0}));
  EXPECT_EQ(allocate_bits(layers, 400), (std::vector<size_t>{1, 1}));
  EXPECT_EQ(allocate_bits(layers, 500), (std::vector<size_t>{2, 1}));
  EXPECT_THAT([&] { allocate_bits(layers, 199); }, ::testing::ThrowsMessage<Error>(HasSubstr("raise --bpw")));
  // Best error-per-bit first takes slot 1's upgrade (4/50 per bit) and then cannot afford slot
  // 0's (10/150): total 16. The optimum is slot 0's upgrade alone: total 10.
  const std::vector<LayerOptions> trap = {{{100, 250}, {10, 0}}, {{100, 150}, {10, 6}}};
  EXPECT_EQ(allocate_bits(trap, 350), (std::vector<size_t>{1, 0}));
  // Large budgets are counted in units; the result still never exceeds the budget.
  const std::vector<LayerOptions> big = {{{1000003, 2000003, 3000017}, {3, 2, 1}}, {{999999, 1999999}, {3, 1}}};
  const auto pick = allocate_bits(big, 4000002);
  EXPECT_LE(big[0].bits[pick[0]] + big[1].bits[pick[1]], 4000002);
  EXPECT_EQ(pick, (std::vector<size_t>{1, 1}));
}

}  // namespace quantize_measurement_test
}  // namespace exl
