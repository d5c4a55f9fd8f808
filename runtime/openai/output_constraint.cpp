#include "runtime/openai/output_constraint.h"

#include "engine/generate/grammar_constraint.h"
#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "runtime/openai/api_error.h"
#include "sessions/tool_call_grammar.h"

namespace exl {

using Json = nlohmann::ordered_json;

std::shared_ptr<LogitsMaskHook> make_output_constraint(const ChatRequest& r, const Tokenizer& tok,
                                                       ToolFormat format, const GrammarBudget& budget) {
  const bool calls = r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::named;
  const bool json = r.response_format == "json_object" || r.response_format == "json_schema";
  const bool no_calls = r.tool_choice == ToolChoice::none && !r.tools.empty() && !json;
  const bool one_call = r.tool_choice == ToolChoice::auto_ && !r.tools.empty() && !json && !r.parallel_tool_calls;
  if (!calls && !json && !no_calls && !one_call) return nullptr;
  ToolCallGrammarOptions o;
  // json.dumps spacing: what chat models are trained to write (compact JSON forced on the demo
  // model wrecks its values; docs/websocket-api.md's agent turns use the same).
  o.schema_options.whitespace = JsonSchemaOptions::Whitespace::spaced;
  o.parallel_tool_calls = r.parallel_tool_calls;
  o.tool_name = r.tool_choice_name;
  if (calls) {
    o.mode = r.tool_choice == ToolChoice::named ? ToolCallMode::named : ToolCallMode::required;
  } else if (no_calls) {
    o.mode = ToolCallMode::no_call;
  } else if (one_call) {
    o.mode = ToolCallMode::call_or_plain_text;
  } else {
    o.final_schema = r.response_format == "json_object" ? Json{{"type", "object"}} : r.json_schema;
    o.mode = r.tool_choice == ToolChoice::auto_ && !r.tools.empty() ? ToolCallMode::call_or_final
                                                                     : ToolCallMode::final_answer;
  }
  const bool with_tools = o.mode != ToolCallMode::final_answer && o.mode != ToolCallMode::no_call;
  const Json tools = with_tools ? r.tools : Json::array();
  std::shared_ptr<const CompiledGrammar> g;
  const char* param = calls ? "tools" : "response_format";
  try {
    g = with_grammar_budget(budget, [&] { return compile_tool_call_grammar_for(format, tools, o, tok); });
  } catch (const GrammarCancelled& e) {
    throw ApiError(499, "invalid_request_error", cat("The request was cancelled: ", e.what()), param, "request_cancelled");
  } catch (const GrammarBudgetError& e) {
    bad_request(cat("This request's output constraint is too large to compile: ", e.what()), param,
                "grammar_budget_exceeded");
  } catch (const GrammarError& e) {
    bad_request(cat("This request's output constraint cannot be enforced: ", e.what()),
                calls ? "tools" : "response_format", "unsupported_schema");
  } catch (const Error& e) {
    bad_request(cat("This request's output constraint cannot be enforced: ", e.what()),
                calls ? "tool_choice" : "response_format", "unsupported_schema");
  }
  return make_grammar_constraint(std::move(g), tok);
}

}  // namespace exl
