// The generic tool format (ToolFormat::generic) for templates without a native one: the tool
// prompt, calls and results as plain text, and the parser of <tool_call> blocks that ChatML's
// Hermes format shares.
#include "kernels/error.h"
#include "sessions/chat_template_families.h"
#include "sessions/python_json.h"

namespace exl {

namespace {

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

}  // namespace

std::string to_string(ToolFormat f) {
  switch (f) {
    case ToolFormat::llama3_json: return "llama3_json";
    case ToolFormat::hermes: return "hermes";
    case ToolFormat::mistral: return "mistral";
    case ToolFormat::generic: return "generic";
  }
  return "?";
}

std::string generic_tools_prompt(const nlohmann::ordered_json& tools) {
  std::string s =
      "You can call these tools. To call one, reply with only <tool_call>{\"name\": <tool name>, \"arguments\": "
      "<arguments object>}</tool_call>.\nTools:";
  if (tools.is_array())
    for (const auto& t : tools) {
      s += '\n';
      s += python_json_dumps(t.is_object() && t.contains("function") ? t["function"] : t);
    }
  return s;
}

namespace chat_detail {

std::string generic_calls_text(const ChatMessage& m) {
  std::string s = m.content;
  for (const ToolCall& c : m.tool_calls) {
    if (!s.empty()) s += '\n';
    nlohmann::ordered_json call = {{"name", c.name}, {"arguments", arguments_value(c.arguments)}};
    s += cat(kCallOpen, python_json_dumps(call), kCallClose);
  }
  return s;
}

std::string generic_tool_results_text(std::span<const ChatMessage> run) {
  std::string s;
  for (const ChatMessage& m : run) {
    if (!s.empty()) s += '\n';
    s += cat("<tool_response>\n", m.content, "\n</tool_response>");
  }
  return s;
}

ParsedReply parse_tool_call_tags(std::string_view text, bool tools_enabled) {
  ParsedReply r;
  const size_t first = text.find(kCallOpen);
  if (!tools_enabled || first == std::string_view::npos) {
    r.content = std::string(text);
    return r;
  }
  size_t pos = first;
  while (pos != std::string_view::npos) {
    const size_t body = pos + kCallOpen.size();
    const size_t end = text.find(kCallClose, body);
    std::optional<ToolCall> call;
    if (end != std::string_view::npos)
      if (auto j = parse_json(trim(text.substr(body, end - body)))) call = tool_call_from_json(*j);
    if (!call) {
      r.tool_calls.clear();
      r.content = std::string(text);
      return r;
    }
    r.tool_calls.push_back(std::move(*call));
    pos = end + kCallClose.size();
    if (!trim(text.substr(pos)).empty()) pos = text.find(kCallOpen, pos);
    else break;
    if (pos == std::string_view::npos) {
      r.tool_calls.clear();
      r.content = std::string(text);
      return r;
    }
  }
  std::string_view content = text.substr(0, first);
  while (!content.empty() && (content.back() == '\n' || content.back() == ' ')) content.remove_suffix(1);
  r.content = std::string(content);
  return r;
}

}  // namespace chat_detail

}  // namespace exl
