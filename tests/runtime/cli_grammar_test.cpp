// `exlagent grammar check` exit codes and `exlagent grammar maskbench` on a fixed MaskBench subset
// with the Llama 3 tokenizer (every 16th file of the five target splits, to keep CI short; the
// full-split numbers are in docs/grammar-bench.md).
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "runtime/cli/cli_commands.h"
#include "test_support.h"

namespace exl {
namespace cli_grammar_test {

struct CliResult {
  int code;
  std::string out, err;
};

CliResult run(std::vector<std::string> args) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int code = cli_grammar(args);
  std::string out = testing::internal::GetCapturedStdout();
  return {code, out, testing::internal::GetCapturedStderr()};
}

class CliGrammar : public ::testing::Test {
 protected:
  void SetUp() override { EXL_REQUIRE_SHARED("models/llama3-tokenizer/tokenizer.json"); }
  std::string tok_ = (test::shared_dir() / "models/llama3-tokenizer").string();
  std::filesystem::path tmp_ = test::temp_dir("cli_grammar");
};

TEST_F(CliGrammar, CheckExitCodes) {
  std::string schema = (tmp_ / "s.json").string();
  test::write_file(schema, R"({"type":"object","properties":{"n":{"type":"integer","maximum":9}},"required":["n"]})");
  EXPECT_EQ(run({"check", "--tokenizer", tok_, "--json-schema", schema, "--text", R"({"n":7})"}).code, 0);
  EXPECT_EQ(run({"check", "--tokenizer", tok_, "--json-schema", schema, "--text", R"({"n":17})"}).code, 1);
  EXPECT_EQ(run({"check", "--tokenizer", tok_, "--json-schema", schema, "--text", R"({"n":7)"}).code, 1);
  EXPECT_EQ(run({"check", "--tokenizer", tok_, "--json-schema", schema, "--text", "{ \"n\": 7 }"}).code, 1);
  EXPECT_EQ(run({"check", "--tokenizer", tok_, "--json-schema", schema, "--text", "{ \"n\": 7 }", "--whitespace",
                 "flexible"}).code, 0);
  EXPECT_EQ(run({"check", "--tokenizer", tok_, "--regex", "[0-9]{2,3}-x", "--text", "123-x"}).code, 0);
  CliResult bad = run({"check", "--tokenizer", tok_, "--regex", "(a)\\1", "--text", "aa"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("backreferences"), std::string::npos) << bad.err;
  test::write_file(schema, R"({"type":"object","$recursiveRef":"#x"})");
  bad = run({"check", "--tokenizer", tok_, "--json-schema", schema, "--text", "{}"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "grammar: json_schema: #: unsupported keyword '$recursiveRef'\n");
}

TEST_F(CliGrammar, MaskBenchSubsetNeverAcceptsInvalid) {
  EXL_REQUIRE_SHARED("data/jsonschemabench/maskbench/data");
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(test::shared_dir() / "data/jsonschemabench/maskbench/data"))
    files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<std::string> args{"maskbench", "--tokenizer", tok_};
  std::map<std::string, int> seen;
  for (const auto& f : files) {
    std::string name = std::filesystem::path(f).filename().string();
    std::string split = name.substr(0, name.find("---"));
    if (split != "Glaiveai2K" && split != "Github_trivial" && split != "Github_easy" && split != "Snowplow" &&
        split != "Github_medium")
      continue;
    if (seen[split]++ % 16 == 0) args.push_back(f);
  }
  CliResult r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  std::printf("%s\n", j.dump(1).c_str());
  EXPECT_EQ(j["invalid_accepted"], 0);
  for (auto& [split, s] : j["splits"].items()) {
    double rate = s["passing"].get<double>() / s["schemas"].get<double>();
    EXPECT_GE(rate, 0.80) << split;
    EXPECT_GE(s["compile_ms_max"].get<double>(), s["compile_ms_p99"].get<double>()) << split;
  }
  // the slowest files, slowest first, each with where its time went
  ASSERT_EQ(j["slowest"].size(), 10u);
  double prev = 1e300;
  for (const auto& f : j["slowest"]) {
    double t = f["compile_ms"].get<double>() + f["masks_ms"].get<double>();
    EXPECT_LE(t, prev) << f;
    const std::string file = "/" + f["file"].get<std::string>();
    EXPECT_TRUE(std::any_of(args.begin(), args.end(), [&](const std::string& a) { return a.ends_with(file); })) << f;
    prev = t;
  }
}

}  // namespace cli_grammar_test
}  // namespace exl
