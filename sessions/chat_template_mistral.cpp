// Mistral v0.3 (Mistral-7B-Instruct-v0.3's chat_template): [INST] turns, the tool list in
// [AVAILABLE_TOOLS], calls as [TOOL_CALLS] [{"name", "arguments", "id"}] with 9-character ids,
// results as [TOOL_RESULTS] {"content": ..., "call_id": ...}.
//
// One deliberate difference: the official template puts the system prompt and the tool list in
// front of the *last* user message, which rewrites earlier turns every time the user speaks. We put
// them in front of the *first* user message, so the rendering of a conversation with one user
// message is identical and longer conversations stay prefix-stable.
#include "kernels/error.h"
#include "sessions/chat_template_families.h"
#include "sessions/python_json.h"

namespace exl::chat_detail {

namespace {

constexpr std::string_view kToolCalls = "[TOOL_CALLS]";

void write_available_tools(PromptWriter& out, const nlohmann::ordered_json& tools) {
  out.markup("[AVAILABLE_TOOLS] [");
  bool first_tool = true;
  for (const auto& t : tools) {
    if (!first_tool) out.markup(", ");
    first_tool = false;
    out.markup("{\"type\": \"function\", \"function\": {");
    const auto& fn = t.contains("function") ? t["function"] : t;
    bool first = true;
    for (auto it = fn.begin(); it != fn.end(); ++it) {
      if (it.key() == "return") continue;
      if (!first) out.markup(", ");
      first = false;
      out.markup("\"");
      out.text(it.key());
      out.markup("\": ");
      if (it->is_string()) {
        out.markup("\"");
        out.text(it->get<std::string>());
        out.markup("\"");
      } else {
        out.text(python_json_dumps(*it));
      }
    }
    out.markup("}}");
  }
  out.markup("][/AVAILABLE_TOOLS]");
}

class MistralTemplate final : public ChatTemplate {
 public:
  explicit MistralTemplate(TemplateTokens t) : tok_(std::move(t)) {}
  TemplateFamily family() const override { return TemplateFamily::mistral; }
  ToolFormat tool_format() const override { return ToolFormat::mistral; }

  RenderedPrompt render(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                        bool add_generation_prompt) const override {
    const std::optional<std::string> system = take_system_message(messages);
    PromptWriter out;
    out.markup(tok_.bos);
    bool first_user = true;
    for (const auto& m : messages) {
      if (m.role == "user") {
        if (first_user && has_tools(tools)) write_available_tools(out, tools);
        out.markup("[INST] ");
        if (first_user && system) {
          out.text(*system);
          out.markup("\n\n");
        }
        out.text(m.content);
        out.markup("[/INST]");
        first_user = false;
      } else if (m.role == "assistant" && !m.tool_calls.empty()) {
        out.markup("[TOOL_CALLS] [");
        for (size_t i = 0; i < m.tool_calls.size(); ++i) {
          const auto& c = m.tool_calls[i];
          nlohmann::ordered_json fn = {{"name", c.name}, {"arguments", arguments_value(c.arguments)}};
          std::string j = python_json_dumps(fn);
          j.pop_back();
          out.text(j);
          out.markup(", \"id\": \"");
          out.text(c.id);
          out.markup("\"}");
          out.markup(i + 1 < m.tool_calls.size() ? ", " : "]" + tok_.eos);
        }
      } else if (m.role == "assistant") {
        out.markup(" ");
        out.text(trim(m.content));
        out.markup(tok_.eos);
      } else if (m.role == "tool") {
        out.markup("[TOOL_RESULTS] {\"content\": ");
        out.text(m.content);
        out.markup(", \"call_id\": \"");
        out.text(m.tool_call_id);
        out.markup("\"}[/TOOL_RESULTS]");
      } else {
        template_error(family(), "only user, assistant and tool roles are supported after an optional first "
                                 "system message, got '" + m.role + "'");
      }
    }
    (void)add_generation_prompt;  // the [/INST] of the last user turn is the generation prompt
    return out.take();
  }

  ParsedReply parse_reply(std::string_view text, bool tools_enabled) const override {
    ParsedReply r;
    const size_t at = text.find(kToolCalls);
    if (tools_enabled && at != std::string_view::npos)
      if (auto j = parse_json(trim(text.substr(at + kToolCalls.size()))); j && j->is_array() && !j->empty()) {
        for (const auto& e : *j) {
          auto c = tool_call_from_json(e);
          if (!c) {
            r.tool_calls.clear();
            break;
          }
          r.tool_calls.push_back(std::move(*c));
        }
        if (!r.tool_calls.empty()) {
          r.content = std::string(trim(text.substr(0, at)));
          return r;
        }
      }
    r.content = std::string(text);
    return r;
  }

  std::vector<std::string> stop_strings() const override { return {tok_.eos}; }
  std::string make_tool_call_id(uint64_t random) const override { return alnum_id(random, 9); }

 private:
  TemplateTokens tok_;
};

}  // namespace

std::unique_ptr<ChatTemplate> make_mistral(TemplateTokens tokens) {
  return std::make_unique<MistralTemplate>(with_sentencepiece_markers(std::move(tokens)));
}

}  // namespace exl::chat_detail
