// Tools an agent session can call: built-ins (tools/builtin_*.cpp) and remote tools that a
// WebSocket client registers (runtime/). Shapes follow MCP: a tool has a name, a description and
// an input JSON Schema; a call returns text content and an isError flag.
//
// Contract of Tool::invoke: it starts the call and returns at once; `done` is invoked exactly
// once, from any thread (possibly before invoke returns). A tool must honour `deadline` itself or
// leave it to the caller, who reports a timeout to the model and ignores a late result. After
// `cancel->cancelled()` becomes true a tool may stop early; it still calls `done` (with is_error).
// Bad arguments are a ToolResult with is_error and a message naming what was wrong, never a throw.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl {

struct ToolSpec {
  std::string name;              // [a-zA-Z0-9_-]{1,64}
  std::string description;
  nlohmann::json input_schema;   // JSON Schema of the arguments object
};

struct ToolResult {
  std::string content;  // text shown to the model
  bool is_error = false;
};

// What a running call reports before it is done (MCP notifications/progress): how far it is, the
// total when known, and a message (may be empty).
struct ToolProgress {
  double progress = 0;
  std::optional<double> total;
  std::string message;
};

// Shared between a caller and a running call: the caller cancels it and the tool polls it; a tool
// that can tell how far it is reports to report_progress, which calls the caller's sink (set once,
// before invoke; called from any thread, so it must post to wherever it needs to run).
class CancelToken {
 public:
  void cancel() { flag_.store(true, std::memory_order_release); }
  bool cancelled() const { return flag_.load(std::memory_order_acquire); }
  void set_progress_sink(std::function<void(const ToolProgress&)> sink) { sink_ = std::move(sink); }
  bool wants_progress() const { return static_cast<bool>(sink_); }
  void report_progress(const ToolProgress& p) const {
    if (sink_) sink_(p);
  }

 private:
  std::atomic<bool> flag_{false};
  std::function<void(const ToolProgress&)> sink_;
};

using ToolClock = std::chrono::steady_clock;
using ToolDone = std::function<void(ToolResult)>;

class Tool {
 public:
  virtual ~Tool() = default;
  virtual const ToolSpec& spec() const = 0;
  virtual void invoke(const nlohmann::json& arguments, ToolClock::time_point deadline,
                      std::shared_ptr<CancelToken> cancel, ToolDone done) = 0;
};

}  // namespace exl
