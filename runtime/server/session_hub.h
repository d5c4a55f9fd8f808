// The server's agent sessions and tools: creates, resumes, finds and closes AgentSessions (at most
// options.max_sessions live at once), keeps the tools that WebSocket clients registered (each
// owned by its connection; they disappear when it goes), and runs every session's strand on its
// own small thread pool so nothing blocks the server's I/O threads.
//
// Owners are connection ids: a session or tool belongs to the connection that made it, and
// close_owner() cancels and closes its sessions and fails its tools' pending calls.
// Errors that a client caused are RpcError with a JSON-RPC code (runtime/server/rpc_error.h).
// Thread-safety: any thread.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/thread_pool.hpp>

#include "grammar/grammar_budget.h"
#include "runtime/server/remote_tool.h"
#include "runtime/server/rpc_error.h"
#include "sessions/agent_session.h"
#include "tools/mcp/mcp_client.h"
#include "tools/tool_registry.h"

namespace exl {

inline constexpr size_t kMaxToolsPerClient = 128;
inline constexpr size_t kMaxSessionMcpServers = 8;  // MCP servers one session may start

class SessionHub {
 public:
  // model: what sessions run on — generator, tokenizer, chat template, encode_prompt and the
  // prompt limits (context_length, max_prompt_tokens, max_prompt_bytes); its tools, constraint,
  // executor and dir are the hub's own. Each turn's grammar compiles under `budget`.
  // dir: transcripts (empty = <temp>/exlagent-sessions-<uid>), made private with
  // prepare_private_dir (throws exl::Error when it is unsafe); retention is applied when a session
  // is created or closed, sparing live sessions' transcripts.
  // read_root: the directory the built-in read_file tool may read (empty: no read_file).
  SessionHub(AgentEnv model, GrammarBudget budget, std::filesystem::path dir, int max_sessions,
             std::filesystem::path read_root = {}, TranscriptRetention retention = {});
  ~SessionHub();
  // Server shutdown, while the network's io_context still exists: closes every session and runs
  // the hub's pending work to the end, so no session (nor its event sink, which posts to a
  // connection's executor) outlives the io_context. Later calls find no sessions.
  void shutdown();

  // Waits until every live session's strand has run the work queued before the call, so the
  // events of runs that have ended (their done event) are already handed to their sinks.
  // Used by the drain before connections are closed. Must not be called from a session strand.
  void settle();

  // Starts the session's own MCP servers first (`mcp_servers`: names given to
  // add_session_mcp_server; each session gets its own processes or HTTP sessions, stopped when the
  // session is closed), then checks that every tool in config.tools exists for it. Throws RpcError:
  // invalid_params for an unknown tool or server name, internal_error when a server cannot start.
  // Blocks while the servers start (at most their start_timeout each).
  std::shared_ptr<AgentSession> create(AgentConfig config, AgentSink sink, uint64_t owner,
                                       const std::vector<std::string>& mcp_servers = {});
  // The live session `id` of this owner, else the saved transcript loaded under this owner.
  std::shared_ptr<AgentSession> resume(const std::string& id, AgentSink sink, uint64_t owner);
  // Throws RpcError session_gone when `id` is not a live session of `owner`.
  std::shared_ptr<AgentSession> find(const std::string& id, uint64_t owner);
  void close(const std::string& id, uint64_t owner);
  // Closes the owner's sessions and unregisters its tools (failing their pending calls).
  void close_owner(uint64_t owner);
  size_t live_sessions() const;
  // Sessions in the middle of a run (generating or waiting for tools).
  size_t running_sessions() const;

  // Adds tools answered through `link`; all or nothing. Throws RpcError (tool_conflict when a
  // name belongs to another client, invalid params past kMaxToolsPerClient).
  void register_tools(std::vector<ToolSpec> tools, std::shared_ptr<ToolClientLink> link, uint64_t owner);
  // Starts an MCP server (tools/mcp/) whose tools sessions may then use like the built-ins, as
  // NAME__tool; it runs until the hub goes. Returns notes on tools left out (for a warning).
  // Throws exl::Error when the server cannot be started.
  std::vector<std::string> add_mcp_server(McpServerConfig config);
  std::shared_ptr<Tool> find_tool(const std::string& name) const;
  // The names of the tools WebSocket clients registered.
  std::vector<std::string> tool_names() const;
  // The tools of the --mcp servers that sessions may name (NAME__tool), sorted by name.
  std::vector<ToolSpec> mcp_tools() const;
  // The server's own tools (built-ins and --mcp servers' tools, not the WebSocket clients'), sorted.
  std::vector<ToolSpec> server_tools() const;
  // Calls one of them through the registry (arguments validated, timeout); false, without calling
  // `done`, when there is no such tool.
  bool call_server_tool(const std::string& name, const nlohmann::json& arguments, std::chrono::milliseconds timeout,
                        ToolDone done);
  // Declares an MCP server that a session may start for itself (`serve --mcp-session`). Throws
  // exl::Error when its name is already an --mcp or --mcp-session server's.
  void add_session_mcp_server(McpServerConfig config);
  std::vector<std::string> session_mcp_servers() const;

  // Test and benchmark hook: scripts every turn's output (see ForcedTextHook) instead of the
  // grammar seam.
  void set_turn_constraint(TurnConstraintFactory f);
  const std::filesystem::path& dir() const { return env_.dir; }
  boost::asio::any_io_executor executor() { return pool_.get_executor(); }

 private:
  // A session's own MCP servers and their tools; the clients go first, stopping the servers.
  struct SessionMcp {
    ToolRegistry registry;
    std::vector<std::shared_ptr<McpClient>> clients;
  };
  struct Owned {
    std::shared_ptr<AgentSession> session;
    uint64_t owner;
    std::shared_ptr<SessionMcp> mcp;  // null when the session started none
  };
  struct Registered {
    std::shared_ptr<RemoteTool> tool;
    uint64_t owner;
  };
  std::shared_ptr<AgentSession> adopt(std::shared_ptr<AgentSession> s, uint64_t owner,
                                      std::shared_ptr<SessionMcp> mcp = nullptr);
  std::shared_ptr<SessionMcp> start_session_mcp(const std::vector<std::string>& names);
  void prune();

  boost::asio::thread_pool pool_{2};
  AgentEnv env_;
  int max_sessions_;
  TranscriptRetention retention_;
  std::mutex prune_mu_;                        // one prune at a time
  mutable std::mutex mu_;
  std::map<std::string, Owned> sessions_;      // guarded by mu_
  std::map<std::string, Registered> tools_;    // guarded by mu_
  ToolRegistry builtins_;                      // calculator, regex_extract, json_query, current_time, MCP tools
  std::vector<std::shared_ptr<McpClient>> mcp_;  // after builtins_: the servers stop before their registry goes
  std::map<std::string, McpServerConfig> session_mcp_;  // guarded by mu_
  TurnConstraintFactory constraint_;           // guarded by mu_
};

// Tests and benchmarks only: turn n of every run emits replies[min(n, size) - 1] exactly
// (ForcedTextHook), for `serve --agent-script FILE` with a model too small to call tools.
TurnConstraintFactory scripted_turns(const Tokenizer& tokenizer, std::vector<std::string> replies);
// Reads a JSON array of strings; throws exl::Error naming the file when it is anything else.
std::vector<std::string> read_agent_script(const std::filesystem::path& file);

}  // namespace exl
