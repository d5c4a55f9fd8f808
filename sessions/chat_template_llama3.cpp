// Llama 3.0 Instruct renders each message as a header turn after bos, nothing else; it has no
// tool format of its own, so tools use the generic one (chat_template.h: ToolFormat).
// Llama 3.1 / 3.2 / 3.3 Instruct, as meta-llama's tokenizer_config.json chat_template renders with
// its defaults: date_string "26 Jul 2024", tools_in_user_message true (the tool list goes into the
// first user message), no builtin_tools. Tool calls are {"name": ..., "parameters": {...}}, one
// per assistant turn; tool results go back in the ipython role as JSON.
#include "kernels/error.h"
#include "sessions/chat_template_families.h"
#include "sessions/python_json.h"

namespace exl::chat_detail {

namespace {

constexpr std::string_view kEot = "<|eot_id|>";

std::string header(std::string_view role) { return cat("<|start_header_id|>", role, "<|end_header_id|>\n\n"); }

class Llama3Template final : public ChatTemplate {
 public:
  Llama3Template(TemplateTokens t, bool v30) : tok_(std::move(t)), v30_(v30) {}
  TemplateFamily family() const override { return TemplateFamily::llama3; }
  ToolFormat tool_format() const override { return v30_ ? ToolFormat::generic : ToolFormat::llama3_json; }

  RenderedPrompt render(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                        bool add_generation_prompt) const override {
    if (v30_) return render_3_0(messages, tools, add_generation_prompt);
    const bool with_tools = has_tools(tools);
    PromptWriter out;
    out.markup(tok_.bos);
    std::string_view system;
    if (!messages.empty() && messages[0].role == "system") {
      system = trim(messages[0].content);
      messages = messages.subspan(1);
    }
    out.markup(header("system"));
    if (with_tools) out.markup("Environment: ipython\n");
    out.markup("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    out.text(system);
    out.markup(kEot);
    if (with_tools) {
      if (messages.empty()) template_error(family(), "tools need a first user message to carry them");
      out.markup(header("user"));
      out.markup("Given the following functions, please respond with a JSON for a function call "
                 "with its proper arguments that best answers the given prompt.\n\n"
                 "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and "
                 "its value}.Do not use variables.\n\n");
      for (const auto& t : tools) {
        out.text(python_json_dumps(t, 4));
        out.markup("\n\n");
      }
      out.text(trim(messages[0].content));
      out.markup(kEot);
      messages = messages.subspan(1);
    }
    for (const auto& m : messages) {
      if (!m.tool_calls.empty()) {
        if (m.tool_calls.size() != 1) template_error(family(), "this model only supports single tool-calls at once");
        const auto& c = m.tool_calls[0];
        out.markup(header("assistant"));
        out.markup("{\"name\": \"");
        out.text(c.name);
        out.markup("\", \"parameters\": ");
        out.text(python_json_dumps(arguments_value(c.arguments)));
        out.markup("}");
      } else if (m.role == "tool" || m.role == "ipython") {
        out.markup(header("ipython"));
        out.text(python_json_dumps(nlohmann::ordered_json(m.content)));
      } else {
        if (m.role != "system" && m.role != "user" && m.role != "assistant")
          template_error(family(), "unknown role '" + m.role + "'");
        out.markup(header(m.role));
        out.text(trim(m.content));
      }
      out.markup(kEot);
    }
    if (add_generation_prompt) out.markup(header("assistant"));
    return out.take();
  }

  ParsedReply parse_reply(std::string_view text, bool tools_enabled) const override {
    if (v30_) return parse_tool_call_tags(text, tools_enabled);
    ParsedReply r;
    std::string_view body = trim(text);
    constexpr std::string_view kPython = "<|python_tag|>";
    if (body.substr(0, kPython.size()) == kPython) body = trim(body.substr(kPython.size()));
    if (tools_enabled && !body.empty() && body.front() == '{')
      if (auto j = parse_json(body))
        if (auto c = tool_call_from_json(*j)) {
          r.tool_calls.push_back(std::move(*c));
          return r;
        }
    r.content = std::string(text);
    return r;
  }

  std::vector<std::string> stop_strings() const override { return {"<|eot_id|>", "<|eom_id|>"}; }

 private:
  // Llama 3.0: a header turn per message, nothing else; tools in the generic format (the tool
  // prompt ends the system turn, which is added when there is none; a run of tool results is one
  // user turn).
  RenderedPrompt render_3_0(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                            bool add_generation_prompt) const {
    PromptWriter out;
    out.markup(tok_.bos);
    if (has_tools(tools)) {
      std::optional<std::string> system = take_system_message(messages);
      out.markup(header("system"));
      out.text(system ? cat(trim(*system), "\n\n", generic_tools_prompt(tools)) : generic_tools_prompt(tools));
      out.markup(kEot);
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if (m.role == "tool") {
        size_t end = i + 1;
        while (end < messages.size() && messages[end].role == "tool") ++end;
        out.markup(header("user"));
        out.text(trim(generic_tool_results_text(messages.subspan(i, end - i))));
        out.markup(kEot);
        i = end - 1;
        continue;
      }
      if ((m.role != "assistant" && !m.tool_calls.empty()) ||
          (m.role != "system" && m.role != "user" && m.role != "assistant"))
        template_error("llama3.0", "unknown role '" + m.role + "' (expected system, user, assistant or tool)");
      out.markup(header(m.role));
      out.text(trim(m.tool_calls.empty() ? m.content : generic_calls_text(m)));
      out.markup(kEot);
    }
    if (add_generation_prompt) out.markup(header("assistant"));
    return out.take();
  }

  TemplateTokens tok_;
  bool v30_;
};

}  // namespace

std::unique_ptr<ChatTemplate> make_llama3(TemplateTokens tokens, bool version_3_0) {
  if (tokens.bos.empty()) tokens.bos = "<|begin_of_text|>";
  return std::make_unique<Llama3Template>(std::move(tokens), version_3_0);
}

}  // namespace exl::chat_detail
