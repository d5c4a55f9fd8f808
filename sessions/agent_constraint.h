// What constrains the model's output in one agent turn. make_agent_turn_constraint returns the
// LogitsMaskHook for a turn: a call of one of the turn's tools in the template's syntax (arguments
// valid for that tool's schema), or else the final answer valid for the session's final-answer
// schema, or else (no schema) free text that does not begin with the call marker; nullptr when
// the turn has neither tools nor a schema. JSON uses json.dumps spacing (", ", ": ").
// Compiled grammars are cached per (vocabulary, tool format, tools, schema) in the process-wide
// compiled-grammar cache (grammar/grammar_cache.h). Throws GrammarError for a
// schema the grammar engine cannot enforce.
//
// ForcedTextHook scripts a reply: it allows exactly the tokens of a given text, then an end
// token. Tests and benchmarks use it to make a tiny model emit a known tool call or answer.
// Hooks are used by one job at a time (the generator's stepping thread).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/generate/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "sessions/chat_template.h"

namespace exl {

struct AgentTurnContext {
  int turn = 0;                             // 1-based within the current run
  std::span<const ChatMessage> messages;    // the conversation being continued
  const nlohmann::ordered_json* tools;      // OpenAI tool objects offered this turn (may be empty)
  const nlohmann::ordered_json* final_answer_schema;  // null json when the session has none
  ToolFormat tool_format = ToolFormat::hermes;  // the chat template's
};

using TurnConstraintFactory = std::function<std::shared_ptr<LogitsMaskHook>(const AgentTurnContext&)>;

std::shared_ptr<LogitsMaskHook> make_agent_turn_constraint(const AgentTurnContext& ctx, const Tokenizer& tokenizer);

class ForcedTextHook : public LogitsMaskHook {
 public:
  // tokens: the reply; end: the token allowed once they are all emitted.
  ForcedTextHook(std::vector<int32_t> tokens, int32_t end) : tokens_(std::move(tokens)), end_(end) {}
  // The tokens of `text` as encode(text, false) gives them, ended by the tokenizer's first eos.
  // Throws exl::Error when the tokenizer has no eos.
  static std::shared_ptr<ForcedTextHook> for_text(const Tokenizer& tokenizer, std::string_view text);
  void fill_mask(std::span<uint32_t> mask) override;
  void accept(int32_t token) override;

 private:
  std::vector<int32_t> tokens_;
  int32_t end_;
  size_t pos_ = 0;
};

}  // namespace exl
