// Internal to sessions/: the per-family renderers behind make_chat_template and the pieces they
// share. Not part of the public interface.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sessions/chat_template.h"

namespace exl::chat_detail {

// Builds a RenderedPrompt: markup() for the template's own text, text() for anything taken from
// the conversation or the tools.
class PromptWriter {
 public:
  void markup(std::string_view s);
  void text(std::string_view s);
  RenderedPrompt take() { return std::move(p_); }

 private:
  RenderedPrompt p_;
};

std::unique_ptr<ChatTemplate> make_llama3(TemplateTokens tokens, bool version_3_0);
std::unique_ptr<ChatTemplate> make_chatml(TemplateTokens tokens, std::string default_system);
std::unique_ptr<ChatTemplate> make_mistral(TemplateTokens tokens);
std::unique_ptr<ChatTemplate> make_llama2(TemplateTokens tokens);

// The content of a leading system message, which is then dropped from messages; nullopt when the
// conversation does not start with one.
std::optional<std::string> take_system_message(std::span<const ChatMessage>& messages);
// tokens with bos "<s>" and eos "</s>" where unset (the SentencePiece markers of Llama 2 and Mistral).
TemplateTokens with_sentencepiece_markers(TemplateTokens tokens);
// True when tools is a non-empty array.
bool has_tools(const nlohmann::ordered_json& tools);
// Tool-call arguments as a JSON value for `| tojson`; text that is not JSON stays a string.
nlohmann::ordered_json arguments_value(const std::string& arguments_text);
// A call from {"name": ..., "arguments"|"parameters": {...}[, "id": ...]}; nullopt when the
// object lacks a string name or object arguments.
std::optional<ToolCall> tool_call_from_json(const nlohmann::ordered_json& obj);
// Parses `text` as one JSON value; nullopt when it is not exactly one.
std::optional<nlohmann::ordered_json> parse_json(std::string_view text);
// Leading and trailing ASCII whitespace removed (Jinja's trim / Python's strip).
std::string_view trim(std::string_view s);
// n characters of [A-Za-z0-9] derived from `random`.
std::string alnum_id(uint64_t random, size_t n);
// "sessions: chat template: <family>: " + what
[[noreturn]] void template_error(TemplateFamily f, const std::string& what);
// "sessions: chat template: <name>: " + what, for a template named other than its family (llama3.0).
[[noreturn]] void template_error(std::string_view name, const std::string& what);

// The generic tool format (ToolFormat::generic in chat_template.h), as text:
// an assistant message's content followed by its calls as <tool_call>{..}</tool_call> lines;
std::string generic_calls_text(const ChatMessage& assistant);
// a run of tool messages as <tool_response> blocks.
std::string generic_tool_results_text(std::span<const ChatMessage> run);
// Content plus the calls of <tool_call>{json}</tool_call> blocks (whitespace around the JSON
// allowed), the text before the first block being the content; all content when tools are
// disabled or any block, or text after the blocks, is not a well-formed call (Hermes and generic).
ParsedReply parse_tool_call_tags(std::string_view text, bool tools_enabled);

}  // namespace exl::chat_detail
