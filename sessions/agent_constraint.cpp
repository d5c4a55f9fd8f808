#include "sessions/agent_constraint.h"

#include <utility>

#include "engine/generate/grammar_constraint.h"
#include "kernels/error.h"
#include "sessions/tool_call_grammar.h"

namespace exl {

std::shared_ptr<LogitsMaskHook> make_agent_turn_constraint(const AgentTurnContext& ctx, const Tokenizer& tokenizer) {
  const bool has_tools = ctx.tools && ctx.tools->is_array() && !ctx.tools->empty();
  const bool has_final = ctx.final_answer_schema && !ctx.final_answer_schema->is_null();
  if (!has_final && !has_tools) return nullptr;
  JsonSchemaOptions so;
  so.whitespace = JsonSchemaOptions::Whitespace::spaced;
  const nlohmann::ordered_json final_schema = has_final ? *ctx.final_answer_schema : nlohmann::ordered_json();
  std::shared_ptr<const CompiledGrammar> grammar;
  if (!has_tools) {
    grammar = cached_json_schema_for(final_schema, tokenizer, so);
  } else {
    ToolCallGrammarOptions o;
    o.mode = has_final ? ToolCallMode::call_or_final : ToolCallMode::call_or_text;
    o.final_schema = final_schema;
    o.schema_options = so;
    grammar = compile_tool_call_grammar_for(ctx.tool_format, *ctx.tools, o, tokenizer);
  }
  return make_grammar_constraint(std::move(grammar), tokenizer);
}

std::shared_ptr<ForcedTextHook> ForcedTextHook::for_text(const Tokenizer& tokenizer, std::string_view text) {
  EXL_CHECK(!tokenizer.eos_ids().empty(), "sessions: forced text: the tokenizer has no eos token");
  return std::make_shared<ForcedTextHook>(tokenizer.encode(text, false), *tokenizer.eos_ids().begin());
}

void ForcedTextHook::fill_mask(std::span<uint32_t> mask) {
  const int32_t t = pos_ < tokens_.size() ? tokens_[pos_] : end_;
  if (t >= 0 && size_t(t) / 32 < mask.size()) mask[size_t(t) / 32] |= 1u << (t % 32);
}

void ForcedTextHook::accept(int32_t) { ++pos_; }

}  // namespace exl
