#include <iostream>

#include "runtime/cli_args.h"
#include "runtime/cli_commands.h"

namespace exl {

int cli_info(std::span<const std::string> args) {
  static const CommandSpec spec{"info", "not implemented yet", {}, {}};
  return run_command(spec, args, [](const ParsedArgs&) {
    std::cerr << "exlagent info: not implemented yet\n";
    return 1;
  });
}

}  // namespace exl
