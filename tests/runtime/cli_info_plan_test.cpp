// `exlagent info --backend`: the memory plan in the table and in the JSON (engine/memory_plan.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/memory_plan.h"
#include "runtime/cli/cli_commands.h"
#include "test_support.h"

namespace exl {
namespace cli_info_plan_test {

std::string run_info(std::vector<std::string> args, int* rc) {
  testing::internal::CaptureStdout();
  *rc = cli_info(args);
  return testing::internal::GetCapturedStdout();
}

TEST(CliInfoPlan, CpuBackendPrintsThePlanWithoutADeviceLimit) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/config.json");
  const auto dir = test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw";
  const MemoryPlan plan = plan_memory(ModelDir(dir), {KvFormat::f32}, std::nullopt);
  int rc = -1;
  auto j = nlohmann::json::parse(run_info({dir.string(), "--json", "--backend", "cpu"}, &rc));
  EXPECT_EQ(rc, 0);
  ASSERT_TRUE(j.contains("memory_plan"));
  const auto& m = j["memory_plan"];
  EXPECT_EQ(m["weight_bytes"].get<int64_t>(), plan.weight_bytes);
  EXPECT_EQ(m["cache_format"], "f32");
  EXPECT_TRUE(m["cache_auto"].get<bool>());
  EXPECT_EQ(m["cache_pages"].get<int>(), plan.cache_pages);
  EXPECT_TRUE(m["fits"].get<bool>());
  EXPECT_FALSE(m.contains("device"));

  const std::string text = run_info({dir.string(), "--backend", "cpu", "--cache-pages", "7"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("memory plan\n"), std::string::npos) << text;
  EXPECT_NE(text.find("weights        " + format_bytes(plan.weight_bytes)), std::string::npos) << text;
  EXPECT_NE(text.find("7 pages of 64 tokens = 448 tokens, f32"), std::string::npos) << text;

  EXPECT_FALSE(nlohmann::json::parse(run_info({dir.string(), "--json"}, &rc)).contains("memory_plan"));
}

}  // namespace cli_info_plan_test
}  // namespace exl
