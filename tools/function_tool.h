// FunctionTool: a Tool whose work is a synchronous function run inside `invoke` (the built-ins).
// The function reports bad input by throwing exl::Error; invoke turns that into an is_error result
// carrying the message, and any other exception into "internal error: ...". `done` is called before
// invoke returns. Immutable; invoke may run on several threads at once if the function allows it.
#pragma once
#include <functional>

#include "tools/tool.h"

namespace exl {

class FunctionTool : public Tool {
 public:
  using Fn = std::function<ToolResult(const nlohmann::json& arguments, const CancelToken& cancel)>;
  FunctionTool(ToolSpec spec, Fn fn) : spec_(std::move(spec)), fn_(std::move(fn)) {}
  const ToolSpec& spec() const override { return spec_; }
  void invoke(const nlohmann::json& arguments, ToolClock::time_point deadline, std::shared_ptr<CancelToken> cancel,
              ToolDone done) override;

 private:
  ToolSpec spec_;
  Fn fn_;
};

}  // namespace exl
