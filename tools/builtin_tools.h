// The built-in tools and their options. Each is a FunctionTool (tools/function_tool.h) with a
// closed input schema (additionalProperties false, required fields listed); bad input is an
// is_error result whose message starts with the tool's name.
//
//  calculator     {expression, significant_digits?}: exact rational arithmetic on decimals
//                 (+ - * / ^, parentheses, unary minus; see tools/exact_decimal.h for output).
//  regex_extract  {text, pattern, flags?, max_matches?}: every RE2 match with its groups, as JSON.
//  json_query     {json, path}: the value at `path` in `json` (a JSON text or any JSON value) as
//                 JSON text. Paths: "" or starting with "/" are JSON Pointers (RFC 6901); anything
//                 else is a dotted path: optional leading "$", keys separated by ".", array indices
//                 and quoted keys in brackets — `a.b[0].c`, `$.items[2]`, `["key.with.dots"]`.
//  current_time   {timezone?}: ISO 8601 date-time ("2026-11-30T01:02:03Z" or "...+05:30"); timezone
//                 is "UTC", "Z" or an offset ±HH:MM within -12:00..+14:00.
//  read_file      {path}: a UTF-8 text file under `read_root`; relative paths only, no ".."
//                 components, size capped. The path is walked one component at a time with
//                 openat(O_NOFOLLOW) from a directory fd of the root held since start, so a
//                 symlink or directory swapped in mid-read cannot lead outside; symlinks are
//                 followed only when their target is relative and stays under the root.
#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "tools/tool.h"

namespace exl {

struct BuiltinToolOptions {
  // read_file is offered only when set; must be an existing directory.
  std::filesystem::path read_root;
  uint64_t read_max_bytes = 1 << 20;
  // current_time's clock; null means std::chrono::system_clock::now.
  std::function<std::chrono::system_clock::time_point()> clock;
  // calculator: operands, intermediate and final numerators/denominators are capped at this many
  // decimal digits; non-terminating quotients are shown to this many significant digits unless
  // the call asks for another count.
  int calculator_max_digits = 1000;
  int calculator_significant_digits = 32;
};

std::shared_ptr<Tool> make_calculator_tool(const BuiltinToolOptions& opts);
std::shared_ptr<Tool> make_regex_extract_tool(const BuiltinToolOptions& opts);
std::shared_ptr<Tool> make_json_query_tool(const BuiltinToolOptions& opts);
std::shared_ptr<Tool> make_current_time_tool(const BuiltinToolOptions& opts);
// Throws exl::Error when opts.read_root is not an existing directory.
std::shared_ptr<Tool> make_read_file_tool(const BuiltinToolOptions& opts);

// All of the above (read_file only with a read_root), in name order.
std::vector<std::shared_ptr<Tool>> make_builtin_tools(const BuiltinToolOptions& opts);

}  // namespace exl
