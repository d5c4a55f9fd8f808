// The table of `exlagent` subcommands. Each command lives in runtime/cli/cli_<name>.cpp and exposes
// one entry point taking the arguments after the command name and returning the exit code.
#pragma once
#include <span>
#include <string>

namespace exl {

struct CliCommand {
  const char* name;
  const char* summary;
  int (*run)(std::span<const std::string> args);
};

std::span<const CliCommand> cli_commands();

// Runs `command` on its arguments and returns the process exit code: the command's own, or 1 for
// an exception, reported on stderr as "exlagent <name>: error: <what>" for an exl::Error and
// "exlagent <name>: internal error: <what>" for anything else and for a GrammarError that no
// command turned into its own error (as every command reported one before GrammarError became an
// exl::Error).
int run_cli_command(const CliCommand& command, std::span<const std::string> args);

int cli_info(std::span<const std::string> args);
int cli_tokenize(std::span<const std::string> args);
int cli_detokenize(std::span<const std::string> args);
int cli_logits(std::span<const std::string> args);
int cli_generate(std::span<const std::string> args);
int cli_bench(std::span<const std::string> args);
int cli_synth(std::span<const std::string> args);
int cli_quantize(std::span<const std::string> args);
int cli_serve(std::span<const std::string> args);
int cli_bench_sessions(std::span<const std::string> args);
int cli_grammar(std::span<const std::string> args);
int cli_bench_grammar(std::span<const std::string> args);  // `bench grammar` (runtime/cli/cli_grammar.cpp)
int cli_extract(std::span<const std::string> args);
int cli_batch(std::span<const std::string> args);
int cli_run(std::span<const std::string> args);
int cli_mcp_serve(std::span<const std::string> args);

}  // namespace exl
