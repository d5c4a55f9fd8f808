// What `exlagent <command>` reports when its command throws (runtime/cli/cli_commands.h): the
// exit code and the stderr line, for each kind of exception. A GrammarError is an exl::Error
// (issue 26): a schema or regex the user gave that cannot be compiled is an error of the input,
// not an internal one.
#include <gtest/gtest.h>

#include "grammar/grammar_error.h"
#include "runtime/cli/cli_commands.h"

namespace exl {
namespace cli_commands_test {

struct Reported {
  int code;
  std::string err;
};

Reported run_command_with(int (*body)(std::span<const std::string>)) {
  const CliCommand c{"probe", "a test command", body};
  testing::internal::CaptureStderr();
  const int code = run_cli_command(c, {});
  return {code, testing::internal::GetCapturedStderr()};
}

TEST(CliCommands, ExceptionsBecomeExitCodeOneWithTheirKindsLine) {
  const Reported ok = run_command_with([](std::span<const std::string>) { return 3; });
  EXPECT_EQ(ok.code, 3);
  EXPECT_EQ(ok.err, "");
  const Reported error =
      run_command_with([](std::span<const std::string>) -> int { fail("runtime: probe: no such file 'x'"); });
  EXPECT_EQ(error.code, 1);
  EXPECT_EQ(error.err, "exlagent probe: error: runtime: probe: no such file 'x'\n");
  const Reported grammar =
      run_command_with([](std::span<const std::string>) -> int { grammar_fail("grammar: json_schema: /: bad"); });
  EXPECT_EQ(grammar.code, 1);
  EXPECT_EQ(grammar.err, "exlagent probe: error: grammar: json_schema: /: bad\n");
  const Reported budget = run_command_with(
      [](std::span<const std::string>) -> int { throw GrammarBudgetError("grammar: budget: too many states"); });
  EXPECT_EQ(budget.code, 1);
  EXPECT_EQ(budget.err, "exlagent probe: error: grammar: budget: too many states\n");
  const Reported other =
      run_command_with([](std::span<const std::string>) -> int { throw std::out_of_range("vector::at"); });
  EXPECT_EQ(other.code, 1);
  EXPECT_EQ(other.err, "exlagent probe: internal error: vector::at\n");
}

}  // namespace cli_commands_test
}  // namespace exl
