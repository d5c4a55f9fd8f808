#include <algorithm>
#include <iostream>

#include "engine/formats/exl2_synth.h"
#include "engine/tokenizer/tokenizer.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

int cli_synth(std::span<const std::string> args) {
  static const CommandSpec spec{
      "synth",
      "Write a RANDOM-WEIGHT EXL2 model with a realistic layout (mixed bit widths like the converter's,\n"
      "act-order permutation, 6-bit head) for BENCHMARKS ONLY: it generates noise, not text. Shapes:\n"
      "llama2-7b, llama3-8b, llama3-70b, qwen2-7b, tiny.",
      {"OUT_DIR"},
      {{"--shape", "NAME", "model shape", true},
       {"--bpw", "B", "average bits per weight of the decoder layers (default 4.0)"},
       {"--head-bits", "B", "bits of the output head (default 6)"},
       {"--tokenizer", "DIR",
        "copy tokenizer files from this directory; the vocabulary grows to the tokenizer's where the shape's is smaller"},
       {"--seed", "S", "random seed (default 1)"}}};
  return run_command(spec, args, [](const ParsedArgs& a) {
    auto shape = synth_shape(*a.get("--shape"));
    if (!shape) throw UsageError(cat("--shape: unknown shape '", *a.get("--shape"), "'"));
    if (const auto dir = a.get_or("--tokenizer", ""); !dir.empty())
      shape->vocab = std::max<int64_t>(shape->vocab, load_tokenizer(dir)->vocab_size());
    write_synth_exl2(*shape, a.get_double("--bpw", 4.0), int(a.get_int("--head-bits", 6)), a.get_or("--tokenizer", ""),
                     a.positionals[0], uint64_t(a.get_int("--seed", 1)), [](size_t done, size_t total) {
                       if (done % 16 == 0 || done == total)
                         std::cerr << "\rsynth: " << done << "/" << total << " tensors" << std::flush;
                     });
    std::cerr << "\n";
    return 0;
  });
}

}  // namespace exl
