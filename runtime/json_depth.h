// Nesting limit for JSON from the network. nlohmann parses and destroys deep values without
// recursion, but copying and dumping recurse, so a request nested a hundred thousand levels deep
// would overflow the stack; callers reject such values right after parsing. Pure; any thread.
#pragma once
#include <utility>
#include <vector>

namespace exl {

inline constexpr int kMaxJsonDepth = 128;

// True when `value` nests arrays/objects more than max_depth levels deep. Iterative.
template <typename Json>
bool json_too_deep(const Json& value, int max_depth = kMaxJsonDepth) {
  std::vector<std::pair<const Json*, int>> stack = {{&value, 1}};
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth > max_depth) return true;
    for (const auto& child : *v)
      if (child.is_structured()) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

}  // namespace exl
