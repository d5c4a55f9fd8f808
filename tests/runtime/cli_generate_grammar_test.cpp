// `exlagent generate --json-schema / --regex / --seeds`: constrained outputs, the JSON-lines batch
// form, and schemas the grammar cannot enforce refused with the keyword named (exit 2).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/cli/cli_commands.h"
#include "cli_runner.h"
#include "test_support.h"

namespace exl {
namespace cli_generate_grammar_test {

constexpr auto run = test::run_cli;

std::vector<nlohmann::json> lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::stringstream ss(out);
  for (std::string l; std::getline(ss, l);) v.push_back(nlohmann::json::parse(l));
  return v;
}

TEST(CliGenerateGrammar, RegexSeedsBatchAndSchema) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  const std::string model = (test::shared_dir() / "models/stories260K-hf").string();
  auto r = run(cli_generate, {"--model", model, "--regex", "(Tim|Lily) (ran|sat)( fast)?", "--seeds", "1,2,3,4,5",
                              "--max-tokens", "30", "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  auto out = lines(r.out);
  ASSERT_EQ(out.size(), 5u);
  const std::regex re("(Tim|Lily) (ran|sat)( fast)?");
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i]["seed"], i + 1);
    EXPECT_EQ(out[i]["finish_reason"], "stop_token");
    EXPECT_TRUE(std::regex_match(out[i]["text"].get<std::string>(), re)) << out[i].dump();
  }
  const auto schema = test::binary_dir() / "cli_generate_grammar_schema.json";
  std::ofstream(schema) << R"({"type":"object","properties":{"n":{"type":"integer","minimum":3,"maximum":7}},
                              "required":["n"],"additionalProperties":false})";
  r = run(cli_generate, {"--model", model, "--json-schema", schema.string(), "--seed", "9", "--max-tokens", "20",
                         "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  auto v = nlohmann::json::parse(r.out);
  EXPECT_GE(v["n"].get<int>(), 3);
  EXPECT_LE(v["n"].get<int>(), 7);
  EXPECT_EQ(v.size(), 1u);
}

TEST(CliGenerateGrammar, UnenforceableConstraintsAreUsageErrors) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  const std::string model = (test::shared_dir() / "models/stories260K-hf").string();
  const auto schema = test::binary_dir() / "cli_generate_grammar_bad.json";
  std::ofstream(schema) << R"({"properties":{"a":{"$recursiveRef":"#meta"}}})";
  auto r = run(cli_generate, {"--model", model, "--json-schema", schema.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("'$recursiveRef'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/properties/a"), std::string::npos) << r.err;
  r = run(cli_generate, {"--model", model, "--regex", "(a)\\1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("regex"), std::string::npos) << r.err;
  EXPECT_EQ(run(cli_generate, {"--model", model, "--regex", "a", "--json-schema", schema.string()}).code, 2);
  EXPECT_EQ(run(cli_generate, {"--model", model, "--seeds", "1,x"}).code, 2);
  EXPECT_EQ(run(cli_generate, {"--model", model, "--seeds", "1", "--seed", "2"}).code, 2);
}

}  // namespace cli_generate_grammar_test
}  // namespace exl
