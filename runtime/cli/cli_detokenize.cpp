#include <iostream>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

int cli_detokenize(std::span<const std::string> args) {
  static const CommandSpec spec{
      "detokenize",
      "Decode IDS_JSON, a JSON array of token ids such as '[1,22557,1526]', with the tokenizer of DIR (a model\n"
      "or tokenizer directory) and print the text followed by a newline. Special tokens appear as their text.",
      {"DIR", "IDS_JSON"},
      {{"--skip-special", "", "leave special tokens (bos, eos, ...) out of the text"}},
      2};
  return run_command(spec, args, [](const ParsedArgs& a) {
    nlohmann::json j = nlohmann::json::parse(a.positionals[1], nullptr, false);
    if (j.is_discarded() || !j.is_array())
      throw UsageError("IDS_JSON must be a JSON array of token ids, e.g. '[1,22557,1526]'");
    std::vector<int32_t> ids;
    for (const auto& v : j) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
        throw UsageError("IDS_JSON must hold only integer token ids, got " + v.dump());
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    auto tok = load_tokenizer(a.positionals[0]);
    std::cout << tok->decode(ids, a.has("--skip-special")) << "\n";
    return 0;
  });
}

}  // namespace exl
