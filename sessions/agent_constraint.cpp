#include "sessions/agent_constraint.h"

#include "kernels/error.h"

namespace exl {

std::shared_ptr<LogitsMaskHook> make_agent_turn_constraint(const AgentTurnContext&, const Tokenizer&) {
  // GRAMMAR SEAM: return the tool-call / final-answer grammar hook here once
  // engine/grammar_constraint.h and sessions/tool_call_grammar.h are on main.
  return nullptr;
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
