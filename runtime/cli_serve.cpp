#include <fstream>
#include <iostream>
#include <sstream>

#include "runtime/cli_args.h"
#include "runtime/cli_commands.h"
#include "runtime/server.h"
#include "runtime/session_hub.h"

namespace exl {

namespace {

const CommandSpec& serve_spec() {
  static const CommandSpec s{
      "serve",
      "Serve a model over the OpenAI-compatible HTTP API (POST /v1/chat/completions, POST /v1/completions,\n"
      "GET /v1/models, GET /health, GET /metrics). Listens on loopback unless told otherwise; a non-loopback\n"
      "address needs an API key. SIGINT/SIGTERM stop accepting, finish running generations, then exit.\n"
      "Chat messages and tools are tokenized as text (special-token text in them stays text); a\n"
      "/v1/completions prompt is the client's own template and has its special-token text parsed.",
      {},
      {{"--model", "DIR", "model directory", true},
       {"--host", "H", "address to listen on (default 127.0.0.1)"},
       {"--port", "P", "port (default 8421; 0 = any free port, printed on start)"},
       {"--api-key", "KEY", "require this key (Authorization: Bearer KEY or x-api-key: KEY)"},
       {"--api-key-file", "F", "read the key from a file (first line)"},
       {"--allowed-host", "H", "also accept this Host header value ('*' = any)", false, true},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--threads", "N", "CPU threads for the cpu backend (default: all)"},
       {"--cache-pages", "N", "KV cache pages of 64 tokens (default: what fits in free device memory; 512 on cpu)"},
       {"--max-sessions", "N", "generations in flight before 503, and live agent sessions (default 64)"},
       {"--max-body", "BYTES", "request body limit (default 8388608)"},
       {"--chat-template", "NAME", "llama3, llama3.0, chatml, qwen2.5, mistral or llama2 (default: detect)"},
       {"--session-dir", "DIR", "agent session transcripts (default: <temp>/exlagent-sessions)"},
       {"--read-root", "DIR", "offer the read_file tool to agent sessions, reading only under DIR"},
       {"--agent-script", "FILE", "tests/benchmarks only: JSON array of replies forced on agent turns 1, 2, ..."}}};
  return s;
}

std::string read_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(cat("--api-key-file: cannot read '", path, "'"));
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.empty()) throw UsageError(cat("--api-key-file: '", path, "' holds no key"));
  return line;
}

}  // namespace

int cli_serve(std::span<const std::string> args) {
  return run_command(serve_spec(), args, [](const ParsedArgs& a) {
    ServerOptions o;
    o.model_dir = *a.get("--model");
    o.host = a.get_or("--host", o.host);
    const long long port = a.get_int("--port", o.port);
    if (port < 0 || port > 65535) throw UsageError("--port must be in [0, 65535]");
    o.port = uint16_t(port);
    if (a.has("--api-key") && a.has("--api-key-file")) throw UsageError("give --api-key or --api-key-file, not both");
    if (a.has("--api-key")) o.api_key = *a.get("--api-key");
    if (a.has("--api-key-file")) o.api_key = read_key_file(*a.get("--api-key-file"));
    if (a.has("--api-key") && o.api_key.empty()) throw UsageError("--api-key must not be empty");
    if (auto it = a.values.find("--allowed-host"); it != a.values.end()) o.allowed_hosts = it->second;
    o.backend = a.get_or("--backend", o.backend);
    o.cpu_threads = int(a.get_int("--threads", 0));
    o.cache_pages = int(a.get_int("--cache-pages", o.cache_pages));
    o.max_sessions = int(a.get_int("--max-sessions", o.max_sessions));
    const long long body = a.get_int("--max-body", (long long)o.max_body_bytes);
    if (body <= 0) throw UsageError("--max-body must be positive");
    o.max_body_bytes = size_t(body);
    o.chat_template = a.get_or("--chat-template", "");
    o.session_dir = a.get_or("--session-dir", "");
    o.read_root = a.get_or("--read-root", "");
    if (a.has("--cache-pages") && o.cache_pages <= 0) throw UsageError("--cache-pages must be positive");
    if (o.max_sessions <= 0) throw UsageError("--max-sessions must be positive");

    auto state = std::make_shared<ServerState>(o);
    if (a.has("--agent-script"))
      state->sessions().set_turn_constraint(
          scripted_turns(state->tokenizer(), read_agent_script(*a.get("--agent-script"))));
    Server server(state);
    server.start();
    std::cerr << "exlagent: serving '" << state->model_id() << "' (" << to_string(state->chat_template()->family())
              << " template) on http://" << (o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host) << ":"
              << server.port() << (o.api_key.empty() ? " (no API key)" : "") << std::endl;
    server.run_until_signal();
    std::cerr << "exlagent: stopped" << std::endl;
    return 0;
  });
}

}  // namespace exl
