#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

int cli_tokenize(std::span<const std::string> args) {
  static const CommandSpec spec{
      "tokenize",
      "Encode text with the tokenizer of DIR (a model or tokenizer directory) and print the ids as a JSON array.\n"
      "Exactly one of --text and --file gives the text. By default the bos token is added when the tokenizer\n"
      "adds one and special-token text such as <|eot_id|> becomes its id.",
      {"DIR"},
      {{"--text", "TEXT", "the text to encode"},
       {"--file", "FILE", "encode the bytes of FILE"},
       {"--no-special", "", "add no bos token and encode special-token text as plain text"}},
      1};
  return run_command(spec, args, [](const ParsedArgs& a) {
    if (a.has("--text") == a.has("--file")) throw UsageError("exactly one of --text and --file is required");
    std::string text;
    if (auto t = a.get("--text")) {
      text = *t;
    } else {
      std::string path = *a.get("--file");
      std::ifstream in(path, std::ios::binary);
      EXL_CHECK(in.good(), "runtime: tokenize: cannot open '", path, "'");
      std::stringstream ss;
      ss << in.rdbuf();
      EXL_CHECK(!in.bad(), "runtime: tokenize: cannot read '", path, "'");
      text = ss.str();
    }
    auto tok = load_tokenizer(a.positionals[0]);
    std::vector<int32_t> ids = tok->encode(text, !a.has("--no-special"));
    std::cout << nlohmann::json(ids).dump() << "\n";
    return 0;
  });
}

}  // namespace exl
