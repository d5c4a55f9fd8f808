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

// Shared between a caller and a running call; the caller sets it, the tool polls it.
class CancelToken {
 public:
  void cancel() { flag_.store(true, std::memory_order_release); }
  bool cancelled() const { return flag_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> flag_{false};
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
