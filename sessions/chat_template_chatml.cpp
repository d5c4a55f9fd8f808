// ChatML as Qwen2.5-Instruct's chat_template renders it: tools listed in the system turn inside
// <tools></tools> (one JSON object per line), calls as Hermes <tool_call> blocks, results as
// <tool_response> blocks inside one user turn per run of tool messages. Plain ChatML is the same
// without Qwen's default system prompt.
#include "kernels/error.h"
#include "sessions/chat_template_families.h"
#include "sessions/python_json.h"

namespace exl::chat_detail {

namespace {

class ChatmlTemplate final : public ChatTemplate {
 public:
  ChatmlTemplate(TemplateTokens t, std::string default_system)
      : tok_(std::move(t)), default_system_(std::move(default_system)) {}
  TemplateFamily family() const override { return TemplateFamily::chatml; }
  ToolFormat tool_format() const override { return ToolFormat::hermes; }

  RenderedPrompt render(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                        bool add_generation_prompt) const override {
    PromptWriter out;
    const bool first_is_system = !messages.empty() && messages[0].role == "system";
    const std::string& system = first_is_system ? messages[0].content : default_system_;
    if (has_tools(tools)) {
      out.markup("<|im_start|>system\n");
      out.text(system);
      if (!system.empty()) out.markup("\n\n");
      out.markup("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
      for (const auto& t : tools) {
        out.markup("\n");
        out.text(python_json_dumps(t));
      }
      out.markup("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                 "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                 "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (first_is_system || !system.empty()) {
      out.markup("<|im_start|>system\n");
      out.text(system);
      out.markup("<|im_end|>\n");
    }
    for (size_t i = first_is_system ? 1 : 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if (m.role == "user" || m.role == "system" || (m.role == "assistant" && m.tool_calls.empty())) {
        out.markup("<|im_start|>" + m.role + "\n");
        out.text(m.content);
        out.markup("<|im_end|>\n");
      } else if (m.role == "assistant") {
        out.markup("<|im_start|>assistant");
        if (!m.content.empty()) {
          out.markup("\n");
          out.text(m.content);
        }
        for (const auto& c : m.tool_calls) {
          out.markup("\n<tool_call>\n{\"name\": \"");
          out.text(c.name);
          out.markup("\", \"arguments\": ");
          out.text(python_json_dumps(arguments_value(c.arguments)));
          out.markup("}\n</tool_call>");
        }
        out.markup("<|im_end|>\n");
      } else if (m.role == "tool") {
        if (i == 0 || messages[i - 1].role != "tool") out.markup("<|im_start|>user");
        out.markup("\n<tool_response>\n");
        out.text(m.content);
        out.markup("\n</tool_response>");
        if (i + 1 == messages.size() || messages[i + 1].role != "tool") out.markup("<|im_end|>\n");
      } else {
        template_error(family(), "unknown role '" + m.role + "'");
      }
    }
    if (add_generation_prompt) out.markup("<|im_start|>assistant\n");
    return out.take();
  }

  ParsedReply parse_reply(std::string_view text, bool tools_enabled) const override {
    return parse_tool_call_tags(text, tools_enabled);
  }

  std::vector<std::string> stop_strings() const override { return {"<|im_end|>"}; }

 private:
  TemplateTokens tok_;
  std::string default_system_;
};

}  // namespace

std::unique_ptr<ChatTemplate> make_chatml(TemplateTokens tokens, std::string default_system) {
  return std::make_unique<ChatmlTemplate>(std::move(tokens), std::move(default_system));
}

}  // namespace exl::chat_detail
