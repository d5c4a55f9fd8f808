// `exlagent tokenize` and `exlagent detokenize`: the exact output forms and the usage errors.
#include <gtest/gtest.h>

#include "kernels/error.h"
#include "runtime/cli/cli_commands.h"
#include "cli_runner.h"
#include "test_support.h"

namespace exl {
namespace cli_tokenize_test {

using test::CliResult;
constexpr auto run = test::run_cli;

class CliTokenize : public ::testing::Test {
 protected:
  void SetUp() override { EXL_REQUIRE_SHARED("models/mistral-tokenizer/tokenizer.json"); }
  std::string dir_ = (test::shared_dir() / "models/mistral-tokenizer").string();
};

TEST_F(CliTokenize, PrintsCompactJsonIds) {
  CliResult r = run(cli_tokenize, {dir_, "--text", "Hello world"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[1,22557,1526]\n");
  r = run(cli_tokenize, {dir_, "--text", "Hello world</s>", "--no-special"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("[22557,1526,"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(",2]"), std::string::npos) << r.out;
  r = run(cli_tokenize, {dir_, "--text", "Hello world</s>"});
  EXPECT_EQ(r.out, "[1,22557,1526,2]\n");
}

TEST_F(CliTokenize, ReadsFileBytes) {
  auto f = test::temp_dir("cli_tokenize") / "in.txt";
  test::write_file(f, "Hello world");
  CliResult r = run(cli_tokenize, {dir_, "--file", f.string()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[1,22557,1526]\n");
}

TEST_F(CliTokenize, UsageErrors) {
  for (auto args : std::vector<std::vector<std::string>>{{dir_},
                                                         {dir_, "--text", "a", "--file", "b"},
                                                         {dir_, "--text", "a", "--bogus"},
                                                         {"--text", "a"},
                                                         {dir_, "--text"}}) {
    CliResult r = run(cli_tokenize, args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.err.find("usage: exlagent tokenize DIR"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run(cli_tokenize, {"--help"}).code, 0);
  EXPECT_NE(run(cli_tokenize, {"--help"}).out.find("--no-special"), std::string::npos);
}

TEST_F(CliTokenize, MissingFileAndDirAreErrors) {
  CliResult r = run(cli_tokenize, {dir_, "--file", "/nonexistent/in.txt"});
  EXPECT_EQ(r.code, -1);
  EXPECT_NE(r.error.find("cannot open '/nonexistent/in.txt'"), std::string::npos) << r.error;
  r = run(cli_tokenize, {"/nonexistent-dir", "--text", "a"});
  EXPECT_EQ(r.code, -1);
  EXPECT_NE(r.error.find("'/nonexistent-dir' is not a directory"), std::string::npos) << r.error;
}

TEST_F(CliTokenize, Detokenize) {
  CliResult r = run(cli_detokenize, {dir_, "[1,22557,1526]"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>Hello world\n");
  EXPECT_EQ(run(cli_detokenize, {dir_, "[1,22557,1526,2]", "--skip-special"}).out, "Hello world\n");
  EXPECT_EQ(run(cli_detokenize, {dir_, "[]"}).out, "\n");
  for (auto ids : {"[1,", "{\"a\":1}", "[1.5]", "[\"x\"]", "[99999999999]"}) {
    CliResult bad = run(cli_detokenize, {dir_, ids});
    EXPECT_EQ(bad.code, 2) << ids;
    EXPECT_NE(bad.err.find("IDS_JSON"), std::string::npos) << bad.err;
  }
  CliResult r2 = run(cli_detokenize, {dir_, "[32000]"});
  EXPECT_EQ(r2.code, -1);
  EXPECT_NE(r2.error.find("token id 32000 out of range"), std::string::npos) << r2.error;
  EXPECT_EQ(run(cli_detokenize, {dir_}).code, 2);
}

}  // namespace cli_tokenize_test
}  // namespace exl
