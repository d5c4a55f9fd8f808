// Shared by the tools tests: running a tool or a registry call to completion on the test thread.
#pragma once
#include <chrono>
#include <future>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/tool.h"
#include "tools/tool_registry.h"

namespace exl::test {

// Invokes `tool` directly (no schema check) and waits for its result.
inline ToolResult invoke_now(Tool& tool, const nlohmann::json& args) {
  std::promise<ToolResult> p;
  auto f = p.get_future();
  tool.invoke(args, ToolClock::now() + std::chrono::seconds(10), std::make_shared<CancelToken>(),
              [&p](ToolResult r) { p.set_value(std::move(r)); });
  return f.get();
}

// Calls through the registry (schema check + deadline) and waits for the result.
inline ToolResult call_now(ToolRegistry& reg, const std::string& name, const nlohmann::json& args,
                           std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto p = std::make_shared<std::promise<ToolResult>>();
  auto f = p->get_future();
  reg.call(name, args, timeout, nullptr, [p](ToolResult r) { p->set_value(std::move(r)); });
  return f.get();
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace exl::test
