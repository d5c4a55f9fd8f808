// Where constrained decoding plugs into the HTTP API: response_format json_object / json_schema
// and tool_choice required / named need a grammar mask on the job. Until the grammar engine is
// wired in, every such request is refused with 400 not_supported_error: a constraint we cannot
// enforce is never silently dropped (fail closed).
#pragma once
#include <memory>

#include "engine/generator.h"
#include "engine/tokenizer.h"
#include "runtime/openai_request.h"

namespace exl {

// nullptr when the request needs no constraint. Throws ApiError.
std::shared_ptr<LogitsMaskHook> make_output_constraint(const ChatRequest& request, const Tokenizer& tokenizer);

}  // namespace exl
