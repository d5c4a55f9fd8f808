// `exlagent generate`, `logits` and `bench`: the contract forms against the reference outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "runtime/cli/cli_commands.h"
#include "cli_runner.h"
#include "test_support.h"

namespace exl {
namespace cli_engine_test {

using test::CliResult;
constexpr auto run = test::run_cli;

TEST(CliGenerate, Stories260kGreedyAndSeededMatchLlama2c) {
  EXL_REQUIRE_SHARED("models/stories260K/reference/reference.json");
  const std::string model = (test::shared_dir() / "models/stories260K-hf").string();
  auto r = run(cli_generate, {"--model", model, "--temperature", "0", "--max-tokens", "200"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  EXPECT_EQ(r.out, test::read_file(test::shared_dir() / "models/stories260K/reference/expected_greedy_200.txt"));
  r = run(cli_generate, {"--model", model, "--sampler", "llama2c", "--temperature", "1", "--top-p", "0.9", "--seed",
                         "133742", "--max-tokens", "256"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  auto ref = nlohmann::json::parse(test::read_file(test::shared_dir() / "models/stories260K/reference/reference.json"));
  EXPECT_EQ(r.out, ref["cases"][2]["text"].get<std::string>());
}

TEST(CliGenerate, UsageAndInputErrors) {
  EXPECT_EQ(run(cli_generate, {"--prompt", "x"}).code, 2);  // --model missing
  EXPECT_EQ(run(cli_generate, {"--model", "m", "--max-tokens", "abc"}).code, 2);
  EXPECT_EQ(run(cli_generate, {"--model", "m", "--frobnicate"}).code, 2);
  auto r = run(cli_generate, {"--model", (test::binary_dir() / "no-such-model").string()});
  EXPECT_EQ(r.code, -1);
  EXPECT_NE(r.error.find("not a directory"), std::string::npos) << r.error;
  EXPECT_EQ(run(cli_generate, {"--help"}).code, 0);
}

TEST(CliLogits, AllModesMatchTheReference) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf_logits_f32.bin");
  const auto base = test::shared_dir() / "data/exl2-ref/qwen2-bias";
  const auto out = test::temp_dir("cli_logits") / "l.f32";
  auto ref = test::read_f32(base / "hf_logits_f32.bin");
  for (std::string mode : {"prefill", "decode", "chunked:7"}) {
    auto r = run(cli_logits, {"--model", (base / "hf").string(), "--ids-json",
                              (test::shared_dir() / "data/exl2-ref/input_ids.json").string(), "--out", out.string(),
                              "--mode", mode});
    ASSERT_EQ(r.code, 0) << r.err << r.error;
    auto got = test::read_f32(out);
    ASSERT_EQ(got.size(), ref.size()) << mode;
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    EXPECT_LT(std::sqrt(num / den), 1e-4) << mode;
  }
  EXPECT_EQ(run(cli_logits, {"--model", "m", "--ids-json", "x", "--out", "y", "--mode", "chunked:0"}).code, 2);
  EXPECT_EQ(run(cli_logits, {"--model", "m", "--ids-json", "x", "--out", "y", "--cache", "q3"}).code, -1);
}

TEST(CliBench, JsonReportHasEverySection) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  auto r = run(cli_bench, {"--model", (test::shared_dir() / "models/stories260K-hf").string(), "--prefill", "64",
                           "--batch", "1,2", "--context", "16", "--decode-steps", "2", "--repeat", "1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prefill"].size(), 1u);
  EXPECT_EQ(j["decode"].size(), 2u);
  EXPECT_GT(j["decode"][1]["tokens_per_s"].get<double>(), 0);
  EXPECT_GE(j["prefix_cache"]["warm_cached_tokens"].get<int>(), 192);
  EXPECT_EQ(j["decode"][0]["temperature"].get<double>(), 0.0);
  EXPECT_EQ(j["decode"][0]["top_p"].get<double>(), 1.0);
  for (const auto& [flag, value] : {std::pair<const char*, const char*>{"--temperature", "nan"}, {"--top-p", "0"},
                                     {"--top-p", "1.5"}})
    EXPECT_EQ(run(cli_bench, {"--model", "m", flag, value}).code, 2) << flag << " " << value;
}

TEST(CliBench, PrefixCaseReusesThePrefixForANewSuffix) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  auto r = run(cli_bench, {"--model", (test::shared_dir() / "models/stories260K-hf").string(), "--prefill", "8",
                           "--batch", "1", "--context", "8", "--decode-steps", "1", "--repeat", "1",
                           "--prefix-len", "128", "--suffix-len", "10", "--json"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  const auto pc = nlohmann::json::parse(r.out)["prefix_cache"];
  EXPECT_EQ(pc["prompt_tokens"].get<int>(), 138);
  EXPECT_EQ(pc["prefix_tokens"].get<int>(), 128);
  EXPECT_EQ(pc["warm_cached_tokens"].get<int>(), 128);  // the prefix's two full pages, not the new suffix
  EXPECT_EQ(pc["warm_runs"].get<int>(), 1);
  EXPECT_EQ(pc["warm_ttft_s"].get<double>(), pc["warm_ttft_median_s"].get<double>());
  // More warm runs, each with a suffix of its own: none finds an earlier run's suffix cached.
  r = run(cli_bench, {"--model", (test::shared_dir() / "models/stories260K-hf").string(), "--prefill", "8", "--batch", "1",
                      "--context", "8", "--decode-steps", "1", "--repeat", "3", "--prefix-len", "64", "--suffix-len", "64",
                      "--json"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  const auto pc3 = nlohmann::json::parse(r.out)["prefix_cache"];
  EXPECT_EQ(pc3["warm_runs"].get<int>(), 3);
  EXPECT_EQ(pc3["warm_cached_tokens"].get<int>(), 64);
  EXPECT_GT(pc3["warm_ttft_s"].get<double>(), 0.0);
  EXPECT_LE(pc3["warm_ttft_s"].get<double>(), pc3["warm_ttft_median_s"].get<double>());
  EXPECT_EQ(run(cli_bench, {"--model", "m", "--suffix-len", "0"}).code, 2);
}

TEST(CliSynth, ASmallShapeTakesTheTokenizersVocabulary) {
  // The tiny shape's own vocabulary (512) is smaller than Llama 3's: the model written with that
  // tokenizer must embed and predict every one of its ids, so that it serves Llama 3 prompts.
  EXL_REQUIRE_SHARED("models/llama3-tokenizer/tokenizer.json");
  const auto tok_dir = test::shared_dir() / "models/llama3-tokenizer";
  const auto out = test::binary_dir() / "cli-synth-tiny-llama3";
  std::filesystem::remove_all(out);
  auto r = run(cli_synth, {out.string(), "--shape", "tiny", "--tokenizer", tok_dir.string()});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  const auto config = nlohmann::json::parse(test::read_file(out / "config.json"));
  const auto tok = nlohmann::json::parse(test::read_file(tok_dir / "tokenizer.json"));
  int64_t n_ids = 0;
  for (const auto& [piece, id] : tok["model"]["vocab"].items()) n_ids = std::max<int64_t>(n_ids, id.get<int64_t>() + 1);
  for (const auto& t : tok["added_tokens"]) n_ids = std::max<int64_t>(n_ids, t["id"].get<int64_t>() + 1);
  EXPECT_EQ(config["vocab_size"].get<int64_t>(), n_ids);
  r = run(cli_generate, {"--model", out.string(), "--prompt", "Hello, world. Tokenizers!", "--max-tokens", "2",
                         "--temperature", "0"});
  EXPECT_EQ(r.code, 0) << r.err << r.error;
  std::filesystem::remove_all(out);
}

}  // namespace cli_engine_test
}  // namespace exl
