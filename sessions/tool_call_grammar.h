// Grammars for a model's tool-call syntax, so `tool_choice: required`, a named tool and an agent's
// final-answer schema are enforced by constrained decoding. The output parses with the template's
// ChatTemplate::parse_reply (tools enabled) into calls whose arguments validate against the tool's
// JSON Schema. The format is the template's tool_format().
//
// Syntax per format (what the templates render for an assistant tool call):
//  - llama3_json: {"name": "<tool>", "parameters": <args>}            one call only (the template
//             cannot express parallel calls, so parallel_tool_calls is ignored)
//  - hermes:  <tool_call>\n{"name": "<tool>", "arguments": <args>}\n</tool_call>
//             repeated, separated by "\n", when parallel calls are allowed
//  - generic: <tool_call>{"name": "<tool>", "arguments": <args>}</tool_call>   (plain text, no
//             special tokens; repeated, separated by "\n", when parallel calls are allowed)
//  - mistral: [TOOL_CALLS] [{"name": "<tool>", "arguments": <args>}, ...]   ("[TOOL_CALLS]" is
//             generated as text; the tokenizer's special [TOOL_CALLS] token is never sampled, and
//             parse_reply finds the marker in the decoded text either way)
// <args> is the compact (or, by option, flexible) JSON text of the tool's parameters schema; a
// tool without one takes any JSON object. Names are written as JSON strings.
//
// Modes:
//  - required: one call of any tool (several when parallel, for chatml and mistral)
//  - named: calls of that tool only
//  - final_answer: the JSON text of the final-answer schema, no wrapper
//  - call_or_final: a `required` call or the final answer (for an agent turn); with llama3 a final
//    answer shaped like {"name": .., "parameters": {..}} parses as a call — choose schemas that
//    cannot be mistaken for one.
//  - call_or_text: a `required` call, or free text (at least one byte) that does not begin with the
//    format's call marker ("{" for llama3_json, "<tool_call>", "[TOOL_CALLS]"): an agent turn without a
//    final-answer schema, where a reply that starts a call must complete a valid one.
//  - call_or_plain_text: a `required` call, or free text that holds no call (as no_call): with
//    parallel_tool_calls false, a reply holds at most one call (`tool_choice: auto` with
//    `parallel_tool_calls: false`), since no call markup can follow text either.
//  - no_call: free text (at least one byte) that holds no call: `tool_choice: none` with tools in
//    the prompt. The call marker appears nowhere in it (llama3_json: its first non-whitespace
//    character is not "{", since a call is the whole reply); tools are not needed.
// Errors: GrammarError for a schema that cannot be compiled (naming the tool and the keyword);
// exl::Error for no tools (where a call is possible), an unknown named tool.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "sessions/chat_template.h"

namespace exl {

struct ToolCallSpec {
  std::string name;
  nlohmann::ordered_json parameters;  // JSON Schema of the arguments; null = any JSON object
};

enum class ToolCallMode : uint8_t { required, named, final_answer, call_or_final, call_or_text, call_or_plain_text, no_call };

struct ToolCallGrammarOptions {
  ToolCallMode mode = ToolCallMode::required;
  bool parallel_tool_calls = false;
  std::string tool_name;                   // named
  nlohmann::ordered_json final_schema;     // final_answer, call_or_final
  JsonSchemaOptions schema_options;        // for arguments and the final answer
};

// The tools of an OpenAI "tools" array ({"type":"function","function":{name, parameters}}).
std::vector<ToolCallSpec> tool_specs_from_openai(const nlohmann::ordered_json& tools);

Grammar tool_call_grammar(ToolFormat format, const std::vector<ToolCallSpec>& tools,
                          const ToolCallGrammarOptions& options);

// tool_call_grammar for an OpenAI "tools" array, compiled for tokenizer's vocabulary through the
// process-wide compiled-grammar cache (engine/generate/grammar_constraint.h: cached_grammar_for),
// keyed by the format, the tools' JSON and every option. Throws as tool_call_grammar and
// compile_grammar_for do.
std::shared_ptr<const CompiledGrammar> compile_tool_call_grammar_for(ToolFormat format,
                                                                     const nlohmann::ordered_json& openai_tools,
                                                                     const ToolCallGrammarOptions& options,
                                                                     const Tokenizer& tokenizer);

}  // namespace exl
