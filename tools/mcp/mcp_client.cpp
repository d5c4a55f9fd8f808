#include "tools/mcp/mcp_client.h"

#include <algorithm>
#include <future>

#include "kernels/error.h"
#include "tools/mcp/mcp_link.h"
#include "tools/tool_registry.h"

namespace exl {

using json = nlohmann::json;

void McpLog::append(std::string_view s) {
  std::lock_guard lk(mu);
  text.append(s);
  if (text.size() > cap) text.erase(0, text.size() - cap);
}
void McpLog::note(std::string_view s) { append(cat("[exlagent] ", s, "\n")); }
std::string McpLog::all() const {
  std::lock_guard lk(mu);
  return text;
}
std::string McpLog::tail(size_t n) const {
  std::lock_guard lk(mu);
  return text.size() <= n ? text : text.substr(text.size() - n);
}

namespace {

constexpr int kMcpMaxDepth = 128;
const char* const kMcpVersions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

class McpTool : public Tool {
 public:
  McpTool(ToolSpec spec, std::string remote, std::weak_ptr<McpClient> client)
      : spec_(std::move(spec)), remote_(std::move(remote)), client_(std::move(client)) {}
  const ToolSpec& spec() const override { return spec_; }
  void invoke(const json& arguments, ToolClock::time_point deadline, std::shared_ptr<CancelToken> cancel,
              ToolDone done) override {
    if (auto c = client_.lock()) return c->call(remote_, arguments, deadline, std::move(done), std::move(cancel));
    done({cat("tool '", spec_.name, "': its MCP server has been shut down"), true});
  }

 private:
  ToolSpec spec_;
  std::string remote_;
  std::weak_ptr<McpClient> client_;
};

// A timeout or a cancellation: the caller's doing, not the server's.
bool mcp_failure_is_ours(std::string_view failure) {
  return failure.substr(0, 9) == "timed out" || failure.substr(0, 13) == "was cancelled";
}

}  // namespace

json mcp_parse_message(std::string_view line) {
  return json::parse(line, [](int depth, json::parse_event_t, json&) {
    if (depth > kMcpMaxDepth) throw Error(cat("it nests deeper than ", kMcpMaxDepth, " levels"));
    return true;
  });
}

std::string mcp_excerpt(std::string_view s) {
  std::string out(s.substr(0, 120));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return s.size() > 120 ? out + "..." : out;
}

std::vector<std::string> split_command_line(std::string_view line) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t') {
      if (in_word) out.push_back(std::move(cur));
      cur.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const size_t end = line.find('\'', i + 1);
      EXL_CHECK(end != std::string_view::npos, "unterminated single quote in '", line, "'");
      cur.append(line.substr(i + 1, end - i - 1));
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        EXL_CHECK(i < line.size(), "unterminated double quote in '", line, "'");
        if (line[i] == '"') break;
        if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == '"' || line[i + 1] == '\\')) ++i;
        cur += line[i];
      }
    } else if (c == '\\') {
      EXL_CHECK(i + 1 < line.size(), "trailing backslash in '", line, "'");
      cur += line[++i];
    } else {
      cur += c;
    }
  }
  if (in_word) out.push_back(std::move(cur));
  return out;
}

McpServerConfig parse_mcp_server_flag(std::string_view value) {
  const size_t eq = value.find('=');
  EXL_CHECK(eq != std::string_view::npos, "--mcp wants NAME=COMMAND ARGS... or NAME=URL, got '", value, "'");
  McpServerConfig c;
  c.name = std::string(value.substr(0, eq));
  const bool ok_name = !c.name.empty() && c.name.size() <= 32 &&
                       std::all_of(c.name.begin(), c.name.end(), [](char ch) {
                         return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-';
                       });
  EXL_CHECK(ok_name, "--mcp: the server name '", c.name, "' must be 1 to 32 letters, digits or '-'");
  std::string_view rest = value.substr(eq + 1);
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t')) rest.remove_suffix(1);
  if (rest.rfind("http://", 0) == 0 || rest.rfind("https://", 0) == 0) {
    try {
      parse_mcp_http_url(rest);
    } catch (const Error& e) {
      throw Error(cat("--mcp ", c.name, ": ", e.what()));
    }
    c.url = std::string(rest);
    return c;
  }
  c.argv = split_command_line(rest);
  EXL_CHECK(!c.argv.empty(), "--mcp ", c.name, ": no command after '='");
  return c;
}

ToolResult mcp_tool_result(const json& result) {
  ToolResult r;
  if (!result.is_object()) return {cat("the server's tools/call result is not an object: ", result.dump()), true};
  if (auto it = result.find("isError"); it != result.end() && it->is_boolean()) r.is_error = it->get<bool>();
  if (auto it = result.find("structuredContent"); it != result.end() && !it->is_null()) {
    r.content = it->dump(-1, ' ', false, json::error_handler_t::replace);
    return r;
  }
  auto str = [](const json& o, const char* k) {
    auto it = o.find(k);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string("?");
  };
  std::vector<std::string> parts;
  if (auto it = result.find("content"); it != result.end() && it->is_array())
    for (const auto& b : *it) {
      if (!b.is_object()) continue;
      const std::string type = str(b, "type");
      if (type == "text") parts.push_back(str(b, "text"));
      else if (type == "image" || type == "audio") parts.push_back(cat("[", type, ": ", str(b, "mimeType"), "]"));
      else if (type == "resource_link") parts.push_back(cat("[resource link: ", str(b, "uri"), "]"));
      else if (type == "resource" && b.contains("resource") && b["resource"].is_object()) {
        const json& res = b["resource"];
        parts.push_back(res.contains("text") && res["text"].is_string() ? res["text"].get<std::string>()
                                                                       : cat("[resource: ", str(res, "uri"), "]"));
      } else {
        parts.push_back(cat("[", type, " content]"));
      }
    }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) r.content += '\n';
    r.content += parts[i];
  }
  return r;
}

McpClient::McpClient(McpServerConfig config)
    : config_(std::move(config)), log_(std::make_shared<McpLog>(config_.stderr_log_bytes)) {}

std::shared_ptr<McpClient> McpClient::start(McpServerConfig config) {
  EXL_CHECK(!config.argv.empty() || !config.url.empty(), "tools: mcp: server '", config.name, "' has no command or URL");
  auto c = std::shared_ptr<McpClient>(new McpClient(std::move(config)));
  std::promise<std::string> p;
  auto f = p.get_future();
  {
    std::lock_guard lk(c->mu_);
    c->state_ = State::starting;
  }
  c->begin_connect([&p](const std::string& error) { p.set_value(error); });
  const std::string error = f.get();
  EXL_CHECK(error.empty(), "tools: mcp: server '", c->name(), "' (", c->endpoint(), "): ", error);
  return c;
}

McpClient::~McpClient() {
  std::vector<std::shared_ptr<McpLink>> links;
  std::vector<std::function<void(const std::string&)>> waiting;
  {
    std::lock_guard lk(mu_);
    links = std::move(retired_);
    if (link_) links.push_back(link_);
    waiting.swap(waiting_);
  }
  for (auto& w : waiting) w(cat("MCP server '", config_.name, "' is shutting down"));
  for (auto& l : links) l->stop();
  for (auto& l : links) l->join();
}

std::string McpClient::prefix() const { return cat("MCP server '", config_.name, "'"); }

void McpClient::begin_connect(std::function<void(const std::string& error)> finished) {
  const std::weak_ptr<McpClient> owner = weak_from_this();
  McpLinkEvents events;
  events.notification = [owner](const McpLink* l, const json& msg) {
    if (auto self = owner.lock()) self->on_notification(l, msg);
  };
  events.ended = [owner](const McpLink* l, const std::string& reason) {
    if (auto self = owner.lock()) self->link_ended(l, reason);
  };
  auto link = config_.url.empty() ? make_mcp_stdio_link(config_, log_, std::move(events))
                                  : make_mcp_http_link(config_, log_, std::move(events));
  const auto deadline = ToolClock::now() + config_.start_timeout;
  const std::weak_ptr<McpClient> weak = weak_from_this();
  // Holds no reference to the client while `finished` runs, so that start() returns the only one.
  auto finish = [weak, link, finished](const std::string& error) {
    {
      std::vector<std::function<void(const std::string&)>> waiting;
      std::string prefix;
      if (auto self = weak.lock()) {
        std::lock_guard lk(self->mu_);
        if (error.empty()) {
          self->state_ = State::ready;
        } else {
          self->state_ = State::down;
          self->down_reason_ = error;
          self->log_->note(cat("start failed: ", error));
        }
        waiting.swap(self->waiting_);
        prefix = self->prefix();
      }
      if (!error.empty()) link->stop();
      for (auto& w : waiting) w(error.empty() ? "" : cat(prefix, " could not be started: ", error));
    }
    finished(error);
  };
  {
    std::lock_guard lk(mu_);
    if (link_) retired_.push_back(link_);
    link_ = link;
  }
  const std::string spawn_error = link->start();
  if (!spawn_error.empty()) return finish(spawn_error);
  json params = {{"protocolVersion", kMcpProtocolVersion},
                 {"capabilities", json::object()},
                 {"clientInfo", {{"name", "exlagent"}, {"version", "0.1"}}}};
  link->request("initialize", std::move(params), deadline, nullptr, [weak, link, deadline, finish](McpAnswer a) {
    if (!a.failure.empty()) return finish(cat("initialize: ", a.failure));
    if (!a.error.is_null()) return finish(cat("initialize: ", a.error.dump()));
    const json& r = a.result;
    const std::string version = r.is_object() && r.contains("protocolVersion") && r["protocolVersion"].is_string()
                                    ? r["protocolVersion"].get<std::string>()
                                    : "";
    if (std::find(std::begin(kMcpVersions), std::end(kMcpVersions), version) == std::end(kMcpVersions))
      return finish(cat("initialize: protocol version '", version, "' is not one this client speaks (",
                        kMcpVersions[0], ", ", kMcpVersions[1], ", ", kMcpVersions[2], ")"));
    auto self = weak.lock();
    if (!self) return finish("the client is gone");
    {
      std::lock_guard lk(self->mu_);
      self->protocol_ = version;
      self->server_info_ = r.value("serverInfo", json::object());
    }
    link->notify("notifications/initialized", nullptr);
    self->list_tools(link, deadline, "", {}, [weak, finish](std::string error, std::vector<ToolSpec> tools) {
      if (auto c = weak.lock(); c && error.empty()) {
        std::lock_guard lk(c->mu_);
        c->tools_ = std::move(tools);
      }
      finish(error);
    });
  });
}

void McpClient::list_tools(std::shared_ptr<McpLink> link, ToolClock::time_point deadline, std::string cursor,
                           std::vector<ToolSpec> acc, std::function<void(std::string, std::vector<ToolSpec>)> then) {
  json params = json::object();
  if (!cursor.empty()) params["cursor"] = cursor;
  link->request("tools/list", std::move(params), deadline, nullptr,
                [weak = weak_from_this(), link, deadline, acc = std::move(acc), then = std::move(then)](McpAnswer a) mutable {
                  if (!a.failure.empty()) return then(cat("tools/list: ", a.failure), {});
                  if (!a.error.is_null()) return then(cat("tools/list: ", a.error.dump()), {});
                  const json& r = a.result;
                  if (!r.is_object() || !r.contains("tools") || !r["tools"].is_array())
                    return then("tools/list: the result has no \"tools\" array", {});
                  for (const auto& t : r["tools"]) {
                    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
                    ToolSpec s;
                    s.name = t["name"];
                    if (auto d = t.find("description"); d != t.end() && d->is_string()) s.description = *d;
                    s.input_schema = t.value("inputSchema", json{{"type", "object"}});
                    acc.push_back(std::move(s));
                  }
                  if (auto c = r.find("nextCursor"); c != r.end() && c->is_string() && !c->get<std::string>().empty()) {
                    if (acc.size() > 10000) return then("tools/list: more than 10000 tools", {});
                    auto self = weak.lock();
                    if (!self) return then("the client is gone", {});
                    return self->list_tools(link, deadline, *c, std::move(acc), std::move(then));
                  }
                  then("", std::move(acc));
                });
}

void McpClient::link_ended(const McpLink* link, const std::string& reason) {
  std::lock_guard lk(mu_);
  if (link_.get() != link || state_ != State::ready) return;
  state_ = State::down;
  down_reason_ = reason;
}

void McpClient::on_notification(const McpLink* from, const json& msg) {
  const std::string method = msg["method"];
  if (method == "notifications/message") {
    log_->append(cat("[log] ", msg.value("params", json::object()).dump(), "\n"));
    return;
  }
  if (method == "notifications/progress") {
    const json params = msg.value("params", json::object());
    log_->append(cat("[progress] ", params.dump(), "\n"));
    const auto tok = params.find("progressToken");
    const auto prog = params.find("progress");
    if (tok == params.end() || prog == params.end() || !prog->is_number()) return;
    std::shared_ptr<CancelToken> to;
    {
      std::lock_guard lk(mu_);
      if (auto it = progress_.find(tok->is_string() ? tok->get<std::string>() : tok->dump()); it != progress_.end())
        to = it->second.lock();
    }
    if (!to) return;
    ToolProgress p;
    p.progress = prog->get<double>();
    if (auto t = params.find("total"); t != params.end() && t->is_number()) p.total = t->get<double>();
    if (auto m = params.find("message"); m != params.end() && m->is_string()) p.message = m->get<std::string>();
    to->report_progress(p);
    return;
  }
  if (method != "notifications/tools/list_changed") return;
  std::shared_ptr<McpLink> link;
  {
    std::lock_guard lk(mu_);
    if (link_.get() != from || state_ != State::ready) return;  // the initial list comes after initialize anyway
    link = link_;
  }
  list_tools(link, ToolClock::now() + config_.start_timeout, "", {},
             [weak = weak_from_this()](std::string error, std::vector<ToolSpec> tools) {
    auto self = weak.lock();
    if (!self) return;
    if (!error.empty()) return self->log_->note(cat("re-listing tools failed: ", error));
    std::function<void()> fn;
    {
      std::lock_guard lk(self->mu_);
      self->tools_ = std::move(tools);
      fn = self->on_changed_;
    }
    if (fn) fn();
  });
}

void McpClient::call(const std::string& tool, const json& arguments, ToolClock::time_point deadline, ToolDone done,
                     std::shared_ptr<CancelToken> cancel) {
  deadline = std::min(deadline, ToolClock::now() + config_.call_timeout);
  std::shared_ptr<McpLink> link;
  bool restart = false;
  {
    std::lock_guard lk(mu_);
    switch (state_) {
      case State::ready:
        link = link_;
        break;
      case State::down:
        if (restarts_ >= config_.max_restarts) {
          const std::string why = down_reason_;
          const int n = restarts_;
          return done({cat(prefix(), " is not running (it ", why, "); it was already restarted ", n,
                           n == 1 ? " time" : " times", ", so it is not started again"),
                       true});
        }
        ++restarts_;
        state_ = State::starting;
        restart = true;
        [[fallthrough]];
      case State::starting: {
        auto self = shared_from_this();
        waiting_.push_back([self, tool, arguments, deadline, done, cancel](const std::string& error) {
          if (!error.empty()) return done({error, true});
          std::shared_ptr<McpLink> l;
          {
            std::lock_guard lk2(self->mu_);
            l = self->link_;
          }
          self->send_call(l, tool, arguments, deadline, done, cancel);
        });
        break;
      }
    }
  }
  if (link) return send_call(link, tool, arguments, deadline, std::move(done), std::move(cancel));
  if (restart) {
    log_->note("restarting the server for a call");
    begin_connect([](const std::string&) {});
  }
}

void McpClient::send_call(const std::shared_ptr<McpLink>& link, const std::string& tool, const json& arguments,
                          ToolClock::time_point deadline, ToolDone done, std::shared_ptr<CancelToken> cancel) {
  const std::string who = cat(prefix(), ": tool '", tool, "'");
  json params = {{"name", tool}, {"arguments", arguments}};
  std::string progress_token;
  if (cancel && cancel->wants_progress()) {
    std::lock_guard lk(mu_);
    progress_token = cat("exl-", next_progress_++);
    progress_[progress_token] = cancel;
    params["_meta"] = {{"progressToken", progress_token}};
  }
  std::weak_ptr<McpClient> weak = weak_from_this();
  link->request("tools/call", std::move(params), deadline, std::move(cancel),
                [who, weak, progress_token, done = std::move(done)](McpAnswer a) {
                  if (auto self = weak.lock(); self && !progress_token.empty()) {
                    std::lock_guard lk(self->mu_);
                    self->progress_.erase(progress_token);
                  }
                  if (!a.failure.empty()) {
                    const bool ours = mcp_failure_is_ours(a.failure);
                    return done({cat(who, ours ? " " : " failed: the server ", a.failure), true});
                  }
                  if (!a.error.is_null()) {
                    std::string msg = a.error.contains("message") && a.error["message"].is_string()
                                          ? a.error["message"].get<std::string>()
                                          : a.error.dump();
                    if (a.error.contains("code")) msg += cat(" (code ", a.error["code"].dump(), ")");
                    return done({cat(who, " failed: ", msg), true});
                  }
                  done(mcp_tool_result(a.result));
                });
}

std::string McpClient::protocol_version() const {
  std::lock_guard lk(mu_);
  return protocol_;
}

json McpClient::server_info() const {
  std::lock_guard lk(mu_);
  return server_info_;
}

std::vector<ToolSpec> McpClient::remote_tools() const {
  std::lock_guard lk(mu_);
  return tools_;
}

std::vector<std::shared_ptr<Tool>> McpClient::tools() {
  std::vector<std::shared_ptr<Tool>> out;
  for (const auto& s : remote_tools()) {
    ToolSpec spec = s;
    spec.name = config_.name + kMcpToolSeparator + s.name;
    if (!valid_tool_name(spec.name)) {
      log_->note(cat("tool '", s.name, "' left out: '", spec.name, "' is not a valid tool name ([a-zA-Z0-9_-]{1,64})"));
      continue;
    }
    out.push_back(std::make_shared<McpTool>(std::move(spec), s.name, weak_from_this()));
  }
  return out;
}

std::string McpClient::log() const { return log_->all(); }

std::string McpClient::endpoint() const { return config_.url.empty() ? config_.argv[0] : config_.url; }

void McpClient::set_on_tools_changed(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  on_changed_ = std::move(fn);
}

std::vector<std::string> register_mcp_tools(ToolRegistry& registry, const std::shared_ptr<McpClient>& client) {
  const std::string owner = "mcp:" + client->name();
  auto add_all = [&registry, owner](McpClient& c) {
    std::vector<std::string> skipped;
    registry.remove_owner(owner);
    for (auto& t : c.tools()) {
      const std::string name = t->spec().name;
      try {
        registry.add(std::move(t), owner);
      } catch (const Error& e) {
        skipped.push_back(cat("MCP tool '", name, "' left out: ", e.what()));
      }
    }
    return skipped;
  };
  std::weak_ptr<McpClient> weak = client;
  client->set_on_tools_changed([weak, add_all] {
    if (auto c = weak.lock()) add_all(*c);
  });
  return add_all(*client);
}

}  // namespace exl
