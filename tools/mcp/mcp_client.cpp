#include "tools/mcp/mcp_client.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "kernels/error.h"
#include "tools/mcp/child_process.h"
#include "tools/tool_registry.h"

namespace exl {

using json = nlohmann::json;

// The server's stderr and the client's notes, the last `cap` bytes. Thread-safe.
struct McpLog {
  explicit McpLog(size_t cap) : cap(std::max<size_t>(cap, 256)) {}
  void append(std::string_view s) {
    std::lock_guard lk(mu);
    text.append(s);
    if (text.size() > cap) text.erase(0, text.size() - cap);
  }
  void note(std::string_view s) { append(cat("[exlagent] ", s, "\n")); }
  std::string all() const {
    std::lock_guard lk(mu);
    return text;
  }
  std::string tail(size_t n) const {
    std::lock_guard lk(mu);
    return text.size() <= n ? text : text.substr(text.size() - n);
  }
  const size_t cap;
  mutable std::mutex mu;
  std::string text;
};

namespace {

constexpr int kMcpMaxDepth = 128;
const char* const kMcpVersions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

std::string mcp_stderr_note(const McpLog& log) {
  std::string t = log.tail(600);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  if (t.empty()) return "";
  return cat("; its stderr ends: ", t);
}

// Writes all of `data` to a pipe; EPIPE (the reader is gone) is an error, not a SIGPIPE.
bool mcp_write_all(int fd, std::string_view data, std::string& error) {
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  bool ok = true;
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = std::strerror(errno);
      ok = false;
      if (errno == EPIPE) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_set, nullptr, &zero);
      }
      break;
    }
    data.remove_prefix(size_t(n));
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  return ok;
}

json mcp_parse_line(std::string_view line) {
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

class McpTool : public Tool {
 public:
  McpTool(ToolSpec spec, std::string remote, std::weak_ptr<McpClient> client)
      : spec_(std::move(spec)), remote_(std::move(remote)), client_(std::move(client)) {}
  const ToolSpec& spec() const override { return spec_; }
  void invoke(const json& arguments, ToolClock::time_point deadline, std::shared_ptr<CancelToken>,
              ToolDone done) override {
    if (auto c = client_.lock()) return c->call(remote_, arguments, deadline, std::move(done));
    done({cat("tool '", spec_.name, "': its MCP server has been shut down"), true});
  }

 private:
  ToolSpec spec_;
  std::string remote_;
  std::weak_ptr<McpClient> client_;
};

}  // namespace

// A request's outcome: `result`, or the JSON-RPC `error` object, or a `failure` text (no answer).
struct McpClient::Answer {
  json result;
  json error;
  std::string failure;
};

struct McpClient::Link : std::enable_shared_from_this<McpClient::Link> {
  using Reply = std::function<void(Answer)>;
  struct Pending {
    Reply reply;
    ToolClock::time_point deadline;
    ToolClock::time_point sent;
  };

  Link(const McpServerConfig& c, std::shared_ptr<McpLog> l, std::weak_ptr<McpClient> o)
      : server(c.name), max_line(c.max_line_bytes), grace(c.kill_grace), log(std::move(l)), owner(std::move(o)) {}

  // Spawns the server on the link's own thread; "" or why it could not start.
  std::string start(const std::vector<std::string>& argv) {
    if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return cat("pipe: ", std::strerror(errno));
    auto started = std::make_shared<std::promise<std::string>>();
    auto f = started->get_future();
    thread = std::thread([self = shared_from_this(), argv, started] {
      try {
        auto c = ChildProcess::spawn(argv);
        {
          std::lock_guard lk(self->write_mu);
          self->child = std::move(c);
        }
        started->set_value("");
      } catch (const std::exception& e) {
        started->set_value(e.what());
        return;
      }
      self->run();
    });
    return f.get();
  }

  void stop() {
    {
      std::lock_guard lk(mu);
      stopping = true;
    }
    wake_up();
  }

  void join() {
    if (!thread.joinable()) return;
    if (thread.get_id() == std::this_thread::get_id()) thread.detach();
    else thread.join();
  }

  ~Link() {
    for (int f : wake)
      if (f >= 0) ::close(f);
  }

  void wake_up() {
    const char b = 1;
    [[maybe_unused]] ssize_t n = ::write(wake[1], &b, 1);
  }

  bool send(const json& msg, std::string& error) {
    const std::string line = msg.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::lock_guard lk(write_mu);
    if (!child || child->stdin_fd() < 0) {
      error = "its stdin is closed";
      return false;
    }
    return mcp_write_all(child->stdin_fd(), line, error);
  }

  void notify(const std::string& method, json params) {
    json msg = {{"jsonrpc", "2.0"}, {"method", method}};
    if (!params.is_null()) msg["params"] = std::move(params);
    std::string ignored;
    send(msg, ignored);
  }

  void request(const std::string& method, json params, ToolClock::time_point deadline, Reply reply) {
    int64_t id = 0;
    std::string ended;
    {
      std::lock_guard lk(mu);
      if (done) ended = end_reason;
      else {
        id = next_id++;
        pending[id] = {std::move(reply), deadline, ToolClock::now()};
      }
    }
    if (!ended.empty()) return reply({{}, {}, ended});
    wake_up();
    std::string error;
    if (send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}}, error))
      return;
    if (auto p = take(id)) p->reply({{}, {}, cat("cannot write to it: ", error)});
  }

  std::optional<Pending> take(int64_t id) {
    std::lock_guard lk(mu);
    auto it = pending.find(id);
    if (it == pending.end()) return std::nullopt;
    Pending p = std::move(it->second);
    pending.erase(it);
    return p;
  }

  void fail_all(const std::string& why) {
    std::map<int64_t, Pending> all;
    {
      std::lock_guard lk(mu);
      all.swap(pending);
    }
    for (auto& [id, p] : all) p.reply({{}, {}, why});
  }

  void run() {
    std::string buf, reason;
    bool kill = false;
    char chunk[65536];
    for (;;) {
      int timeout_ms = -1;
      {
        std::lock_guard lk(mu);
        if (stopping) {
          reason = "was stopped (the client is shutting down)";
          break;
        }
        int64_t soonest = -1;
        for (const auto& [id, p] : pending) {
          const int64_t left = std::max<int64_t>(
              0, std::chrono::ceil<std::chrono::milliseconds>(p.deadline - ToolClock::now()).count());
          if (soonest < 0 || left < soonest) soonest = left;
        }
        timeout_ms = soonest < 0 ? -1 : int(std::min<int64_t>(soonest, 1 << 30));
      }
      pollfd fds[3] = {{child->stdout_fd(), POLLIN, 0}, {stderr_open ? child->stderr_fd() : -1, POLLIN, 0},
                       {wake[0], POLLIN, 0}};
      if (::poll(fds, 3, timeout_ms) < 0 && errno != EINTR) {
        reason = cat("could not be read: poll: ", std::strerror(errno));
        kill = true;
        break;
      }
      if (fds[2].revents) {
        char sink[64];
        while (::read(wake[0], sink, sizeof sink) > 0) {
        }
      }
      if (fds[1].revents) read_stderr();
      expire();
      if (fds[0].revents == 0) continue;
      const ssize_t n = ::read(fds[0].fd, chunk, sizeof chunk);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        reason = "exited";
        break;
      }
      size_t scanned = buf.size();
      buf.append(chunk, size_t(n));
      size_t start = 0;
      for (size_t nl; (nl = buf.find('\n', scanned)) != std::string::npos; scanned = start = nl + 1) {
        std::string_view line(buf.data() + start, nl - start);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.size() > max_line) break;
        handle_line(line);
        start = nl + 1;
      }
      buf.erase(0, start);
      if (buf.size() > max_line) {
        reason = cat("sent a line longer than ", max_line, " bytes (the stream cannot be trusted; it was stopped)");
        kill = true;
        break;
      }
    }
    finish(reason, kill);
  }

  void read_stderr() {
    char chunk[8192];
    const ssize_t n = ::read(child->stderr_fd(), chunk, sizeof chunk);
    if (n > 0) log->append(std::string_view(chunk, size_t(n)));
    else if (n == 0 || (errno != EINTR && errno != EAGAIN)) stderr_open = false;
  }

  void expire() {
    std::vector<std::pair<int64_t, Pending>> late;
    {
      std::lock_guard lk(mu);
      const auto now = ToolClock::now();
      for (auto it = pending.begin(); it != pending.end();)
        if (it->second.deadline <= now) {
          late.emplace_back(it->first, std::move(it->second));
          it = pending.erase(it);
        } else {
          ++it;
        }
    }
    for (auto& [id, p] : late) {
      notify("notifications/cancelled", {{"requestId", id}, {"reason", "timed out"}});
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - p.sent).count();
      p.reply({{}, {}, cat("timed out after ", ms, " ms (notifications/cancelled sent)")});
    }
  }

  void protocol_error(const std::string& what) {
    log->note(what);
    fail_all(what);
  }

  void handle_line(std::string_view line) {
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;
    json msg;
    try {
      msg = mcp_parse_line(line);
    } catch (const json::exception&) {
      return protocol_error(cat("sent a line that is not JSON: '", mcp_excerpt(line), "'"));
    } catch (const Error& e) {
      return protocol_error(cat("sent a message that ", e.what()));
    }
    if (!msg.is_object()) return protocol_error(cat("sent a line that is not a JSON-RPC message: '", mcp_excerpt(line), "'"));
    const bool has_id = msg.contains("id") && !msg["id"].is_null();
    if (msg.contains("method") && msg["method"].is_string()) {
      const std::string method = msg["method"];
      if (!has_id) {
        if (auto o = owner.lock()) o->on_notification(shared_from_this(), msg);
        return;
      }
      json reply = {{"jsonrpc", "2.0"}, {"id", msg["id"]}};
      if (method == "ping") reply["result"] = json::object();
      else reply["error"] = {{"code", -32601}, {"message", cat("Method not found: ", method)}};
      std::string ignored;
      send(reply, ignored);
      return;
    }
    if (!has_id || !(msg.contains("result") || msg.contains("error")))
      return protocol_error(cat("sent a line that is not a JSON-RPC message: '", mcp_excerpt(line), "'"));
    int64_t id = -1;
    if (msg["id"].is_number_integer()) id = msg["id"].get<int64_t>();
    {
      std::lock_guard lk(mu);
      if (id < 1 || id >= next_id) id = -1;
    }
    if (id < 0) return protocol_error(cat("answered request id ", msg["id"].dump(), ", which was never sent"));
    auto p = take(id);
    if (!p) return;  // a late answer to a request that timed out
    Answer a;
    if (msg.contains("error")) a.error = msg["error"].is_object() ? msg["error"] : json{{"message", msg["error"].dump()}};
    else a.result = msg["result"];
    p->reply(std::move(a));
  }

  void finish(const std::string& reason, bool kill) {
    if (!kill) {
      for (int i = 0; i < 20; ++i) {  // what the server wrote on its way out
        pollfd pf{child->stderr_fd(), POLLIN, 0};
        if (::poll(&pf, 1, 10) <= 0) break;
        char chunk[8192];
        const ssize_t n = ::read(pf.fd, chunk, sizeof chunk);
        if (n <= 0) break;
        log->append(std::string_view(chunk, size_t(n)));
      }
    }
    std::string how;
    {
      std::lock_guard lk(write_mu);
      child->close_stdin();
    }
    how = child->stop(kill ? std::chrono::milliseconds(0) : grace);
    std::string why = reason;
    if (reason == "exited") why = cat("exited (", how.empty() ? "status unknown" : how, ")");
    why += mcp_stderr_note(*log);
    {
      std::lock_guard lk(mu);
      done = true;
      end_reason = why;
    }
    log->note(cat("the server ", why.substr(0, why.find(';'))));
    if (auto o = owner.lock()) o->link_ended(this, why);
    fail_all(why);
  }

  const std::string server;
  const size_t max_line;
  const std::chrono::milliseconds grace;
  std::shared_ptr<McpLog> log;
  std::weak_ptr<McpClient> owner;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::mutex write_mu;                    // guards writes to the child's stdin and `child` being set
  std::unique_ptr<ChildProcess> child;    // set before run() starts; ended by run()
  std::mutex mu;                          // guards what follows
  bool stderr_open = true;               // run()'s own
  bool stopping = false;
  bool done = false;
  std::string end_reason;
  int64_t next_id = 1;
  std::map<int64_t, Pending> pending;
};

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
  EXL_CHECK(eq != std::string_view::npos, "--mcp wants NAME=COMMAND ARGS..., got '", value, "'");
  McpServerConfig c;
  c.name = std::string(value.substr(0, eq));
  const bool ok_name = !c.name.empty() && c.name.size() <= 32 &&
                       std::all_of(c.name.begin(), c.name.end(), [](char ch) {
                         return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-';
                       });
  EXL_CHECK(ok_name, "--mcp: the server name '", c.name, "' must be 1 to 32 letters, digits or '-'");
  c.argv = split_command_line(value.substr(eq + 1));
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
  EXL_CHECK(!config.argv.empty(), "tools: mcp: server '", config.name, "' has no command");
  auto c = std::shared_ptr<McpClient>(new McpClient(std::move(config)));
  std::promise<std::string> p;
  auto f = p.get_future();
  {
    std::lock_guard lk(c->mu_);
    c->state_ = State::starting;
  }
  c->begin_connect([&p](const std::string& error) { p.set_value(error); });
  const std::string error = f.get();
  EXL_CHECK(error.empty(), "tools: mcp: server '", c->name(), "' (", c->config_.argv[0], "): ", error);
  return c;
}

McpClient::~McpClient() {
  std::vector<std::shared_ptr<Link>> links;
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
  auto link = std::make_shared<Link>(config_, log_, weak_from_this());
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
  const std::string spawn_error = link->start(config_.argv);
  if (!spawn_error.empty()) return finish(spawn_error);
  json params = {{"protocolVersion", kMcpProtocolVersion},
                 {"capabilities", json::object()},
                 {"clientInfo", {{"name", "exlagent"}, {"version", "0.1"}}}};
  link->request("initialize", std::move(params), deadline, [weak, link, deadline, finish](Answer a) {
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

void McpClient::list_tools(std::shared_ptr<Link> link, ToolClock::time_point deadline, std::string cursor,
                           std::vector<ToolSpec> acc, std::function<void(std::string, std::vector<ToolSpec>)> then) {
  json params = json::object();
  if (!cursor.empty()) params["cursor"] = cursor;
  link->request("tools/list", std::move(params), deadline,
                [weak = weak_from_this(), link, deadline, acc = std::move(acc), then = std::move(then)](Answer a) mutable {
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

void McpClient::link_ended(const Link* link, const std::string& reason) {
  std::lock_guard lk(mu_);
  if (link_.get() != link || state_ != State::ready) return;
  state_ = State::down;
  down_reason_ = reason;
}

void McpClient::on_notification(const std::shared_ptr<Link>& link, const json& msg) {
  const std::string method = msg["method"];
  if (method == "notifications/message") {
    log_->append(cat("[log] ", msg.value("params", json::object()).dump(), "\n"));
    return;
  }
  if (method != "notifications/tools/list_changed") return;
  {
    std::lock_guard lk(mu_);
    if (link_ != link || state_ != State::ready) return;  // the initial list comes after initialize anyway
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

void McpClient::call(const std::string& tool, const json& arguments, ToolClock::time_point deadline, ToolDone done) {
  deadline = std::min(deadline, ToolClock::now() + config_.call_timeout);
  std::shared_ptr<Link> link;
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
        waiting_.push_back([self, tool, arguments, deadline, done](const std::string& error) {
          if (!error.empty()) return done({error, true});
          std::shared_ptr<Link> l;
          {
            std::lock_guard lk2(self->mu_);
            l = self->link_;
          }
          self->send_call(l, tool, arguments, deadline, done);
        });
        break;
      }
    }
  }
  if (link) return send_call(link, tool, arguments, deadline, std::move(done));
  if (restart) {
    log_->note("restarting the server for a call");
    begin_connect([](const std::string&) {});
  }
}

void McpClient::send_call(const std::shared_ptr<Link>& link, const std::string& tool, const json& arguments,
                          ToolClock::time_point deadline, ToolDone done) {
  const std::string who = cat(prefix(), ": tool '", tool, "'");
  link->request("tools/call", {{"name", tool}, {"arguments", arguments}}, deadline,
                [who, done = std::move(done)](Answer a) {
                  if (!a.failure.empty()) {
                    const bool timeout = a.failure.rfind("timed out", 0) == 0;
                    return done({cat(who, timeout ? " " : " failed: the server ", a.failure), true});
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
