// Running a tool call under a deadline.
//
// ToolTimer: one background thread that runs callbacks at given times (a sorted queue under a
// mutex and a condition variable). Callbacks run on the timer thread, one at a time, so they must
// be short and must not block. Destroying the timer runs every still-pending callback at once with
// `shutdown == true` (so a call waiting on it still completes), then joins the thread. Thread-safe.
//
// invoke_with_deadline: starts `tool.invoke` and guarantees `done` is called exactly once:
//  - with the tool's result, if it arrives (synchronously inside invoke or later from any thread)
//    before `timeout` elapses;
//  - with {is_error, "tool 'x' timed out after N ms"} when the timeout elapses first (the cancel
//    token is then set, and the tool's late result is dropped);
//  - with {is_error, "tool 'x' failed: <what>"} when invoke throws before answering;
//  - with {is_error, "tool 'x' was cancelled: the runtime is shutting down"} when the timer is
//    destroyed first.
// `done` runs on the tool's thread, the caller's thread (synchronous tools) or the timer thread;
// a caller with its own event loop should post from it to that loop. `done` must not throw.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "tools/tool.h"

namespace exl {

class ToolTimer {
 public:
  using Id = uint64_t;
  using Callback = std::function<void(bool shutdown)>;

  ToolTimer();
  ~ToolTimer();
  ToolTimer(const ToolTimer&) = delete;
  ToolTimer& operator=(const ToolTimer&) = delete;

  // Runs `fn(false)` at `when` (at once if it is past) unless cancelled first.
  Id schedule(ToolClock::time_point when, Callback fn);
  // True when the callback was still pending (it will now never run).
  bool cancel(Id id);
  size_t pending() const;

  struct Core;  // the queue; shared with in-flight calls so a late answer never outlives it

 private:
  friend void invoke_with_deadline(const std::shared_ptr<Tool>&, const nlohmann::json&, std::chrono::milliseconds,
                                   std::shared_ptr<CancelToken>, ToolDone, ToolTimer&);
  std::shared_ptr<Core> core_;
  std::thread thread_;
};

// See the file comment. `cancel` may be null (a fresh token is then used).
void invoke_with_deadline(const std::shared_ptr<Tool>& tool, const nlohmann::json& arguments,
                          std::chrono::milliseconds timeout, std::shared_ptr<CancelToken> cancel, ToolDone done,
                          ToolTimer& timer);

}  // namespace exl
