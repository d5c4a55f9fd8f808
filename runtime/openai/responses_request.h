// The Responses API's request (POST /v1/responses) mapped onto a chat completion request, so that
// it runs through the same prompt rendering, output constraints and generation as
// /v1/chat/completions. Pure functions; any thread.
//
// Mapping (fields not listed are ignored, as OpenAI-compatible local servers do):
//   instructions              -> a first system message
//   input: "text"             -> one user message
//   input: [items]            -> messages: {type:"message" (or none), role, content: string or
//                                parts input_text / output_text}; function_call {call_id, name,
//                                arguments} -> an assistant message's tool call (consecutive
//                                calls share one message); function_call_output {call_id, output}
//                                -> a tool message
//   tools: [{type:"function", name, description, parameters, strict}] -> chat tools
//   tool_choice: none/auto/required or {type:"function", name}
//   text.format: {type:"text"} / {type:"json_object"} / {type:"json_schema", name, schema, strict}
//   max_output_tokens, temperature, top_p, parallel_tool_calls, stream
// Refused with a 400 naming the field: previous_response_id, conversation and background (this
// server keeps no responses), store: true, input items or parts of other types.
#pragma once
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/openai/openai_request.h"

namespace exl {

struct ResponsesRequest {
  ChatRequest chat;
  // The request's settings as the response object echoes them: instructions, max_output_tokens,
  // parallel_tool_calls, temperature, top_p, tool_choice, tools, text (with defaults filled in).
  nlohmann::ordered_json echo;
};

// vocab_size bounds logit_bias token ids. Throws ApiError.
ResponsesRequest parse_responses_request(std::string_view body, int64_t vocab_size);

}  // namespace exl
