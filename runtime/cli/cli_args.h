// Command-line parsing for `exlagent <command>`: declared flags and positionals, `--help`,
// and usage errors (unknown flags, missing values or arguments) as exl::UsageError.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/error.h"

namespace exl {

// A usage mistake; main prints the message and the command's usage line, exits 2.
struct UsageError : Error {
  using Error::Error;
};

struct FlagSpec {
  std::string name;        // "--max-tokens"
  std::string value_name;  // "N"; empty for a boolean switch
  std::string help;
  bool required = false;
  bool repeatable = false;
};

struct CommandSpec {
  std::string name;                     // "info"
  std::string summary;                  // one line
  std::vector<std::string> positionals;  // "MODEL_DIR"; a trailing "..." accepts any number
  std::vector<FlagSpec> flags;
  size_t min_positionals = 0;

  std::string usage() const;  // "usage: exlagent info MODEL_DIR [--json]"
  std::string help() const;   // usage + summary + one line per flag
};

struct ParsedArgs {
  std::vector<std::string> positionals;
  std::map<std::string, std::vector<std::string>> values;  // flag -> values ("" for switches)
  bool help = false;

  bool has(std::string_view flag) const { return values.count(std::string(flag)) > 0; }
  std::optional<std::string> get(std::string_view flag) const;
  std::string get_or(std::string_view flag, std::string dflt) const;
  // Typed getters throw UsageError naming the flag when the value does not parse.
  long long get_int(std::string_view flag, long long dflt) const;
  double get_double(std::string_view flag, double dflt) const;
};

// Parses args (without the program and command names). Throws UsageError.
ParsedArgs parse_args(const CommandSpec& spec, std::span<const std::string> args);

}  // namespace exl

#include <functional>

#include <nlohmann/json.hpp>

namespace exl {

// Runs one command: parses `args` by `spec`, prints help on --help (exit 0), prints the error and
// the usage line on a UsageError (exit 2), and otherwise returns body's exit code. exl::Error
// propagates to main (exit 1).
int run_command(const CommandSpec& spec, std::span<const std::string> args,
                const std::function<int(const ParsedArgs&)>& body);

// The JSON Schema in file `path` (keys in file order). Throws exl::Error "runtime: COMMAND: ..."
// naming the file when it cannot be read or is not JSON.
nlohmann::ordered_json read_schema_file(const std::string& path, std::string_view command);

struct McpServerConfig;
// The --mcp (or `flag`'s) NAME=COMMAND ARGS... and NAME=URL values (tools/mcp/mcp_client.h); a
// malformed one is a UsageError.
std::vector<McpServerConfig> mcp_server_flags(const ParsedArgs& a, const std::string& flag = "--mcp");
// The --mcp line of a command's flag table.
inline constexpr const char* k_mcp_flag = "NAME=COMMAND ARGS... | NAME=URL";
inline constexpr const char* k_mcp_help =
    "offer an MCP server's tools as NAME__tool: COMMAND ARGS... starts it (stdio; split on spaces,\n"
    "'...' and \"...\" group words), http://HOST:PORT/PATH connects to it (Streamable HTTP);\n"
    "tools/mcp/README.md; repeatable";

struct ModelHostOptions;
// The model flags of the commands that load one (--model, --backend, --gpu-split, --tensor-parallel,
// --threads, --cache) as
// ModelHostOptions (runtime/model_host.h); a bad --cache throws exl::Error.
ModelHostOptions model_host_options(const ParsedArgs& a);

// --gpu-split's value ("" when absent), checked by parse_gpu_split (runtime/backend_select.h) for
// `backend`; a bad one is a UsageError.
std::string gpu_split_flag(const ParsedArgs& a, const std::string& backend);
// The --gpu-split line of a command's flag table.
inline constexpr const char* k_gpu_split_help =
    "split the model's layers over devices: GB each device may hold (weights, KV cache, scratch), in "
    "device order (20,24), or auto (every CUDA device, by free memory); the KV cache is as many pages as "
    "every device can hold for its layers (engine/layer_split.h)";

// --tensor-parallel's value (0 when absent): a positive rank count, not with --gpu-split; else a
// UsageError.
int tensor_parallel_flag(const ParsedArgs& a);
inline constexpr const char* k_tensor_parallel_help =
    "split every layer's attention heads and MLP columns over N devices (engine/tensor_parallel.h; "
    "collectives through host memory for now)";

enum class Speculation : uint8_t;
// --speculate none|ngram|draft|auto (default auto); anything else, or draft without
// --draft-model, is a UsageError.
Speculation speculation_flag(const ParsedArgs& a);
// The --speculate line of a command's flag table.
inline constexpr const char* k_speculate_help =
    "speculative decoding: none, ngram, draft or auto (default auto: for greedy jobs that are not "
    "pipelined, e.g. under a grammar, the draft model when one is given, else prompt lookup; the same "
    "output in fewer forward passes)";
// The --draft-model line of a command's flag table.
inline constexpr const char* k_draft_model_help =
    "a smaller model with the same tokenizer that drafts tokens for --speculate draft/auto";

// A flag table of the commands that run jobs on a JobEngine (runtime/job_engine.h): `before`, then
// --backend, --gpu-split, --tensor-parallel, --threads, --speculate, --draft-model and --chat-template, then `after`.
std::vector<FlagSpec> with_job_engine_flags(std::vector<FlagSpec> before, std::vector<FlagSpec> after = {});

struct JobEngineOptions;
// Those flags as JobEngineOptions for the model in `model_dir`, `max_batch_seqs` jobs at once.
// Throws UsageError as speculation_flag does.
JobEngineOptions job_engine_options(const ParsedArgs& a, std::string model_dir, int max_batch_seqs);

}  // namespace exl
