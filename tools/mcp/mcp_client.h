// McpClient: tools from a Model Context Protocol server that runs as a child process (the stdio
// transport: JSON-RPC 2.0, one message per line on the server's stdin and stdout) or answers at an
// http:// URL (the Streamable HTTP transport; tools/mcp/mcp_http_link.cpp describes it).
//
// Lifecycle: start() spawns COMMAND ARGS... (no shell; tools/mcp/child_process.h) or connects, sends
// `initialize` (protocol "2025-06-18"; an older version the server answers — "2025-03-26",
// "2024-11-05" — is accepted), then `notifications/initialized`, then `tools/list` following
// nextCursor, and throws exl::Error naming the server (with the tail of its stderr) when any of it
// fails or takes longer than start_timeout. `notifications/tools/list_changed` re-lists and then
// runs the on_tools_changed callback. The server's `ping` is answered; its other requests get
// "method not found". Its stderr is kept in a bounded log (the last stderr_log_bytes), never
// copied to our stdout or stderr.
//
// Calls: tools() gives each listed tool as a Tool named "NAME__tool" (valid_tool_name: the
// OpenAI function-name alphabet [a-zA-Z0-9_-], which every chat template's tool-call grammar
// writes as a JSON string), so a ToolRegistry validates its arguments against the server's
// inputSchema like a built-in's. A call sends `tools/call` and answers `done` exactly once:
//  - the result: text content blocks joined by "\n", other blocks described ("[image: image/png]",
//    "[audio: ...]", a resource's text or "[resource: URI]"), or `structuredContent` as JSON text
//    when present; `isError` carried over;
//  - a JSON-RPC error: is_error "MCP server 'NAME': tool 'T' failed: MESSAGE (code C)";
//  - no answer by the call's deadline (or call_timeout, whichever is first): is_error
//    "... timed out after N ms", and `notifications/cancelled` is sent with the request id; the
//    same when the caller's CancelToken fires first ("... was cancelled");
//  - the server exits, crashes or breaks the protocol mid-call (a line that is not JSON, nests
//    deeper than 128, exceeds max_line_bytes, or answers an id never sent): is_error naming the
//    server and what happened, with its stderr tail. A broken stream (oversized line) kills it.
// A call that finds the server gone (the process ended; the HTTP server ended the session)
// restarts it (re-initialize, re-list) at most max_restarts times in the client's life; after
// that, or when the restart fails, calls get an error that says so. Late answers to timed-out
// requests are ignored. `notifications/message` goes to the log; so does `notifications/progress`,
// which also reaches the call's CancelToken progress sink when the caller set one (tools/call then
// carries a `_meta.progressToken`; agent sessions emit them as "tool_progress" events).
//
// Destruction closes the server's stdin, then SIGTERM and SIGKILL after kill_grace each (HTTP: a
// DELETE of the session, waiting at most kill_grace), and fails calls still pending. Callbacks (done, on_tools_changed) run on the client's reader thread
// or timer thread and must not block; they may drop the last reference to the client.
// Thread-safe.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/tool.h"

namespace exl {

class ToolRegistry;
class McpLink;

inline constexpr const char* kMcpProtocolVersion = "2025-06-18";
inline constexpr const char* kMcpToolSeparator = "__";

struct McpServerConfig {
  std::string name;               // [a-zA-Z0-9-]{1,32}: the prefix of its tools' names
  std::vector<std::string> argv;  // COMMAND ARGS... (stdio), or empty and:
  std::string url;                // http://HOST[:PORT]/PATH (Streamable HTTP)
  std::chrono::milliseconds call_timeout{60000};
  std::chrono::milliseconds start_timeout{30000};
  std::chrono::milliseconds kill_grace{2000};
  size_t max_line_bytes = size_t(16) << 20;
  size_t stderr_log_bytes = size_t(64) << 10;
  int max_restarts = 1;
};

// Splits a command line on spaces (and tabs). Single quotes keep everything up to the next single
// quote; double quotes keep everything up to the next double quote, where \" and \\ are a quote and
// a backslash; outside quotes a backslash keeps the next character. No variables, globs or other
// shell syntax. Throws exl::Error for an unterminated quote or a trailing backslash.
std::vector<std::string> split_command_line(std::string_view line);
// "NAME=COMMAND ARGS..." or "NAME=http://HOST:PORT/PATH" (the --mcp flag). Throws exl::Error
// naming what is wrong: no '=', a bad name, no command, a malformed URL or an https:// one (this
// build has no TLS).
McpServerConfig parse_mcp_server_flag(std::string_view value);

// The ToolResult of a tools/call result object (see the file comment).
ToolResult mcp_tool_result(const nlohmann::json& result);

class McpClient : public std::enable_shared_from_this<McpClient> {
 public:
  static std::shared_ptr<McpClient> start(McpServerConfig config);
  ~McpClient();
  McpClient(const McpClient&) = delete;
  McpClient& operator=(const McpClient&) = delete;

  const std::string& name() const { return config_.name; }
  std::string protocol_version() const;
  nlohmann::json server_info() const;
  // The listed tools as Tools named "NAME__tool" (a name that would be invalid or longer than 64
  // is left out, with a line in the log). They do not keep the client alive: once it is destroyed
  // their calls answer "its MCP server has been shut down".
  std::vector<std::shared_ptr<Tool>> tools();
  // The listed tools as the server names them.
  std::vector<ToolSpec> remote_tools() const;
  // The server's stderr (its last stderr_log_bytes) and the client's notes about it.
  std::string log() const;
  // Runs after each re-list that list_changed caused.
  void set_on_tools_changed(std::function<void()> fn);

  // tools/call of the server's tool `tool` (its own name, without the prefix). `cancel` may be null.
  void call(const std::string& tool, const nlohmann::json& arguments, ToolClock::time_point deadline, ToolDone done,
            std::shared_ptr<CancelToken> cancel = nullptr);
  // The command (stdio) or the URL, for messages.
  std::string endpoint() const;

 private:
  enum class State { ready, starting, down };
  explicit McpClient(McpServerConfig config);
  void begin_connect(std::function<void(const std::string& error)> finished);
  void list_tools(std::shared_ptr<McpLink> link, ToolClock::time_point deadline, std::string cursor,
                  std::vector<ToolSpec> acc, std::function<void(std::string error, std::vector<ToolSpec>)> then);
  void link_ended(const McpLink* link, const std::string& reason);
  void on_notification(const McpLink* link, const nlohmann::json& msg);
  void send_call(const std::shared_ptr<McpLink>& link, const std::string& tool, const nlohmann::json& arguments,
                 ToolClock::time_point deadline, ToolDone done, std::shared_ptr<CancelToken> cancel);
  std::string prefix() const;

  McpServerConfig config_;
  std::shared_ptr<struct McpLog> log_;
  mutable std::mutex mu_;
  std::shared_ptr<McpLink> link_;                  // the current connection; guarded by mu_
  std::vector<std::shared_ptr<McpLink>> retired_;  // earlier ones, joined by the destructor
  State state_ = State::down;
  int restarts_ = 0;
  std::string down_reason_;
  std::vector<std::function<void(const std::string& error)>> waiting_;  // calls waiting for a (re)start
  std::vector<ToolSpec> tools_;
  std::string protocol_;
  nlohmann::json server_info_;
  std::function<void()> on_changed_;
  // The progressTokens of running calls whose caller wants progress, to their CancelTokens; guarded by mu_.
  std::map<std::string, std::weak_ptr<CancelToken>> progress_;
  uint64_t next_progress_ = 1;  // guarded by mu_
};

// Adds the client's tools to `registry` with owner "mcp:NAME" and keeps them in step with its
// list_changed re-lists. A tool whose input schema the registry refuses is left out; the returned
// lines say which and why (for a warning). The registry must outlive the client: the owner keeps
// the client (declared after the registry) and so decides when the server stops.
std::vector<std::string> register_mcp_tools(ToolRegistry& registry, const std::shared_ptr<McpClient>& client);

}  // namespace exl
