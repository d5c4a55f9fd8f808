// Llama 2 chat (meta-llama/Llama-2-*-chat-hf's chat_template): "<s>[INST] <<SYS>>\n...\n<</SYS>>\n\n"
// on the first user turn, strictly alternating user/assistant turns, no tool format.
#include "kernels/error.h"
#include "sessions/chat_template_families.h"

namespace exl::chat_detail {

namespace {

class Llama2Template final : public ChatTemplate {
 public:
  explicit Llama2Template(TemplateTokens t) : tok_(std::move(t)) {}
  TemplateFamily family() const override { return TemplateFamily::llama2; }

  RenderedPrompt render(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                        bool add_generation_prompt) const override {
    if (has_tools(tools)) template_error(family(), "Llama 2 has no tool format; choose another template");
    const std::optional<std::string> system = take_system_message(messages);
    PromptWriter out;
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if ((m.role == "user") != (i % 2 == 0) || (m.role != "user" && m.role != "assistant") || !m.tool_calls.empty())
        template_error(family(), "conversation roles must alternate user/assistant/user/assistant/... (message " +
                                     std::to_string(i) + " is '" + m.role + "')");
      // The <<SYS>> block is plain text in Llama 2's vocabulary, and the template trims it together
      // with the message, so the whole block is content.
      std::string content = m.content;
      if (i == 0 && system) content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + content;
      if (m.role == "user") {
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

  ParsedReply parse_reply(std::string_view text, bool) const override { return {std::string(text), {}}; }
  std::vector<std::string> stop_strings() const override { return {tok_.eos}; }

 private:
  TemplateTokens tok_;
};

}  // namespace

std::unique_ptr<ChatTemplate> make_llama2(TemplateTokens tokens) {
  return std::make_unique<Llama2Template>(with_sentencepiece_markers(std::move(tokens)));
}

}  // namespace exl::chat_detail
