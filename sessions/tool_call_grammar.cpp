#include "sessions/tool_call_grammar.h"

#include "engine/generate/grammar_constraint.h"
#include "grammar/grammar_compose.h"
#include "grammar/grammar_error.h"
#include "grammar/regex.h"
#include "kernels/error.h"

namespace exl {

namespace {

using Json = nlohmann::ordered_json;

const char* kWhere = "sessions: tool call grammar: ";

int32_t schema_rule(GrammarComposer& c, const Json& schema, const JsonSchemaOptions& opts, const std::string& what) {
  try {
    return c.embed(compile_json_schema(schema, opts));
  } catch (const GrammarError& e) {
    grammar_fail(kWhere, what, ": ", e.what());
  }
}

// {"name": "<tool>", "<key>": <args>} for one tool.
int32_t call_rule(GrammarComposer& c, const ToolCallSpec& t, std::string_view args_key, const JsonSchemaOptions& opts) {
  const Json params = t.parameters.is_null() ? Json{{"type", "object"}} : t.parameters;
  const int32_t args = schema_rule(c, params, opts, "tool '" + t.name + "'");
  const std::string head = "{\"name\": " + Json(t.name).dump(-1, ' ', false, Json::error_handler_t::replace) +
                           ", \"" + std::string(args_key) + "\": ";
  return c.sequence("call:" + t.name, {SeqItem::text(head), SeqItem::call(args), SeqItem::text("}")});
}

int32_t calls_rule(GrammarComposer& c, ToolFormat format, const std::vector<ToolCallSpec>& tools,
                   const ToolCallGrammarOptions& o) {
  EXL_CHECK(!tools.empty(), kWhere, "no tools to call");
  std::vector<int32_t> alts;
  const std::string_view key = format == ToolFormat::llama3_json ? "parameters" : "arguments";
  for (const ToolCallSpec& t : tools) {
    EXL_CHECK(!t.name.empty(), kWhere, "a tool has an empty name");
    if (o.mode == ToolCallMode::named && t.name != o.tool_name) continue;
    alts.push_back(call_rule(c, t, key, o.schema_options));
  }
  EXL_CHECK(!alts.empty(), kWhere, "no tool named '", o.tool_name, "'");
  const int32_t one = c.alternatives("tool_call", alts);
  switch (format) {
    case ToolFormat::llama3_json: return one;
    case ToolFormat::hermes: {
      const int32_t block = c.sequence(
          "tool_call_block", {SeqItem::text("<tool_call>\n"), SeqItem::call(one), SeqItem::text("\n</tool_call>")});
      return c.list("tool_calls", block, "\n", o.parallel_tool_calls);
    }
    case ToolFormat::generic: {
      const int32_t block = c.sequence(
          "tool_call_block", {SeqItem::text("<tool_call>"), SeqItem::call(one), SeqItem::text("</tool_call>")});
      return c.list("tool_calls", block, "\n", o.parallel_tool_calls);
    }
    case ToolFormat::mistral: {
      const int32_t items = c.list("tool_call_items", one, ", ", o.parallel_tool_calls);
      return c.sequence("tool_calls", {SeqItem::text("[TOOL_CALLS] ["), SeqItem::call(items), SeqItem::text("]")});
    }
  }
  fail(kWhere, "unknown tool format");
}

// What a tool call of the format begins with.
std::string_view call_marker(ToolFormat format) {
  switch (format) {
    case ToolFormat::llama3_json: return "{";
    case ToolFormat::hermes:
    case ToolFormat::generic: return "<tool_call>";
    case ToolFormat::mistral: return "[TOOL_CALLS]";
  }
  fail(kWhere, "unknown tool format");
}

std::string hex_escaped(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char ch : s) out += cat("\\x", kHex[ch >> 4], kHex[ch & 15]);
  return out;
}

Rule byte_regex_dfa(const std::string& pattern) {
  GrammarBuilder b;
  const int32_t r = b.add_rule("text");
  b.frags(r).set_root(emit_regex(b, r, pattern, {.byte_only = true}));
  return determinize_bytes(b.nfa(r), "text", grammar_automaton_limit());
}

// Non-empty text that holds no tool call of the format: for llama3_json, text whose first
// non-whitespace character is not "{" (a call is the whole reply); for the others, text in which
// the call marker appears nowhere.
int32_t no_call_rule(GrammarComposer& c, ToolFormat format) {
  if (format == ToolFormat::llama3_json) return c.embed(compile_regex_grammar("\\s*[^\\s{][\\s\\S]*"));
  const Rule any = byte_regex_dfa("[\\s\\S]+");
  const Rule with_marker = byte_regex_dfa("[\\s\\S]*" + hex_escaped(call_marker(format)) + "[\\s\\S]*");
  GrammarBuilder b;
  const int32_t r = b.add_rule("text_without_tool_call");
  b.set_dfa(r, std::make_shared<const Rule>(intersect_bytes(any, with_marker, true, grammar_automaton_limit())));
  return c.embed(b.finish(r));
}

std::string class_char(char ch, bool negated) {
  std::string c = negated ? "[^" : "[";
  if (ch == ']' || ch == '\\' || ch == '^' || ch == '-') c += '\\';
  return c + ch + "]";
}

// Non-empty text that does not begin with `marker`: m0 m1 .. m(i-1), then end or any other char.
int32_t text_rule(GrammarComposer& c, std::string_view marker) {
  std::string tail;
  for (size_t i = marker.size(); i-- > 1;)
    tail = "(?:" + class_char(marker[i], true) + "[\\s\\S]*" + (tail.empty() ? "" : "|" + class_char(marker[i], false) + tail) + ")?";
  std::string re = class_char(marker[0], true) + "[\\s\\S]*";
  if (marker.size() > 1) re = "(?:" + re + "|" + class_char(marker[0], false) + tail + ")";
  return c.embed(compile_regex_grammar(re));
}

}  // namespace

std::vector<ToolCallSpec> tool_specs_from_openai(const Json& tools) {
  std::vector<ToolCallSpec> out;
  if (tools.is_null()) return out;
  EXL_CHECK(tools.is_array(), kWhere, "'tools' must be an array");
  for (const auto& t : tools) {
    const Json* fn = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
    EXL_CHECK(fn && fn->is_object() && fn->contains("name") && (*fn)["name"].is_string(), kWhere,
              "a tool lacks function.name");
    ToolCallSpec s;
    s.name = (*fn)["name"].get<std::string>();
    if (fn->contains("parameters")) s.parameters = (*fn)["parameters"];
    out.push_back(std::move(s));
  }
  return out;
}

Grammar tool_call_grammar(ToolFormat format, const std::vector<ToolCallSpec>& tools, const ToolCallGrammarOptions& o) {
  GrammarComposer c;
  int32_t root = -1;
  switch (o.mode) {
    case ToolCallMode::required:
    case ToolCallMode::named: root = calls_rule(c, format, tools, o); break;
    case ToolCallMode::no_call: root = no_call_rule(c, format); break;
    case ToolCallMode::final_answer:
      root = c.sequence("final_answer", {SeqItem::call(schema_rule(c, o.final_schema, o.schema_options, "final answer"))});
      break;
    case ToolCallMode::call_or_text: {
      const int32_t calls = calls_rule(c, format, tools, o);
      root = c.alternatives("call_or_text", {calls, text_rule(c, call_marker(format))});
      break;
    }
    case ToolCallMode::call_or_plain_text: {
      const int32_t calls = calls_rule(c, format, tools, o);
      root = c.alternatives("call_or_plain_text", {calls, no_call_rule(c, format)});
      break;
    }
    case ToolCallMode::call_or_final: {
      const int32_t calls = calls_rule(c, format, tools, o);
      const int32_t final = schema_rule(c, o.final_schema, o.schema_options, "final answer");
      root = c.alternatives("call_or_final", {calls, final});
      break;
    }
  }
  return c.finish(root);
}

std::shared_ptr<const CompiledGrammar> compile_tool_call_grammar_for(ToolFormat format,
                                                                     const nlohmann::ordered_json& openai_tools,
                                                                     const ToolCallGrammarOptions& o,
                                                                     const Tokenizer& tokenizer) {
  std::string source = cat("tool_call:", int(format), '|', int(o.mode), '|', o.parallel_tool_calls, '|', o.tool_name,
                           '|', o.final_schema.dump(), '|', openai_tools.dump());
  return cached_grammar_for(tokenizer, std::move(source), json_schema_options_key(o.schema_options), [&] {
    return compile_grammar_for(tool_call_grammar(format, tool_specs_from_openai(openai_tools), o), tokenizer);
  });
}

}  // namespace exl
