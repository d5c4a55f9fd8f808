#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/job_engine.h"
#include "runtime/mcp/mcp_job_tools.h"
#include "runtime/mcp/mcp_stdio.h"
#include "tools/builtin_tools.h"

namespace exl {

namespace {

namespace fs = std::filesystem;

const CommandSpec& mcp_serve_spec() {
  static const CommandSpec s{
      "mcp-serve",
      "Serve exlagent's work as Model Context Protocol tools over stdio (JSON-RPC 2.0, one message\n"
      "per line on stdin and stdout; logs go to stderr): `extract` (a document and a JSON Schema ->\n"
      "the object, as `exlagent extract`) and `agent` (one agent turn with the built-in tools -> the\n"
      "final answer). Calls run one at a time; the command ends when stdin does (runtime/mcp/README.md).",
      {},
      with_job_engine_flags(
          {{"--model", "DIR", "model directory (default: the embedded demo model of the checkout the binary was built in)"}},
          {{"--read-root", "DIR", "offer the read_file tool to `agent`, reading only under DIR"},
           {"--max-tokens", "N", "tokens per agent generation (default 512)"},
           {"--transcripts", "DIR", "keep agent transcripts in DIR (default: a temporary directory, removed at exit)"}}),
      0};
  return s;
}

// examples/demo-model/model of the checkout whose build directory holds this binary.
std::string mcp_serve_default_model() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path())
      if (fs::is_directory(dir / "examples/demo-model/model")) return (dir / "examples/demo-model/model").string();
  throw UsageError("no --model given and the embedded demo model (examples/demo-model/model) was not found "
                   "above the binary's directory");
}

struct McpServeTempDir {
  fs::path path;
  ~McpServeTempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

}  // namespace

int cli_mcp_serve(std::span<const std::string> args) {
  return run_command(mcp_serve_spec(), args, [](const ParsedArgs& a) {
    const long long max_tokens = a.get_int("--max-tokens", 512);
    if (max_tokens <= 0) throw UsageError("--max-tokens must be positive");
    BuiltinToolOptions tool_opts;
    tool_opts.read_root = a.get_or("--read-root", "");
    ToolRegistry tools;
    for (auto& t : make_builtin_tools(tool_opts)) tools.add(std::move(t));

    JobEngine engine(job_engine_options(a, a.has("--model") ? *a.get("--model") : mcp_serve_default_model(), 1));

    McpServeTempDir temp;
    McpJobToolsOptions to;
    to.agent_max_tokens = max_tokens;
    if (a.has("--transcripts")) {
      to.transcript_dir = *a.get("--transcripts");
    } else {
      temp.path = fs::temp_directory_path() / cat("exlagent-mcp-", getpid());
      to.transcript_dir = temp.path;
    }
    std::error_code ec;
    fs::create_directories(to.transcript_dir, ec);
    EXL_CHECK(!ec, "runtime: mcp-serve: cannot create the transcript directory '", to.transcript_dir.string(),
              "': ", ec.message());

    McpServerInfo info;
    info.version = "0.1.0";
    info.instructions = cat("exlagent serving the model '", engine.model_id(),
                            "': `extract` returns JSON valid under the schema you give; `agent` runs one agent turn.");
    McpServerProtocol protocol(mcp_job_tools(engine, tools, to), info);
    std::cerr << "exlagent mcp-serve: model '" << engine.model_id() << "' ready; MCP over stdio\n";
    signal(SIGPIPE, SIG_IGN);
    serve_mcp_stdio(protocol, std::cin, std::cout);
    return 0;
  });
}

}  // namespace exl
