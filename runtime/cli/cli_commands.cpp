#include "runtime/cli/cli_commands.h"

#include <array>
#include <iostream>

#include "kernels/error.h"

namespace exl {

std::span<const CliCommand> cli_commands() {
  static const std::array table = {
      CliCommand{"info", "describe a model directory (architecture, dims, weight formats, bits, sizes)", cli_info},
      CliCommand{"tokenize", "encode text to token ids (JSON array)", cli_tokenize},
      CliCommand{"detokenize", "decode a JSON array of token ids to text", cli_detokenize},
      CliCommand{"generate", "generate text from a prompt, streamed to stdout", cli_generate},
      CliCommand{"bench", "measure prefill and decode speed and the prefix-cache speed-up", cli_bench},
      CliCommand{"synth", "write a random-weight EXL2 model for benchmarks only", cli_synth},
      CliCommand{"quantize", "convert an FP16/BF16/FP32 Hugging Face checkpoint to EXL2", cli_quantize},
      CliCommand{"serve", "serve a model over the OpenAI-compatible HTTP API", cli_serve},
      CliCommand{"bench-sessions", "N concurrent agent sessions over loopback WebSocket: throughput, TTFT", cli_bench_sessions},
      CliCommand{"grammar", "check a text against a JSON Schema or regex grammar; run MaskBench files", cli_grammar},
      CliCommand{"extract", "extract one JSON object per document under a JSON Schema", cli_extract},
      CliCommand{"batch", "run a JSONL file of chat requests (OpenAI batch or simple form), resumable", cli_batch},
      CliCommand{"run", "run a scripted multi-turn workflow file", cli_run},
      CliCommand{"mcp-serve", "offer extract and agent as Model Context Protocol tools over stdio", cli_mcp_serve},
      CliCommand{"logits", "write the model's logits for given token ids (float32 file)", cli_logits},
  };
  return table;
}

int run_cli_command(const CliCommand& command, std::span<const std::string> args) {
  try {
    return command.run(args);
  } catch (const Error& e) {
    std::cerr << "exlagent " << command.name << ": error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "exlagent " << command.name << ": internal error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace exl
