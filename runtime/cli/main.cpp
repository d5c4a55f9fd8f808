// exlagent: the single binary. Dispatches to the subcommands in runtime/cli/cli_commands.cpp.
#include <iostream>
#include <string>
#include <vector>

#include "runtime/cli/cli_commands.h"

namespace {

void print_help() {
  std::cout << "usage: exlagent <command> [options]\n\ncommands:\n";
  for (const auto& c : exl::cli_commands()) {
    std::string n = c.name;
    n.resize(14, ' ');
    std::cout << "  " << n << c.summary << "\n";
  }
  std::cout << "\n'exlagent <command> --help' describes a command.\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_help();
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_help();
    return 0;
  }
  for (const auto& c : exl::cli_commands()) {
    if (args[0] == c.name) return exl::run_cli_command(c, std::span<const std::string>(args).subspan(1));
  }
  std::cerr << "exlagent: error: unknown command '" << args[0] << "'\n";
  print_help();
  return 2;
}
