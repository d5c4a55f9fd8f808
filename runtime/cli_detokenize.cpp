#include <iostream>

#include "runtime/cli_args.h"
#include "runtime/cli_commands.h"

namespace exl {

int cli_detokenize(std::span<const std::string> args) {
  static const CommandSpec spec{"detokenize", "not implemented yet", {}, {}};
  return run_command(spec, args, [](const ParsedArgs&) {
    std::cerr << "exlagent detokenize: not implemented yet\n";
    return 1;
  });
}

}  // namespace exl
