#include "tools/function_tool.h"

#include "kernels/error.h"

namespace exl {

void FunctionTool::invoke(const nlohmann::json& arguments, ToolClock::time_point, std::shared_ptr<CancelToken> cancel,
                          ToolDone done) {
  ToolResult result;
  try {
    static const CancelToken never;
    result = fn_(arguments, cancel ? *cancel : never);
  } catch (const Error& e) {
    result = {e.what(), true};
  } catch (const nlohmann::json::exception& e) {
    result = {cat(spec_.name, ": invalid arguments: ", e.what()), true};
  } catch (const std::exception& e) {
    result = {cat("tool '", spec_.name, "': internal error: ", e.what()), true};
  }
  done(std::move(result));
}

}  // namespace exl
