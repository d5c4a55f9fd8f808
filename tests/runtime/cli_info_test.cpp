// `exlagent info`: the JSON contract and the table, on the reference EXL2 and dense directories.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "runtime/cli/cli_commands.h"
#include "test_support.h"

namespace exl {
namespace cli_info_test {

std::string run_info(std::vector<std::string> args, int* rc) {
  testing::internal::CaptureStdout();
  *rc = cli_info(args);
  return testing::internal::GetCapturedStdout();
}

TEST(CliInfo, JsonOnExl2Models) {
  for (const char* model : {"llama-gqa", "qwen2-bias", "llama3-rope"}) {
    const auto dir = test::shared_dir() / "data/exl2-ref" / model / "exl2-4.0bpw";
    if (!std::filesystem::exists(dir / "output.safetensors")) GTEST_SKIP() << "shared asset missing: " << dir;
    SCOPED_TRACE(model);
    int rc = -1;
    auto j = nlohmann::json::parse(run_info({dir.string(), "--json"}, &rc));
    EXPECT_EQ(rc, 0);
    EXPECT_NEAR(j["avg_bpw_layers"].get<double>(), 4.0, 0.15);
    EXPECT_EQ(j["head_bits"], 6);
    EXPECT_GT(j["weight_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(j["num_layers"].get<int64_t>(), int64_t(j["layers"].size()));
    EXPECT_TRUE(j["kv_cache_bytes_per_1k"].contains("q4"));
  }
  const auto dir = test::shared_dir() / "data/exl2-ref/llama3-rope/exl2-4.0bpw";
  int rc = -1;
  auto j = nlohmann::json::parse(run_info({dir.string(), "--json"}, &rc));
  EXPECT_EQ(j["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(j["rope"]["type"], "llama3");
  EXPECT_EQ(j["rope"]["factor"], 8.0);
  EXPECT_EQ(j["rope"]["original_max_position_embeddings"], 64);
}

TEST(CliInfo, TableOnDenseModel) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/config.json");
  int rc = -1;
  std::string out = run_info({(test::shared_dir() / "models/stories260K-hf").string()}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("LlamaForCausalLM"), std::string::npos) << out;
  EXPECT_NE(out.find("avg bpw        32.000"), std::string::npos) << out;
  EXPECT_NE(out.find("model.embed_tokens: dense F32, 32 bits"), std::string::npos) << out;
}

TEST(CliInfo, MissingDirectoryIsAnError) {
  int rc = -1;
  EXPECT_THROW(run_info({"/nonexistent/model"}, &rc), Error);
  testing::internal::GetCapturedStdout();
}

}  // namespace cli_info_test
}  // namespace exl
