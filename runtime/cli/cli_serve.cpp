#include <fstream>
#include <iostream>
#include <sstream>

#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/server/server.h"
#include "runtime/server/session_hub.h"

namespace exl {

namespace {

const CommandSpec& serve_spec() {
  static const CommandSpec s{
      "serve",
      "Serve a model over the OpenAI-compatible HTTP API (POST /v1/chat/completions, POST /v1/completions,\n"
      "POST /v1/responses, GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics) and agent\n"
      "sessions over WebSocket (/v1/ws).\n"
      "\n"
      "Access: listens on loopback unless told otherwise; a non-loopback --host without an API key is\n"
      "refused (exit 2). Every request, and the WebSocket upgrade, needs a Host that is loopback, the bind\n"
      "address or an --allow-host value, and an Origin (sent by browsers) that is this server's own\n"
      "http://127.0.0.1:PORT, http://localhost:PORT, http://[::1]:PORT or an --allow-origin value; others\n"
      "get 403. With a key, every route but /health needs it (/metrics too, unless --metrics-public).\n"
      "\n"
      "Limits: request body --max-body; prompts --max-prompt-bytes of text, then --max-prompt-tokens (400\n"
      "context_length_exceeded; an agent turn ends with an error event); a request must arrive within\n"
      "--read-timeout; --max-sessions generations in flight (then 503 with Retry-After) and live agent\n"
      "sessions; WebSocket messages 4 MiB (close 1009) arriving within --ws-message-timeout of their first\n"
      "frame (else the connection is closed), 256 frames per second per connection (-32012),\n"
      "sessions/send content 1 MiB or --max-prompt-bytes (-32013), 16 MiB of unsent frames per connection (close 1008); numbers\n"
      "in requests are range-checked (no wrap); read_file reads files up to 1 MiB under --read-root only.\n"
      "Transcripts are 0600 files in a private 0700 --session-dir, the oldest deleted beyond\n"
      "--session-retain files or --session-retain-bytes. A response_format/tool grammar past a --grammar-*\n"
      "limit is a 400 grammar_budget_exceeded; a client that disconnects while its grammar compiles cancels\n"
      "the compilation. Chat messages and tools are tokenized as text (special-token text in them stays\n"
      "text); a /v1/completions prompt is the client's own template and has its special-token text parsed.\n"
      "\n"
      "SIGINT/SIGTERM: stop accepting, refuse new requests (503, WebSocket -32017), let running generations\n"
      "and agent runs finish (up to 30 s), send WebSocket clients their last events and a 1001 close, exit.",
      {},
      {{"--model", "DIR", "model directory", true},
       {"--host", "H", "address to listen on (default 127.0.0.1)"},
       {"--port", "P", "port (default 8421; 0 = any free port, printed on start)"},
       {"--api-key", "KEY", "require this key (Authorization: Bearer KEY or x-api-key: KEY)"},
       {"--api-key-file", "F", "read the key from a file (first line)"},
       {"--allow-host", "H", "also accept this Host header value ('*' = any); others get 403", false, true},
       {"--allowed-host", "H", "the same as --allow-host (older name)", false, true},
       {"--allow-origin", "O", "also accept requests from this web origin (https://app.example:8443; '*' = any)",
        false, true},
       {"--metrics-public", "", "serve GET /metrics without the API key"},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--gpu-split", "GB,GB...|auto", k_gpu_split_help},
       {"--tensor-parallel", "N", k_tensor_parallel_help},
       {"--threads", "N", "CPU threads for the cpu backend (default: all)"},
       {"--speculate", "MODE", k_speculate_help},
       {"--draft-model", "DIR", k_draft_model_help},
       {"--cache-pages", "N", "KV cache pages of 64 tokens (default: what fits in free device memory; 512 on cpu)"},
       {"--max-sessions", "N", "generations in flight before 503, and live agent sessions (default 64)"},
       {"--max-body", "BYTES", "request body limit (default 8388608)"},
       {"--max-prompt-tokens", "N",
        "prompt tokens a request or agent turn may have (default: the context, or the KV cache if smaller)"},
       {"--max-prompt-bytes", "BYTES",
        "bytes of prompt text (message contents and tool-call arguments, a completions prompt, an agent's\n"
        "conversation), checked before tokenizing (default 1048576)"},
       {"--read-timeout", "S", "seconds one HTTP request (headers and body) may take to arrive (default 60)"},
       {"--ws-message-timeout", "S",
        "seconds one WebSocket message may take to arrive from its first frame (default 60; then close)"},
       {"--grammar-max-states", "N", "automaton states one request's output grammar may build in all (default 8000000)"},
       {"--grammar-max-mb", "MB", "memory one request's grammar compilation may use (default 256)"},
       {"--grammar-timeout-ms", "MS", "time one request's grammar compilation may take (default 5000)"},
       {"--chat-template", "NAME", "llama3, llama3.0, chatml, qwen2.5, mistral or llama2 (default: detect)"},
       {"--session-dir", "DIR",
        "agent session transcripts, a private 0700 directory (default: <temp>/exlagent-sessions-<uid>)"},
       {"--session-retain", "N", "transcripts kept, oldest deleted first (default 1000; 0 = no limit)"},
       {"--session-retain-bytes", "BYTES", "bytes of transcripts kept (default 268435456; 0 = no limit)"},
       {"--read-root", "DIR", "offer the read_file tool to agent sessions, reading only under DIR"},
       {"--mcp", k_mcp_flag, k_mcp_help, false, true},
       {"--mcp-session", k_mcp_flag,
        "an MCP server that a WebSocket session may start for itself (sessions/create \"mcpServers\":\n"
        "[NAME]): its own process or HTTP session, stopped when the session closes; repeatable", false, true},
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
    for (const char* flag : {"--allow-host", "--allowed-host"})
      if (auto it = a.values.find(flag); it != a.values.end())
        o.allowed_hosts.insert(o.allowed_hosts.end(), it->second.begin(), it->second.end());
    if (auto it = a.values.find("--allow-origin"); it != a.values.end()) o.allowed_origins = it->second;
    o.metrics_public = a.has("--metrics-public");
    o.backend = a.get_or("--backend", o.backend);
    o.gpu_split = gpu_split_flag(a, o.backend);
    o.tensor_parallel = tensor_parallel_flag(a);
    o.cpu_threads = int(a.get_int("--threads", 0));
    o.speculate = speculation_flag(a);
    o.draft_model = a.get_or("--draft-model", "");
    o.cache_pages = int(a.get_int("--cache-pages", o.cache_pages));
    o.max_sessions = int(a.get_int("--max-sessions", o.max_sessions));
    const long long body = a.get_int("--max-body", (long long)o.max_body_bytes);
    if (body <= 0) throw UsageError("--max-body must be positive");
    o.max_body_bytes = size_t(body);
    const long long prompt_tokens = a.get_int("--max-prompt-tokens", 0);
    const long long prompt_bytes = a.get_int("--max-prompt-bytes", (long long)o.max_prompt_bytes);
    const long long read_s = a.get_int("--read-timeout", 60);
    if (a.has("--max-prompt-tokens") && prompt_tokens <= 0) throw UsageError("--max-prompt-tokens must be positive");
    if (prompt_bytes <= 0) throw UsageError("--max-prompt-bytes must be positive");
    if (read_s <= 0 || read_s > 3600) throw UsageError("--read-timeout must be in [1, 3600] seconds");
    const long long ws_message_s = a.get_int("--ws-message-timeout", 60);
    if (ws_message_s <= 0 || ws_message_s > 3600) throw UsageError("--ws-message-timeout must be in [1, 3600] seconds");
    o.max_prompt_tokens = prompt_tokens;
    o.max_prompt_bytes = size_t(prompt_bytes);
    o.read_timeout = std::chrono::seconds(read_s);
    o.ws_message_timeout = std::chrono::seconds(ws_message_s);
    const long long g_states = a.get_int("--grammar-max-states", (long long)o.grammar_budget.max_states);
    const long long g_mb = a.get_int("--grammar-max-mb", (long long)(o.grammar_budget.max_bytes >> 20));
    const long long g_ms = a.get_int("--grammar-timeout-ms", (long long)o.grammar_budget.timeout.count());
    if (g_states <= 0 || g_mb <= 0 || g_ms <= 0 || g_ms > 3600000 || g_mb > (1 << 20))
      throw UsageError("--grammar-max-states, --grammar-max-mb and --grammar-timeout-ms must be positive (at most 1 h, 1 TiB)");
    o.grammar_budget.max_states = size_t(g_states);
    o.grammar_budget.max_bytes = size_t(g_mb) << 20;
    o.grammar_budget.timeout = std::chrono::milliseconds(g_ms);
    o.chat_template = a.get_or("--chat-template", "");
    o.session_dir = a.get_or("--session-dir", "");
    const long long retain = a.get_int("--session-retain", (long long)o.session_retain_files);
    const long long retain_bytes = a.get_int("--session-retain-bytes", (long long)o.session_retain_bytes);
    if (retain < 0) throw UsageError("--session-retain must be 0 or more");
    if (retain_bytes < 0) throw UsageError("--session-retain-bytes must be 0 or more");
    o.session_retain_files = size_t(retain);
    o.session_retain_bytes = uint64_t(retain_bytes);
    o.read_root = a.get_or("--read-root", "");
    o.mcp_servers = mcp_server_flags(a);
    o.session_mcp_servers = mcp_server_flags(a, "--mcp-session");
    for (const auto& s : o.session_mcp_servers)
      for (const auto& m : o.mcp_servers)
        if (s.name == m.name) throw UsageError(cat("--mcp-session ", s.name, ": an --mcp server has that name"));
    if (a.has("--cache-pages") && o.cache_pages <= 0) throw UsageError("--cache-pages must be positive");
    if (o.max_sessions <= 0) throw UsageError("--max-sessions must be positive");
    if (std::string problem = bind_address_problem(o); !problem.empty()) throw UsageError(problem);

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
