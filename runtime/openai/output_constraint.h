// Where constrained decoding plugs into the HTTP API: response_format json_object / json_schema
// and tool_choice required / named become a grammar mask on the job (engine/generate/grammar_constraint.h):
//  - tool_choice required / named: the family's tool-call syntax with arguments valid for the
//    tool's schema (sessions/tool_call_grammar.h); several calls when parallel_tool_calls;
//  - otherwise response_format json_schema / json_object: that schema ({"type":"object"} for
//    json_object), compact JSON; with tool_choice auto and tools, a tool call is allowed too;
//  - otherwise tool_choice auto with tools and parallel_tool_calls false: one call, or text that
//    holds no call markup (so a reply never holds two calls);
//  - otherwise tool_choice none with tools: text that holds no tool-call markup of the template's
//    format (the tools are still in the prompt; the reply is never parsed as a call);
//  - otherwise no constraint.
// A schema the grammar cannot enforce is a 400 invalid_request_error whose message names the
// keyword and where it is; it is never silently dropped (fail closed), and so is one that nothing
// satisfies. Compilation runs under `budget` (grammar/grammar_budget.h): past its states, bytes or
// time it is a 400 with code grammar_budget_exceeded naming the limit; when budget.cancelled says
// the client went away it stops with a 499 request_cancelled. Compiled grammars are cached by
// request shape in the process-wide compiled-grammar cache (grammar/grammar_cache.h), so repeated
// schemas reuse their mask caches; a compilation stopped by its budget or cancelled is never
// cached.
#pragma once
#include <memory>

#include "engine/generate/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "grammar/grammar_budget.h"
#include "runtime/openai/openai_request.h"
#include "sessions/chat_template.h"

namespace exl {

// nullptr when the request needs no constraint. Throws ApiError.
std::shared_ptr<LogitsMaskHook> make_output_constraint(const ChatRequest& request, const Tokenizer& tokenizer,
                                                       ToolFormat format, const GrammarBudget& budget = {});

}  // namespace exl
