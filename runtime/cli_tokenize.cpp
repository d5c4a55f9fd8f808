#include <iostream>

#include "runtime/cli_args.h"
#include "runtime/cli_commands.h"

namespace exl {

int cli_tokenize(std::span<const std::string> args) {
  static const CommandSpec spec{"tokenize", "not implemented yet", {}, {}};
  return run_command(spec, args, [](const ParsedArgs&) {
    std::cerr << "exlagent tokenize: not implemented yet\n";
    return 1;
  });
}

}  // namespace exl
