// Chat templates: conversation messages (OpenAI shape) -> the prompt text a model was trained on,
// and the model's reply text -> content plus tool calls.
//
// Built-in renderers reproduce the official Hugging Face templates of four families byte for byte
// (see each family below) instead of evaluating Jinja, so a model's template is recognized by its
// distinctive markers (detect_template_family) and can be overridden by name.
//
// Prefix stability: render(messages[:k]).text is a prefix of render(messages).text whenever
// messages[:k] ends at a turn boundary (after a user or assistant message, or after the last of a
// run of tool messages), and render(messages[:k], add_generation_prompt=true).text is a prefix
// of it when messages[k] is an assistant message. So every new turn of a conversation is a
// prefix-cache hit. Where an official template would rewrite earlier turns (Mistral moves the
// system prompt and the tool list to the last user message) we keep them at the first one and
// say so.
//
// Prompt injection: render marks which bytes of the prompt are the template's own markup
// (RenderedPrompt::markup); everything else — message content of every role, tool names,
// descriptions, schemas, call ids and arguments — is content. tokenize_prompt turns special-token
// text ("<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "[INST]", "</s>", ... whatever the
// vocabulary marks special) into special ids only inside markup, so text a user, a tool or a file
// supplies always reaches the model as plain text and can neither close a turn nor open one. A
// prompt whose content holds no special-token text tokenizes exactly as encode(text, true) would.
// Non-special added tokens (Qwen's <tool_call>, <think>) are recognised in content as Hugging Face
// does; they open no turn. Always tokenize a RenderedPrompt with tokenize_prompt, never its text
// with encode.
//
// Immutable after construction; render/parse may be called from any thread.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"

namespace exl {

enum class TemplateFamily : uint8_t {
  llama3,   // Llama 3.1/3.2/3.3 Instruct: header ids, "Environment: ipython", JSON tool calls
  chatml,   // ChatML / Qwen2.5: <|im_start|>, Hermes <tool_call> tags, <tool_response>
  mistral,  // Mistral v0.3: [INST], [AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS]
  llama2,   // Llama 2 chat: [INST] <<SYS>>; the generic tool format
};
std::string to_string(TemplateFamily f);

// How a template writes tool calls; sessions/tool_call_grammar.h gives each syntax exactly.
//  - llama3_json: {"name": .., "parameters": {..}} as the whole reply (Llama 3.1+)
//  - hermes:      <tool_call>\n{"name": .., "arguments": {..}}\n</tool_call> (ChatML / Qwen)
//  - mistral:     [TOOL_CALLS] [{"name": .., "arguments": {..}}, ..]
//  - generic:     for templates without a native format (Llama 2, Llama 3.0), chosen by the template
//                 itself. Tools are described in the system prompt (generic_tools_prompt: a short
//                 instruction, then each tool's function object as JSON, one per line; a system turn
//                 is added when the conversation has none); a call is
//                 <tool_call>{"name": .., "arguments": {..}}</tool_call> in plain text (no special
//                 tokens), several separated by "\n"; an assistant turn with calls renders as its
//                 content, "\n", then its calls; a run of tool messages becomes one user turn of
//                 <tool_response>\n..\n</tool_response> blocks separated by "\n".
enum class ToolFormat : uint8_t { llama3_json, hermes, mistral, generic };
std::string to_string(ToolFormat f);
// The system-prompt text of the generic format for an array of OpenAI tool objects.
std::string generic_tools_prompt(const nlohmann::ordered_json& tools);
// "llama3" (3.1+), "llama3.0", "chatml" (also "qwen2.5": ChatML with Qwen's default system
// prompt), "mistral", "llama2"; throws exl::Error naming the bad value.
struct TemplateChoice;
TemplateChoice parse_template_name(std::string_view name);

// One call in an assistant message. arguments is JSON text (OpenAI sends a string).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

// role: system, developer (rendered as system), user, assistant, tool (ipython for Llama 3).
struct ChatMessage {
  std::string role;
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only
};

// A reply split into its parts. tool_calls ids are empty unless the text carried one (Mistral).
struct ParsedReply {
  std::string content;
  std::vector<ToolCall> tool_calls;
};

struct TemplateChoice {
  TemplateFamily family = TemplateFamily::chatml;
  std::string default_system;  // ChatML: system prompt used when the conversation has none
  bool llama3_0 = false;       // Llama 3: the 3.0 template (no dated system turn, generic tool format)
};

// A rendered conversation: the prompt text and the byte ranges of it the template itself wrote
// (sorted, not overlapping), where special-token text is meant as special tokens.
struct RenderedPrompt {
  std::string text;
  std::vector<TextRange> markup;
};

// The prompt tokens of `prompt`: special tokens parsed only inside its markup
// (Tokenizer::encode_marked), bos added as the tokenizer says but never twice (templates write
// bos themselves).
std::vector<int32_t> tokenize_prompt(const Tokenizer& tokenizer, const RenderedPrompt& prompt);
// The prompt tokens of `prompt` continuing `prefix_ids`, the tokens already held for its first
// `prefix_bytes` bytes (a previous turn, for prefix caching): prefix_ids followed by the rest of
// the text tokenized as tokenize_prompt does (special tokens only inside markup), without a bos.
// Requires prefix_bytes <= prompt.text.size().
std::vector<int32_t> tokenize_prompt_after(const Tokenizer& tokenizer, std::span<const int32_t> prefix_ids,
                                           size_t prefix_bytes, const RenderedPrompt& prompt);

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual TemplateFamily family() const = 0;
  virtual ToolFormat tool_format() const = 0;

  // The prompt for `messages` with its markup marked (see the file comment). tools: an array of OpenAI tool objects
  // ({"type":"function","function":{name, description, parameters}}), rendered in the given
  // order; empty or null means none. Throws exl::Error ("sessions: chat template: <name>: ...")
  // for a conversation the template cannot express (an unknown role, roles out of order).
  virtual RenderedPrompt render(std::span<const ChatMessage> messages, const nlohmann::ordered_json& tools,
                                bool add_generation_prompt) const = 0;

  // Splits generated text (without the end-of-turn marker) into content and tool calls.
  // With tools_enabled false, or when the text does not hold well-formed calls, everything is
  // content. Never throws on model output.
  virtual ParsedReply parse_reply(std::string_view text, bool tools_enabled) const = 0;

  // Text that ends an assistant turn (<|eot_id|>, <|im_end|>, </s>), for generators whose
  // vocabulary lacks them as single tokens.
  virtual std::vector<std::string> stop_strings() const = 0;

  // A fresh tool-call id in the family's form from a random number (Mistral: 9 alphanumerics;
  // others: "call_" + 24 alphanumerics).
  virtual std::string make_tool_call_id(uint64_t random) const;
};

// Special-token texts a template writes (bos_token / eos_token in the Jinja templates).
struct TemplateTokens {
  std::string bos;
  std::string eos;
};

std::unique_ptr<ChatTemplate> make_chat_template(const TemplateChoice& choice, TemplateTokens tokens);

// Recognizes a Jinja chat_template by its markers; nullopt when none matches.
std::optional<TemplateChoice> detect_template_family(std::string_view chat_template);

// The template text of a model directory's tokenizer_config.json ("chat_template" as a string or a
// list of {name, template}, preferring "tool_use" then "default"); nullopt when there is none.
// Throws exl::Error naming the file when it exists but is malformed.
std::optional<std::string> read_chat_template(const std::filesystem::path& model_dir);

// The template for a model directory: `override_name` when given, else the detected family of its
// chat_template, else ChatML (models without a template, such as base or toy models).
// Throws exl::Error when a template exists but matches no family and no override is given.
TemplateChoice choose_template(const std::filesystem::path& model_dir, std::string_view override_name = {});

}  // namespace exl
