#include "runtime/mcp/mcp_stdio.h"

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kernels/error.h"
#include "runtime/server/rpc_error.h"

namespace exl {

namespace {

struct QueuedMcpCall {
  McpCall call;
  std::atomic<bool> cancelled{false};
};

struct McpStdioState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<QueuedMcpCall>> queue;  // guarded by mu
  std::shared_ptr<QueuedMcpCall> running;            // guarded by mu
  bool closing = false;                              // guarded by mu
  std::mutex out_mu;
  std::ostream* out = nullptr;

  void write(const std::string& line) {
    std::lock_guard lk(out_mu);
    *out << line << '\n';
    out->flush();
  }

  void work() {
    for (;;) {
      std::shared_ptr<QueuedMcpCall> c;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return closing || !queue.empty(); });
        if (queue.empty()) return;
        c = queue.front();
        queue.pop_front();
        running = c;
      }
      McpJson result = run_mcp_call(c->call, c->cancelled);
      {
        std::lock_guard lk(mu);
        running.reset();
      }
      if (!c->cancelled) write(mcp_call_reply(c->call.id, result));
    }
  }

  void cancel(const McpJson& id) {
    std::lock_guard lk(mu);
    for (auto it = queue.begin(); it != queue.end(); ++it)
      if ((*it)->call.id == id) {
        queue.erase(it);
        return;
      }
    if (running && running->call.id == id) running->cancelled = true;
  }
};

enum class McpLineRead { line, too_long, end };

McpLineRead read_mcp_line(std::streambuf& sb, std::string& line, size_t max_bytes) {
  line.clear();
  bool any = false, too_long = false;
  for (;;) {
    const int c = sb.sbumpc();
    if (c == std::char_traits<char>::eof()) return !any ? McpLineRead::end : too_long ? McpLineRead::too_long : McpLineRead::line;
    any = true;
    if (c == '\n') return too_long ? McpLineRead::too_long : McpLineRead::line;
    if (line.size() < max_bytes)
      line.push_back(char(c));
    else
      too_long = true;
  }
}

}  // namespace

void serve_mcp_stdio(McpServerProtocol& protocol, std::istream& in, std::ostream& out, const McpStdioOptions& options) {
  McpStdioState st;
  st.out = &out;
  std::thread worker([&st] { st.work(); });
  std::string line;
  for (;;) {
    const McpLineRead r = read_mcp_line(*in.rdbuf(), line, options.max_line_bytes);
    if (r == McpLineRead::end) break;
    if (r == McpLineRead::too_long) {
      st.write(mcp_error_reply(nullptr, rpc_code::invalid_request,
                               cat("invalid request: a message longer than ", options.max_line_bytes, " bytes")));
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    McpStep step = protocol.handle(line);
    for (const auto& reply : step.replies) st.write(reply);
    if (step.cancel) st.cancel(*step.cancel);
    if (step.call) {
      std::unique_lock lk(st.mu);
      if (st.queue.size() >= options.max_queued_calls) {
        lk.unlock();
        st.write(mcp_error_reply(step.call->id, rpc_code::invalid_request,
                                 cat("invalid request: tools/call: ", options.max_queued_calls,
                                     " calls are already waiting; try again later")));
        continue;
      }
      auto q = std::make_shared<QueuedMcpCall>();
      q->call = std::move(*step.call);
      st.queue.push_back(std::move(q));
      st.cv.notify_one();
    }
  }
  {
    std::lock_guard lk(st.mu);
    st.closing = true;
    st.cv.notify_one();
  }
  worker.join();
}

}  // namespace exl
