#include "runtime/server/session_hub.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "kernels/error.h"
#include "tools/builtin_tools.h"

namespace exl {

namespace {

std::string new_session_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char hex[] = "0123456789abcdef";
  std::string s = "s-";
  for (int i = 0; i < 20; ++i) s += hex[rng() % 16];
  return s;
}

}  // namespace

SessionHub::SessionHub(AgentEnv model, GrammarBudget budget, std::filesystem::path dir, int max_sessions,
                       std::filesystem::path read_root, TranscriptRetention retention)
    : env_(std::move(model)), max_sessions_(max_sessions), retention_(retention) {
  BuiltinToolOptions tool_opts;
  tool_opts.read_root = std::move(read_root);
  for (auto& t : make_builtin_tools(tool_opts)) builtins_.add(std::move(t));
  env_.find_tool = [this](const std::string& name) { return find_tool(name); };
  env_.constraint = [this, budget](const AgentTurnContext& ctx) -> std::shared_ptr<LogitsMaskHook> {
    TurnConstraintFactory f;
    {
      std::lock_guard lk(mu_);
      f = constraint_;
    }
    if (f) return f(ctx);
    return with_grammar_budget(budget, [&] { return make_agent_turn_constraint(ctx, *env_.tokenizer); });
  };
  env_.executor = pool_.get_executor();
  env_.dir = dir.empty() ? std::filesystem::temp_directory_path() / ("exlagent-sessions-" + std::to_string(::geteuid()))
                         : std::move(dir);
  prepare_private_dir(env_.dir);
}

void SessionHub::shutdown() {
  std::map<std::string, Owned> sessions;
  {
    std::lock_guard lk(mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, o] : sessions) o.session->close();
  sessions.clear();
  pool_.join();  // without stop(): runs the posted closes (dropping the sinks), then the threads end
}

SessionHub::~SessionHub() {
  std::map<std::string, Owned> sessions;
  {
    std::lock_guard lk(mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, o] : sessions) o.session->close();
  sessions.clear();
  pool_.stop();
  pool_.join();
}

std::shared_ptr<AgentSession> SessionHub::adopt(std::shared_ptr<AgentSession> s, uint64_t owner,
                                              std::shared_ptr<SessionMcp> mcp) {
  std::lock_guard lk(mu_);
  if (int(sessions_.size()) >= max_sessions_) {
    s->close();
    throw RpcError(rpc_code::session_limit, cat("Too many sessions: the server allows ", max_sessions_,
                                               " at once (--max-sessions); close one first"));
  }
  sessions_[s->id()] = {s, owner, std::move(mcp)};
  return s;
}

std::shared_ptr<SessionHub::SessionMcp> SessionHub::start_session_mcp(const std::vector<std::string>& names) {
  if (names.size() > kMaxSessionMcpServers)
    throw RpcError(rpc_code::invalid_params, cat("Invalid params: a session may start at most ", kMaxSessionMcpServers,
                                                 " MCP servers"));
  std::vector<McpServerConfig> configs;
  {
    std::lock_guard lk(mu_);
    for (const auto& n : names) {
      auto it = session_mcp_.find(n);
      if (it == session_mcp_.end()) {
        std::string known;
        for (const auto& [k, c] : session_mcp_) known += (known.empty() ? "" : ", ") + k;
        throw RpcError(rpc_code::invalid_params,
                       cat("Invalid params: 'mcpServers': no MCP server '", n, "' for sessions (",
                           known.empty() ? "the server declares none; serve --mcp-session NAME=..." : "declared: " + known, ")"));
      }
      for (const auto& c : configs)
        if (c.name == n) throw RpcError(rpc_code::invalid_params, cat("Invalid params: 'mcpServers' names '", n, "' twice"));
      configs.push_back(it->second);
    }
  }
  auto out = std::make_shared<SessionMcp>();
  for (auto& c : configs) {
    const std::string name = c.name;
    try {
      out->clients.push_back(McpClient::start(std::move(c)));
    } catch (const Error& e) {
      throw RpcError(rpc_code::internal_error, cat("MCP server '", name, "' could not be started: ", e.what()));
    }
    for (const auto& note : register_mcp_tools(out->registry, out->clients.back()))
      std::cerr << "exlagent: warning: " << note << "\n";
  }
  return out;
}

void SessionHub::settle() {
  std::vector<std::shared_ptr<AgentSession>> live;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, o] : sessions_) live.push_back(o.session);
  }
  for (auto& s : live) s->messages();  // a round trip through the session's strand
}

void SessionHub::prune() {
  std::vector<std::string> live;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, o] : sessions_) live.push_back(id);
  }
  std::lock_guard lk(prune_mu_);
  prune_transcripts(env_.dir, retention_, live);
}

std::shared_ptr<AgentSession> SessionHub::create(AgentConfig config, AgentSink sink, uint64_t owner,
                                               const std::vector<std::string>& mcp_servers) {
  prune();
  {
    std::lock_guard lk(mu_);
    if (int(sessions_.size()) >= max_sessions_)
      throw RpcError(rpc_code::session_limit, cat("Too many sessions: the server allows ", max_sessions_,
                                                 " at once (--max-sessions); close one first"));
  }
  std::shared_ptr<SessionMcp> mcp = !mcp_servers.empty() ? start_session_mcp(mcp_servers) : nullptr;
  AgentEnv env = env_;
  if (mcp)
    env.find_tool = [this, weak = std::weak_ptr<SessionMcp>(mcp)](const std::string& name) -> std::shared_ptr<Tool> {
      if (auto m = weak.lock())
        if (auto t = m->registry.find(name)) return t;
      return find_tool(name);
    };
  for (const auto& name : config.tools)
    if (!env.find_tool(name)) throw RpcError(rpc_code::invalid_params, cat("Invalid params: unknown tool '", name, "'"));
  return adopt(AgentSession::create(env, new_session_id(), std::move(config), std::move(sink)), owner, std::move(mcp));
}

std::shared_ptr<AgentSession> SessionHub::resume(const std::string& id, AgentSink sink, uint64_t owner) {
  {
    std::lock_guard lk(mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) {
      if (it->second.owner == owner) return it->second.session;
      throw RpcError(rpc_code::session_busy, cat("Session '", id, "' is open on another connection"));
    }
  }
  if (!valid_session_id(id)) throw RpcError(rpc_code::invalid_params, cat("Invalid params: '", id, "' is not a session id"));
  std::shared_ptr<AgentSession> s;
  try {
    s = AgentSession::load(env_, id, std::move(sink));
  } catch (const Error& e) {
    throw RpcError(rpc_code::session_gone, e.what());
  }
  return adopt(std::move(s), owner);
}

std::shared_ptr<AgentSession> SessionHub::find(const std::string& id, uint64_t owner) {
  std::lock_guard lk(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.owner != owner)
    throw RpcError(rpc_code::session_gone, cat("Session '", id, "' is not open on this connection"));
  return it->second.session;
}

void SessionHub::close(const std::string& id, uint64_t owner) {
  std::shared_ptr<AgentSession> s = find(id, owner);
  std::shared_ptr<SessionMcp> mcp;
  {
    std::lock_guard lk(mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) {
      mcp = std::move(it->second.mcp);
      sessions_.erase(it);
    }
  }
  s->close();
  mcp.reset();  // stops the session's MCP servers
  prune();
}

void SessionHub::close_owner(uint64_t owner) {
  std::vector<std::shared_ptr<AgentSession>> gone;
  std::vector<std::shared_ptr<ToolClientLink>> links;
  std::vector<std::shared_ptr<SessionMcp>> mcp;
  {
    std::lock_guard lk(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();)
      if (it->second.owner == owner) {
        gone.push_back(it->second.session);
        if (it->second.mcp) mcp.push_back(std::move(it->second.mcp));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    for (auto it = tools_.begin(); it != tools_.end();)
      if (it->second.owner == owner) {
        if (auto l = it->second.tool->link()) links.push_back(l);
        it = tools_.erase(it);
      } else {
        ++it;
      }
  }
  for (auto& s : gone) s->close();
  for (auto& l : links) l->disconnect();
  mcp.clear();  // stops the sessions' MCP servers
}

size_t SessionHub::live_sessions() const {
  std::lock_guard lk(mu_);
  return sessions_.size();
}

size_t SessionHub::running_sessions() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (const auto& [id, o] : sessions_) n += o.session->running() ? 1 : 0;
  return n;
}

void SessionHub::register_tools(std::vector<ToolSpec> tools, std::shared_ptr<ToolClientLink> link, uint64_t owner) {
  std::lock_guard lk(mu_);
  size_t owned = 0;
  for (const auto& [name, r] : tools_) owned += r.owner == owner;
  for (const auto& t : tools) {
    auto it = tools_.find(t.name);
    if (it != tools_.end() && it->second.owner != owner)
      throw RpcError(rpc_code::tool_conflict, cat("Tool '", t.name, "' is already registered by another client"));
    if (builtins_.contains(t.name))
      throw RpcError(rpc_code::tool_conflict, cat("Tool '", t.name, "' is a built-in tool"));
    if (it == tools_.end()) ++owned;
  }
  if (owned > kMaxToolsPerClient)
    throw RpcError(rpc_code::invalid_params, cat("Invalid params: a client may register at most ", kMaxToolsPerClient, " tools"));
  for (auto& t : tools) {
    const std::string name = t.name;
    tools_[name] = {std::make_shared<RemoteTool>(std::move(t), link), owner};
  }
}

std::vector<std::string> SessionHub::add_mcp_server(McpServerConfig config) {
  auto client = McpClient::start(std::move(config));
  auto notes = register_mcp_tools(builtins_, client);
  std::lock_guard lk(mu_);
  mcp_.push_back(std::move(client));
  return notes;
}

std::shared_ptr<Tool> SessionHub::find_tool(const std::string& name) const {
  std::lock_guard lk(mu_);
  auto it = tools_.find(name);
  if (it != tools_.end()) return it->second.tool;
  return builtins_.find(name);
}

std::vector<std::string> SessionHub::tool_names() const {
  std::lock_guard lk(mu_);
  std::vector<std::string> out;
  for (const auto& [name, r] : tools_) out.push_back(name);
  return out;
}

std::vector<ToolSpec> SessionHub::server_tools() const { return builtins_.list(); }

bool SessionHub::call_server_tool(const std::string& name, const nlohmann::json& arguments,
                                  std::chrono::milliseconds timeout, ToolDone done) {
  if (!builtins_.contains(name)) return false;
  builtins_.call(name, arguments, timeout, nullptr, std::move(done));
  return true;
}

void SessionHub::add_session_mcp_server(McpServerConfig config) {
  std::lock_guard lk(mu_);
  for (const auto& c : mcp_)
    EXL_CHECK(c->name() != config.name, "runtime: --mcp-session ", config.name, ": an --mcp server has that name");
  EXL_CHECK(!session_mcp_.count(config.name), "runtime: --mcp-session ", config.name, ": given twice");
  const std::string name = config.name;
  session_mcp_.emplace(name, std::move(config));
}

std::vector<std::string> SessionHub::session_mcp_servers() const {
  std::lock_guard lk(mu_);
  std::vector<std::string> out;
  for (const auto& [name, c] : session_mcp_) out.push_back(name);
  return out;
}

std::vector<ToolSpec> SessionHub::mcp_tools() const {
  std::vector<std::shared_ptr<McpClient>> clients;
  {
    std::lock_guard lk(mu_);
    clients = mcp_;
  }
  std::vector<ToolSpec> out;
  for (const auto& c : clients)
    for (const auto& t : c->tools())
      if (auto registered = builtins_.find(t->spec().name)) out.push_back(registered->spec());
  std::sort(out.begin(), out.end(), [](const ToolSpec& a, const ToolSpec& b) { return a.name < b.name; });
  return out;
}

void SessionHub::set_turn_constraint(TurnConstraintFactory f) {
  std::lock_guard lk(mu_);
  constraint_ = std::move(f);
}

TurnConstraintFactory scripted_turns(const Tokenizer& tokenizer, std::vector<std::string> replies) {
  EXL_CHECK(!replies.empty(), "runtime: agent script: no replies");
  return [&tokenizer, replies = std::move(replies)](const AgentTurnContext& c) -> std::shared_ptr<LogitsMaskHook> {
    return ForcedTextHook::for_text(tokenizer, replies[std::min<size_t>(size_t(std::max(c.turn, 1)), replies.size()) - 1]);
  };
}

std::vector<std::string> read_agent_script(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  EXL_CHECK(bool(f), "runtime: agent script: cannot read '", file.string(), "'");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  EXL_CHECK(j.is_array() && !j.empty(), "runtime: agent script: '", file.string(),
            "' must be a non-empty JSON array of strings");
  std::vector<std::string> out;
  for (const auto& r : j) {
    EXL_CHECK(r.is_string(), "runtime: agent script: '", file.string(), "' must be a non-empty JSON array of strings");
    out.push_back(r.get<std::string>());
  }
  return out;
}

}  // namespace exl
