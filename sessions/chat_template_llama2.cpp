// Llama 2 chat (meta-llama/Llama-2-*-chat-hf's chat_template): "<s>[INST] <<SYS>>\n...\n<</SYS>>\n\n"
// on the first user turn, strictly alternating user/assistant turns. Tools in the generic format
// (chat_template.h: ToolFormat): the tool prompt joins the <<SYS>> block, a run of tool results
// takes a user turn's place.
#include "kernels/error.h"
#include "sessions/chat_template_families.h"

namespace exl::chat_detail {

namespace {

class Llama2Template final : public ChatTemplate {
 public:
  explicit Llama2Template(TemplateTokens t) : tok_(std::move(t)) {}
  TemplateFamily family() const override { return TemplateFamily::llama2; }
  ToolFormat tool_format() const override { return ToolFormat::generic; }

  RenderedPrompt render(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                        bool add_generation_prompt) const override {
    std::optional<std::string> system = take_system_message(messages);
    if (has_tools(tools)) system = (system ? *system + "\n\n" : std::string()) + generic_tools_prompt(tools);
    PromptWriter out;
    size_t turn = 0;
    for (size_t i = 0; i < messages.size(); ++i, ++turn) {
      const auto& m = messages[i];
      const bool user_turn = m.role == "user" || m.role == "tool";
      if (user_turn != (turn % 2 == 0) || (!user_turn && m.role != "assistant") ||
          (m.role != "assistant" && !m.tool_calls.empty()))
        template_error(family(), "conversation roles must alternate user (or tool results)/assistant/user/... "
                                 "(message " + std::to_string(i) + " is '" + m.role + "')");
      // The <<SYS>> block is plain text in Llama 2's vocabulary, and the template trims it together
      // with the message, so the whole block is content.
      std::string content;
      if (m.role == "tool") {
        size_t end = i + 1;
        while (end < messages.size() && messages[end].role == "tool") ++end;
        content = generic_tool_results_text(messages.subspan(i, end - i));
        i = end - 1;
      } else {
        content = m.tool_calls.empty() ? m.content : generic_calls_text(m);
      }
      if (turn == 0 && system) content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + content;
      if (user_turn) {
        out.markup(tok_.bos + "[INST] ");
        out.text(trim(content));
        out.markup(" [/INST]");
      } else {
        out.markup(" ");
        out.text(trim(content));
        out.markup(" " + tok_.eos);
      }
    }
    (void)add_generation_prompt;  // the [/INST] of the last user turn is the generation prompt
    return out.take();
  }

  ParsedReply parse_reply(std::string_view text, bool tools_enabled) const override {
    return parse_tool_call_tags(text, tools_enabled);
  }
  std::vector<std::string> stop_strings() const override { return {tok_.eos}; }

 private:
  TemplateTokens tok_;
};

}  // namespace

std::unique_ptr<ChatTemplate> make_llama2(TemplateTokens tokens) {
  return std::make_unique<Llama2Template>(with_sentencepiece_markers(std::move(tokens)));
}

}  // namespace exl::chat_detail
