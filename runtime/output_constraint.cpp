#include "runtime/output_constraint.h"

#include "runtime/api_error.h"

namespace exl {

std::shared_ptr<LogitsMaskHook> make_output_constraint(const ChatRequest& r, const Tokenizer&) {
  if (r.response_format == "json_object" || r.response_format == "json_schema")
    throw ApiError(400, "not_supported_error",
                   cat("response_format '", r.response_format,
                       "' is not supported yet: this server cannot enforce it and will not ignore it."),
                   "response_format", "unsupported_response_format");
  if (r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::named)
    throw ApiError(400, "not_supported_error",
                   "tool_choice 'required' and named functions are not supported yet: this server cannot enforce "
                   "them and will not ignore them.",
                   "tool_choice", "unsupported_tool_choice");
  return nullptr;
}

}  // namespace exl
