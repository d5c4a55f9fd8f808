#include "tools/builtin_tools.h"

namespace exl {

std::vector<std::shared_ptr<Tool>> make_builtin_tools(const BuiltinToolOptions& opts) {
  std::vector<std::shared_ptr<Tool>> tools{make_calculator_tool(opts), make_current_time_tool(opts),
                                           make_json_query_tool(opts)};
  if (!opts.read_root.empty()) tools.push_back(make_read_file_tool(opts));
  tools.push_back(make_regex_extract_tool(opts));
  return tools;
}

}  // namespace exl
