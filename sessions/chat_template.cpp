#include "sessions/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "kernels/error.h"
#include "sessions/chat_template_families.h"

namespace exl {

namespace {

constexpr std::string_view kQwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr std::string_view kAlnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

}  // namespace

std::string chat_detail::alnum_id(uint64_t random, size_t n) {
  std::string s;
  uint64_t x = random;
  for (size_t i = 0; i < n; ++i) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 29;
    x += 0x9e3779b97f4a7c15ULL;
    s += kAlnum[x % kAlnum.size()];
  }
  return s;
}

namespace {

bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

}  // namespace

std::string to_string(TemplateFamily f) {
  switch (f) {
    case TemplateFamily::llama3: return "llama3";
    case TemplateFamily::chatml: return "chatml";
    case TemplateFamily::mistral: return "mistral";
    case TemplateFamily::llama2: return "llama2";
  }
  return "?";
}

TemplateChoice parse_template_name(std::string_view name) {
  if (name == "llama3") return {TemplateFamily::llama3, {}};
  if (name == "llama3.0") return {TemplateFamily::llama3, {}, true};
  if (name == "chatml") return {TemplateFamily::chatml, {}};
  if (name == "qwen2.5" || name == "qwen") return {TemplateFamily::chatml, std::string(kQwenSystem)};
  if (name == "mistral") return {TemplateFamily::mistral, {}};
  if (name == "llama2") return {TemplateFamily::llama2, {}};
  fail("sessions: chat template: unknown template name '", name,
       "' (expected llama3, llama3.0, chatml, qwen2.5, mistral or llama2)");
}

std::vector<int32_t> tokenize_prompt(const Tokenizer& tokenizer, const RenderedPrompt& prompt) {
  std::vector<int32_t> ids = tokenizer.encode_marked(prompt.text, prompt.markup);
  const auto bos = tokenizer.bos_id();
  if (ids.size() >= 2 && bos && ids[0] == *bos && ids[1] == *bos) ids.erase(ids.begin());
  return ids;
}

std::vector<int32_t> tokenize_prompt_after(const Tokenizer& tokenizer, std::span<const int32_t> prefix_ids,
                                           size_t prefix_bytes, const RenderedPrompt& prompt) {
  std::vector<int32_t> out(prefix_ids.begin(), prefix_ids.end());
  if (prefix_bytes >= prompt.text.size()) return out;
  std::vector<TextRange> markup;
  for (const auto& r : prompt.markup)
    if (r.end > prefix_bytes) markup.push_back({std::max(r.begin, prefix_bytes) - prefix_bytes, r.end - prefix_bytes});
  std::vector<int32_t> more = tokenizer.encode_marked(std::string_view(prompt.text).substr(prefix_bytes), markup);
  if (!more.empty() && tokenizer.bos_id() && more.front() == *tokenizer.bos_id()) more.erase(more.begin());
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::string ChatTemplate::make_tool_call_id(uint64_t random) const { return "call_" + chat_detail::alnum_id(random, 24); }

std::unique_ptr<ChatTemplate> make_chat_template(const TemplateChoice& choice, TemplateTokens tokens) {
  switch (choice.family) {
    case TemplateFamily::llama3: return chat_detail::make_llama3(std::move(tokens), choice.llama3_0);
    case TemplateFamily::chatml: return chat_detail::make_chatml(std::move(tokens), choice.default_system);
    case TemplateFamily::mistral: return chat_detail::make_mistral(std::move(tokens));
    case TemplateFamily::llama2: return chat_detail::make_llama2(std::move(tokens));
  }
  fail("sessions: chat template: bad family");
}

std::optional<TemplateChoice> detect_template_family(std::string_view t) {
  if (contains(t, "<|start_header_id|>"))
    return TemplateChoice{TemplateFamily::llama3, {}, !contains(t, "Cutting Knowledge Date") && !contains(t, "ipython")};
  if (contains(t, "<|im_start|>")) {
    TemplateChoice c{TemplateFamily::chatml, {}};
    if (contains(t, kQwenSystem)) c.default_system = std::string(kQwenSystem);
    return c;
  }
  if (contains(t, "[AVAILABLE_TOOLS]") || contains(t, "[TOOL_CALLS]")) return TemplateChoice{TemplateFamily::mistral, {}};
  if (contains(t, "<<SYS>>")) return TemplateChoice{TemplateFamily::llama2, {}};
  if (contains(t, "[INST]")) return TemplateChoice{TemplateFamily::mistral, {}};
  return std::nullopt;
}

std::optional<std::string> read_chat_template(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  EXL_CHECK(in, "sessions: chat template: cannot read '", path.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json cfg = nlohmann::json::parse(ss.str(), nullptr, false);
  EXL_CHECK(!cfg.is_discarded() && cfg.is_object(), "sessions: chat template: '", path.string(),
            "' is not a JSON object");
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  EXL_CHECK(it->is_array(), "sessions: chat template: '", path.string(),
            "': chat_template must be a string or a list of {name, template}");
  std::optional<std::string> fallback;
  for (const char* want : {"tool_use", "default"})
    for (const auto& e : *it)
      if (e.is_object() && e.value("name", "") == want && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
  for (const auto& e : *it)
    if (e.is_object() && e.contains("template") && e["template"].is_string()) return e["template"].get<std::string>();
  return std::nullopt;
}

TemplateChoice choose_template(const std::filesystem::path& model_dir, std::string_view override_name) {
  if (!override_name.empty()) return parse_template_name(override_name);
  auto text = read_chat_template(model_dir);
  if (!text) return TemplateChoice{TemplateFamily::chatml, {}};
  auto c = detect_template_family(*text);
  EXL_CHECK(c.has_value(), "sessions: chat template: '", (model_dir / "tokenizer_config.json").string(),
            "': chat_template matches no built-in family; choose one with --chat-template "
            "(llama3, llama3.0, chatml, qwen2.5, mistral, llama2)");
  return *c;
}

namespace chat_detail {

void PromptWriter::markup(std::string_view s) {
  if (s.empty()) return;
  const size_t at = p_.text.size();
  p_.text += s;
  if (!p_.markup.empty() && p_.markup.back().end == at) p_.markup.back().end = p_.text.size();
  else p_.markup.push_back({at, p_.text.size()});
}

void PromptWriter::text(std::string_view s) { p_.text += s; }

bool has_tools(const nlohmann::ordered_json& tools) { return tools.is_array() && !tools.empty(); }

std::optional<nlohmann::ordered_json> parse_json(std::string_view text) {
  auto j = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

nlohmann::ordered_json arguments_value(const std::string& arguments_text) {
  if (auto j = parse_json(arguments_text)) return *j;
  return nlohmann::ordered_json(arguments_text);
}

std::optional<ToolCall> tool_call_from_json(const nlohmann::ordered_json& obj) {
  if (!obj.is_object()) return std::nullopt;
  auto name = obj.find("name");
  if (name == obj.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  auto args = obj.find("arguments");
  if (args == obj.end()) args = obj.find("parameters");
  ToolCall c;
  c.name = name->get<std::string>();
  if (args == obj.end()) c.arguments = "{}";
  else if (args->is_object()) c.arguments = args->dump();
  else if (args->is_string() && parse_json(args->get<std::string>()).value_or(nullptr).is_object())
    c.arguments = args->get<std::string>();
  else return std::nullopt;
  if (auto id = obj.find("id"); id != obj.end() && id->is_string()) c.id = id->get<std::string>();
  return c;
}

std::optional<std::string> take_system_message(std::span<const ChatMessage>& messages) {
  if (messages.empty() || messages[0].role != "system") return std::nullopt;
  std::string system = messages[0].content;
  messages = messages.subspan(1);
  return system;
}

TemplateTokens with_sentencepiece_markers(TemplateTokens tokens) {
  if (tokens.bos.empty()) tokens.bos = "<s>";
  if (tokens.eos.empty()) tokens.eos = "</s>";
  return tokens;
}

std::string_view trim(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

void template_error(TemplateFamily f, const std::string& what) { template_error(to_string(f), what); }

void template_error(std::string_view name, const std::string& what) {
  fail("sessions: chat template: ", name, ": ", what);
}

}  // namespace chat_detail

}  // namespace exl
