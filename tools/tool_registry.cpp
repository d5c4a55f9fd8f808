#include "tools/tool_registry.h"

#include <algorithm>

#include "kernels/error.h"

namespace exl {

bool valid_tool_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

void ToolRegistry::add(std::shared_ptr<Tool> tool, std::string owner) {
  EXL_CHECK(tool != nullptr, "tools: registry: null tool");
  const ToolSpec& spec = tool->spec();
  EXL_CHECK(valid_tool_name(spec.name), "tools: registry: invalid tool name '", spec.name,
            "' (want [a-zA-Z0-9_-]{1,64})");
  std::shared_ptr<const ArgumentValidator> validator;
  try {
    validator = std::make_shared<const ArgumentValidator>(spec.input_schema);
  } catch (const Error& e) {
    fail("tools: registry: tool '", spec.name, "': ", e.what());
  }
  std::lock_guard lock(mu_);
  EXL_CHECK(!tools_.contains(spec.name), "tools: registry: a tool named '", spec.name, "' already exists");
  tools_.emplace(spec.name, Entry{std::move(tool), std::move(validator), std::move(owner)});
}

bool ToolRegistry::remove(std::string_view name) {
  std::shared_ptr<Tool> keep;  // released outside the lock
  std::lock_guard lock(mu_);
  auto it = tools_.find(name);
  if (it == tools_.end()) return false;
  keep = std::move(it->second.tool);
  tools_.erase(it);
  return true;
}

std::vector<std::string> ToolRegistry::remove_owner(std::string_view owner) {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<Tool>> keep;
  std::lock_guard lock(mu_);
  for (auto it = tools_.begin(); it != tools_.end();) {
    if (it->second.owner == owner) {
      names.push_back(it->first);
      keep.push_back(std::move(it->second.tool));
      it = tools_.erase(it);
    } else {
      ++it;
    }
  }
  return names;
}

std::optional<ToolRegistry::Entry> ToolRegistry::entry(std::string_view name) const {
  std::lock_guard lock(mu_);
  auto it = tools_.find(name);
  if (it == tools_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<Tool> ToolRegistry::find(std::string_view name) const {
  auto e = entry(name);
  return e ? e->tool : nullptr;
}

std::vector<ToolSpec> ToolRegistry::list() const {
  std::vector<std::shared_ptr<Tool>> tools;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, e] : tools_) tools.push_back(e.tool);
  }
  std::vector<ToolSpec> out;
  for (const auto& t : tools) out.push_back(t->spec());
  return out;
}

size_t ToolRegistry::size() const {
  std::lock_guard lock(mu_);
  return tools_.size();
}

std::optional<ToolResult> ToolRegistry::check_entry(std::string_view name, const std::optional<Entry>& e,
                                                    const nlohmann::json& arguments) {
  if (!e) return ToolResult{cat("unknown tool '", name, "'"), true};
  if (auto problem = e->validator->check(arguments))
    return ToolResult{cat("invalid arguments for tool '", name, "': ", *problem), true};
  return std::nullopt;
}

std::optional<ToolResult> ToolRegistry::check(std::string_view name, const nlohmann::json& arguments) const {
  return check_entry(name, entry(name), arguments);
}

void ToolRegistry::call(std::string_view name, const nlohmann::json& arguments, std::chrono::milliseconds timeout,
                        std::shared_ptr<CancelToken> cancel, ToolDone done) {
  auto e = entry(name);
  if (auto bad = check_entry(name, e, arguments)) {
    done(std::move(*bad));
    return;
  }
  invoke_with_deadline(e->tool, arguments, timeout, std::move(cancel), std::move(done), timer_);
}

}  // namespace exl
