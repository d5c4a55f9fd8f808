// `exlagent quantize`: the JSON report's contract (calibration source, per-block and per-linear
// rows, seconds per phase), progress with an ETA on stderr, a calibration file, a measurement
// reused, the backend the run took (auto), and bad options as errors naming the option.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "kernels/cuda_device.h"
#include "runtime/cli/cli_commands.h"
#include "test_support.h"

namespace exl {
namespace cli_quantize_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(CliQuantize, ReportsPhasesBlocksAndLayersAndReusesItsMeasurement) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = (test::shared_dir() / "data/exl2-ref/qwen2-bias/hf").string();
  const auto tmp = test::temp_dir("cli-quantize");
  std::string text;
  for (int i = 0; i < 60; ++i) text += cat("The little robot number ", i, " walked to the garden and sang a song.\n");
  test::write_file(tmp / "cal.txt", text);
  const auto r = test::run_cli(cli_quantize, {"--in", hf, "--out", (tmp / "a").string(), "--calibration",
                                              (tmp / "cal.txt").string(), "--cal-rows", "2", "--cal-length", "64",
                                              "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_THAT(j["calibration"].get<std::string>(), HasSubstr("file cal.txt (text): 2 x 64"));
  EXPECT_EQ(j["blocks"].size(), 4u);
  EXPECT_EQ(j["layers"].size(), 15u);
  EXPECT_EQ(j["blocks"][1]["name"], "model.layers.0.mlp");
  for (const char* phase : {"calibrate", "measure", "quantize", "write", "total"}) EXPECT_TRUE(j["seconds"].contains(phase)) << phase;
  EXPECT_FALSE(j["measurement_reused"].get<bool>());
  EXPECT_EQ(j["backend"], cuda_device_count() > 0 ? "cuda" : "cpu");  // --backend auto
  EXPECT_LE(j["layers_bpw"].get<double>(), 4.0);
  EXPECT_THAT(r.err, HasSubstr("quantize: measure"));
  EXPECT_THAT(r.err, HasSubstr("quantize: quantize"));
  EXPECT_TRUE(fs::exists(tmp / "a" / "measurement.json"));
  const auto cfg = nlohmann::json::parse(test::read_file(tmp / "a" / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["calibration"]["rows"], 2);
  EXPECT_THAT(cfg["quantization_config"]["calibration"]["dataset"].get<std::string>(), HasSubstr("cal.txt"));

  const auto b = test::run_cli(cli_quantize, {"--in", hf, "--out", (tmp / "b").string(), "--bpw", "6.0",
                                              "--calibration", (tmp / "cal.txt").string(), "--cal-rows", "2",
                                              "--cal-length", "64", "--measurement",
                                              (tmp / "a" / "measurement.json").string(), "--threads", "2"});
  ASSERT_EQ(b.code, 0) << b.error;
  const auto jb = nlohmann::json::parse(b.out);
  EXPECT_TRUE(jb["measurement_reused"].get<bool>());
  EXPECT_THAT(b.err, ::testing::Not(HasSubstr("quantize: measure")));
  EXPECT_GT(jb["layers_bpw"].get<double>(), j["layers_bpw"].get<double>() + 1.0);
}

TEST(CliQuantize, BadCalibrationOptionsAreErrors) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = (test::shared_dir() / "data/exl2-ref/qwen2-bias/hf").string();
  const auto tmp = test::temp_dir("cli-quantize-bad");
  auto r = test::run_cli(cli_quantize, {"--in", hf, "--out", (tmp / "a").string(), "--cal-length", "8"});
  EXPECT_THAT(r.error, HasSubstr("--cal-length at least 16"));
  r = test::run_cli(cli_quantize, {"--in", hf, "--out", (tmp / "a").string(), "--calibration", (tmp / "none.txt").string()});
  EXPECT_THAT(r.error, HasSubstr("cannot read"));
  test::write_file(tmp / "m.json", "{\"format\": \"exlagent-measurement-1\", \"blocks\": []}");
  r = test::run_cli(cli_quantize, {"--in", hf, "--out", (tmp / "a").string(), "--measurement", (tmp / "m.json").string()});
  EXPECT_THAT(r.error, HasSubstr("has 0 blocks; this model has 4"));
  r = test::run_cli(cli_quantize, {"--in", hf, "--out", (tmp / "a").string(), "--backend", "gpu"});
  EXPECT_THAT(r.error, HasSubstr("--backend must be cpu, cuda or auto, got 'gpu'"));
  EXPECT_FALSE(fs::exists(tmp / "a"));
}

}  // namespace cli_quantize_test
}  // namespace exl
