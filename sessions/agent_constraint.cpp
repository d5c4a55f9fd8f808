#include "sessions/agent_constraint.h"

#include <list>
#include <mutex>
#include <utility>

#include "engine/generate/grammar_constraint.h"
#include "kernels/error.h"
#include "sessions/tool_call_grammar.h"

namespace exl {

namespace {

// Compiled turn grammars by (tokenizer, family, tools, schema): every turn of a session, and of
// sessions sharing a configuration, reuses one.
class TurnGrammarCache {
 public:
  std::shared_ptr<const CompiledGrammar> get(const std::string& key, const std::function<std::shared_ptr<const CompiledGrammar>()>& make) {
    {
      std::lock_guard lk(mu_);
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (it->first == key) {
          entries_.splice(entries_.begin(), entries_, it);
          return it->second;
        }
    }
    auto g = make();
    std::lock_guard lk(mu_);
    entries_.emplace_front(key, g);
    if (entries_.size() > kMax) entries_.pop_back();
    return g;
  }

 private:
  static constexpr size_t kMax = 32;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> entries_;
};

}  // namespace

std::shared_ptr<LogitsMaskHook> make_agent_turn_constraint(const AgentTurnContext& ctx, const Tokenizer& tokenizer) {
  const bool has_tools = ctx.tools && ctx.tools->is_array() && !ctx.tools->empty();
  const bool has_final = ctx.final_answer_schema && !ctx.final_answer_schema->is_null();
  if (!has_final && !has_tools) return nullptr;
  static TurnGrammarCache cache;
  const std::string key = cat(reinterpret_cast<uintptr_t>(&tokenizer), '|', int(ctx.family), '|',
                              has_tools ? ctx.tools->dump() : std::string(), '|', has_final ? ctx.final_answer_schema->dump() : std::string());
  auto grammar = cache.get(key, [&]() -> std::shared_ptr<const CompiledGrammar> {
    JsonSchemaOptions so;
    so.whitespace = JsonSchemaOptions::Whitespace::spaced;
    const nlohmann::ordered_json final_schema = has_final ? *ctx.final_answer_schema : nlohmann::ordered_json();
    if (!has_tools) return compile_json_schema_for(final_schema, tokenizer, so);
    ToolCallGrammarOptions o;
    o.mode = has_final ? ToolCallMode::call_or_final : ToolCallMode::call_or_text;
    o.final_schema = final_schema;
    o.schema_options = so;
    return compile_grammar_for(tool_call_grammar(ctx.family, tool_specs_from_openai(*ctx.tools), o), tokenizer);
  });
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
