// ToolRegistry: the tools a runtime offers, by unique name — built-ins added at start-up and
// remote tools that WebSocket clients add and remove while it runs.
//
// Each tool is added with an optional `owner` tag (e.g. a WebSocket connection id) so all tools of
// a client that disconnects go with one `remove_owner`. Adding compiles the tool's input schema
// into an ArgumentValidator; a schema the grammar engine cannot enforce is refused at add time
// (the agent loop generates arguments under that same grammar, so such a tool would be unusable).
//
// `call` is the one entry point the agent loop needs: it looks the tool up, validates the
// arguments, and runs the invoke under a deadline (tools/tool_deadline.h), so `done` is called
// exactly once with the result or an is_error result — unknown tool, invalid arguments (message
// "invalid arguments for tool 'x': at '/a': expected string, got number"), timeout, failure.
// A tool removed while calls are in flight stays alive until they finish (shared_ptr).
//
// Thread-safe: every member may be called from any thread; `done` runs on the thread described in
// tool_deadline.h, never while the registry's lock is held. `list` is sorted by name so prompts
// that render it stay byte-identical across turns (prefix-cache hits).
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/argument_validator.h"
#include "tools/tool.h"
#include "tools/tool_deadline.h"

namespace exl {

// True for names matching [a-zA-Z0-9_-]{1,64}.
bool valid_tool_name(std::string_view name);

class ToolRegistry {
 public:
  // Throws exl::Error ("tools: registry: ...") for a null tool, an invalid or taken name, or an
  // input schema the grammar engine cannot compile.
  void add(std::shared_ptr<Tool> tool, std::string owner = {});
  // False when no tool has that name.
  bool remove(std::string_view name);
  // Removes every tool added with this owner; returns their names.
  std::vector<std::string> remove_owner(std::string_view owner);

  std::shared_ptr<Tool> find(std::string_view name) const;  // null when absent
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  std::vector<ToolSpec> list() const;  // sorted by name
  size_t size() const;

  // nullopt when the tool exists and the arguments validate against its input schema; otherwise
  // the is_error result `call` would deliver.
  std::optional<ToolResult> check(std::string_view name, const nlohmann::json& arguments) const;

  // Looks up, validates, then invoke_with_deadline. `cancel` may be null.
  void call(std::string_view name, const nlohmann::json& arguments, std::chrono::milliseconds timeout,
            std::shared_ptr<CancelToken> cancel, ToolDone done);

 private:
  struct Entry {
    std::shared_ptr<Tool> tool;
    std::shared_ptr<const ArgumentValidator> validator;
    std::string owner;
  };
  std::optional<Entry> entry(std::string_view name) const;
  static std::optional<ToolResult> check_entry(std::string_view name, const std::optional<Entry>& e,
                                               const nlohmann::json& arguments);

  mutable std::mutex mu_;
  std::map<std::string, Entry, std::less<>> tools_;
  ToolTimer timer_;  // last member: destroyed first, completing calls still waiting on it
};

}  // namespace exl
