// Tools provided by a WebSocket client ("reverse MCP", docs/websocket-api.md): the runtime sends
// the client `tools/call` requests and the client answers with {content:[{type:"text",text}],
// structuredContent?, isError}.
//
// ToolClientLink is the runtime's side of one tool client: it numbers calls, keeps the pending
// ones, matches responses, and enforces deadlines and cancellation — on expiry or when the
// caller's CancelToken fires it sends notifications/cancelled {requestId, reason} and completes
// the call with an error result; a late answer is ignored. disconnect() fails every pending call
// ("tool client disconnected") and makes later calls fail at once.
// Thread-safety: all members may be called from any thread; `send` must be thread-safe and must
// not block; completion callbacks run outside the link's lock.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "tools/tool.h"

namespace exl {

class ToolClientLink : public std::enable_shared_from_this<ToolClientLink> {
 public:
  using Send = std::function<void(std::string frame)>;
  // timers: where deadline/cancel polling runs. poll: how often a pending call checks its
  // CancelToken.
  ToolClientLink(Send send, boost::asio::any_io_executor timers,
                 std::chrono::milliseconds poll = std::chrono::milliseconds(20));

  void call(const ToolSpec& spec, const nlohmann::json& arguments, ToolClock::time_point deadline,
            std::shared_ptr<CancelToken> cancel, ToolDone done);
  // A frame without "method" from the client; true when it answered a pending call.
  bool on_response(const nlohmann::json& message);
  // notifications/progress params; true when progressToken names a pending call.
  bool on_progress(const nlohmann::json& params);
  void disconnect();
  bool connected() const;
  size_t pending() const;

 private:
  struct Pending {
    std::string tool;
    ToolClock::time_point start, deadline;
    std::shared_ptr<CancelToken> cancel;
    ToolDone done;
    std::unique_ptr<boost::asio::steady_timer> timer;
    nlohmann::json last_progress;
  };
  void watch(const std::string& id);
  // Removes the call and returns its completion, or nullptr when it is no longer pending.
  ToolDone take(const std::string& id, std::string* tool = nullptr);

  Send send_;
  boost::asio::any_io_executor timers_;
  std::chrono::milliseconds poll_;
  mutable std::mutex mu_;
  std::map<std::string, Pending> pending_;  // guarded by mu_
  uint64_t next_id_ = 1;                    // guarded by mu_
  bool connected_ = true;                   // guarded by mu_
};

// A Tool answered by a tool client. Holds the link weakly: a call after the client is gone
// completes at once with is_error.
class RemoteTool : public Tool {
 public:
  RemoteTool(ToolSpec spec, std::weak_ptr<ToolClientLink> link) : spec_(std::move(spec)), link_(std::move(link)) {}
  const ToolSpec& spec() const override { return spec_; }
  void invoke(const nlohmann::json& arguments, ToolClock::time_point deadline, std::shared_ptr<CancelToken> cancel,
              ToolDone done) override;
  std::shared_ptr<ToolClientLink> link() const { return link_.lock(); }

 private:
  ToolSpec spec_;
  std::weak_ptr<ToolClientLink> link_;
};

// Parses an MCP Tool object {name, description?, inputSchema}; throws exl::Error ("runtime: remote
// tool: ...") naming what is wrong (name not [a-zA-Z0-9_-]{1,64}, schema not an object schema).
ToolSpec parse_remote_tool_spec(const nlohmann::json& tool);

// An MCP CallToolResult -> what the model sees: text parts joined with newlines, or the JSON of
// structuredContent when there is no text.
ToolResult tool_result_from_mcp(const nlohmann::json& result);

}  // namespace exl
