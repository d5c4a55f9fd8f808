#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "kernels/error.h"
#include "tools/mcp/child_process.h"
#include "tools/mcp/mcp_link.h"

namespace exl {

using json = nlohmann::json;

namespace {

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

// One server process and the thread that reads it.
class McpStdioLink : public McpLink, public std::enable_shared_from_this<McpStdioLink> {
 public:
  struct Pending {
    McpReply reply;
    ToolClock::time_point deadline;
    ToolClock::time_point sent;
    std::shared_ptr<CancelToken> cancel;
  };

  McpStdioLink(const McpServerConfig& c, std::shared_ptr<McpLog> l, McpLinkEvents e)
      : argv(c.argv), max_line(c.max_line_bytes), grace(c.kill_grace), log(std::move(l)), events(std::move(e)) {}

  // Spawns the server on the link's own thread (ChildProcess: the child ends with that thread).
  std::string start() override {
    if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return cat("pipe: ", std::strerror(errno));
    auto started = std::make_shared<std::promise<std::string>>();
    auto f = started->get_future();
    thread = std::thread([self = shared_from_this(), started] {
      try {
        auto c = ChildProcess::spawn(self->argv);
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

  void stop() override {
    {
      std::lock_guard lk(mu);
      stopping = true;
    }
    wake_up();
  }

  void join() override {
    if (!thread.joinable()) return;
    if (thread.get_id() == std::this_thread::get_id()) thread.detach();
    else thread.join();
  }

  ~McpStdioLink() override {
    for (int f : wake)
      if (f >= 0) ::close(f);
  }

  void notify(const std::string& method, json params) override {
    json msg = {{"jsonrpc", "2.0"}, {"method", method}};
    if (!params.is_null()) msg["params"] = std::move(params);
    std::string ignored;
    send(msg, ignored);
  }

  void request(const std::string& method, json params, ToolClock::time_point deadline,
               std::shared_ptr<CancelToken> cancel, McpReply reply) override {
    int64_t id = 0;
    std::string ended;
    {
      std::lock_guard lk(mu);
      if (done) ended = end_reason;
      else {
        id = next_id++;
        pending[id] = {std::move(reply), deadline, ToolClock::now(), std::move(cancel)};
      }
    }
    if (!ended.empty()) return reply({{}, {}, ended});
    wake_up();
    std::string error;
    if (send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}}, error))
      return;
    if (auto p = take(id)) p->reply({{}, {}, cat("cannot be written to: ", error)});
  }

 private:
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

  // Milliseconds until the soonest deadline, capped at kMcpCancelPoll while a call has a
  // CancelToken to watch; -1 when nothing is pending.
  int poll_timeout() {
    std::lock_guard lk(mu);
    int64_t soonest = -1;
    for (const auto& [id, p] : pending) {
      int64_t left = std::max<int64_t>(
          0, std::chrono::ceil<std::chrono::milliseconds>(p.deadline - ToolClock::now()).count());
      if (p.cancel) left = std::min<int64_t>(left, kMcpCancelPoll.count());
      if (soonest < 0 || left < soonest) soonest = left;
    }
    return soonest < 0 ? -1 : int(std::min<int64_t>(soonest, 1 << 30));
  }

  void run() {
    std::string buf, reason;
    bool kill = false;
    char chunk[65536];
    for (;;) {
      {
        std::lock_guard lk(mu);
        if (stopping) {
          reason = "was stopped (the client is shutting down)";
          break;
        }
      }
      pollfd fds[3] = {{child->stdout_fd(), POLLIN, 0}, {stderr_open ? child->stderr_fd() : -1, POLLIN, 0},
                       {wake[0], POLLIN, 0}};
      if (::poll(fds, 3, poll_timeout()) < 0 && errno != EINTR) {
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

  // Fails the requests past their deadline or cancelled, telling the server.
  void expire() {
    std::vector<std::tuple<int64_t, Pending, bool>> gone;  // id, request, timed out
    {
      std::lock_guard lk(mu);
      const auto now = ToolClock::now();
      for (auto it = pending.begin(); it != pending.end();) {
        const bool late = it->second.deadline <= now;
        if (late || (it->second.cancel && it->second.cancel->cancelled())) {
          gone.emplace_back(it->first, std::move(it->second), late);
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& [id, p, late] : gone) {
      notify("notifications/cancelled", {{"requestId", id}, {"reason", late ? "timed out" : "cancelled by the caller"}});
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - p.sent).count();
      p.reply({{}, {}, late ? cat("timed out after ", ms, " ms (notifications/cancelled sent)")
                            : std::string("was cancelled (notifications/cancelled sent)")});
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
      msg = mcp_parse_message(line);
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
        if (events.notification) events.notification(this, msg);
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
    McpAnswer a;
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
    {
      std::lock_guard lk(write_mu);
      child->close_stdin();
    }
    const std::string how = child->stop(kill ? std::chrono::milliseconds(0) : grace);
    std::string why = reason;
    if (reason == "exited") why = cat("exited (", how.empty() ? "status unknown" : how, ")");
    why += mcp_stderr_note(*log);
    {
      std::lock_guard lk(mu);
      done = true;
      end_reason = why;
    }
    log->note(cat("the server ", why.substr(0, why.find(';'))));
    if (events.ended) events.ended(this, why);
    fail_all(why);
  }

  const std::vector<std::string> argv;
  const size_t max_line;
  const std::chrono::milliseconds grace;
  std::shared_ptr<McpLog> log;
  McpLinkEvents events;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::mutex write_mu;                    // guards writes to the child's stdin and `child` being set
  std::unique_ptr<ChildProcess> child;    // set before run() starts; ended by run()
  std::mutex mu;                          // guards what follows
  bool stderr_open = true;                // run()'s own
  bool stopping = false;
  bool done = false;
  std::string end_reason;
  int64_t next_id = 1;
  std::map<int64_t, Pending> pending;
};

}  // namespace

std::shared_ptr<McpLink> make_mcp_stdio_link(const McpServerConfig& config, std::shared_ptr<McpLog> log,
                                             McpLinkEvents events) {
  return std::make_shared<McpStdioLink>(config, std::move(log), std::move(events));
}

}  // namespace exl
