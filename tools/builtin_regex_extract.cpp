// regex_extract: all non-overlapping RE2 matches of `pattern` in `text`, left to right. After an
// empty match the search resumes one UTF-8 code point later. Output (JSON text):
//   {"count": n, "truncated": bool, "matches": [{"match": s, "start": byte, "end": byte,
//    "groups": [s | null, ...], "named": {"name": s | null}}]}
// `named` is present only when the pattern has named groups. Flags: i (case-insensitive),
// m (^ and $ match at line breaks), s (. matches \n).
#include <map>

#include <re2/re2.h>

#include "kernels/error.h"
#include "tools/builtin_tools.h"
#include "tools/function_tool.h"

namespace exl {
namespace {

constexpr int kDefaultMaxMatches = 1000;

size_t next_code_point(std::string_view text, size_t pos) {
  ++pos;
  while (pos < text.size() && (uint8_t(text[pos]) & 0xC0) == 0x80) ++pos;
  return pos;
}

nlohmann::json text_or_null(const re2::StringPiece& piece) {
  if (piece.data() == nullptr) return nullptr;
  return std::string(piece.data(), piece.size());
}

ToolResult extract(const nlohmann::json& args) {
  const std::string text = args.at("text").get<std::string>();
  const std::string pattern = args.at("pattern").get<std::string>();
  const std::string flags = args.value("flags", std::string());
  const int max_matches = args.value("max_matches", kDefaultMaxMatches);
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(64 << 20);
  std::string prefix;
  for (char f : flags) {
    if (f == 'i') options.set_case_sensitive(false);
    else if (f == 's') options.set_dot_nl(true);
    else if (f == 'm') prefix = "(?m)";
    else fail("regex_extract: unknown flag '", f, "' (use i, m, s)");
  }
  RE2 re(prefix + pattern, options);
  if (!re.ok()) fail("regex_extract: invalid pattern: ", re.error());

  const int groups = re.NumberOfCapturingGroups();
  std::vector<re2::StringPiece> sub(size_t(groups) + 1);
  std::map<int, std::string> names(re.CapturingGroupNames().begin(), re.CapturingGroupNames().end());
  nlohmann::json matches = nlohmann::json::array();
  bool truncated = false;
  const re2::StringPiece input(text);
  size_t pos = 0;
  while (pos <= text.size()) {
    if (!re.Match(input, pos, text.size(), RE2::UNANCHORED, sub.data(), int(sub.size()))) break;
    if (int(matches.size()) == max_matches) {
      truncated = true;
      break;
    }
    const size_t start = size_t(sub[0].data() - text.data()), end = start + sub[0].size();
    nlohmann::json m = {{"match", text_or_null(sub[0])}, {"start", start}, {"end", end}};
    nlohmann::json g = nlohmann::json::array();
    for (int k = 1; k <= groups; ++k) g.push_back(text_or_null(sub[size_t(k)]));
    m["groups"] = std::move(g);
    if (!names.empty()) {
      nlohmann::json named = nlohmann::json::object();
      for (const auto& [k, name] : names) named[name] = text_or_null(sub[size_t(k)]);
      m["named"] = std::move(named);
    }
    matches.push_back(std::move(m));
    pos = end > start ? end : next_code_point(text, end);
  }
  nlohmann::json out = {{"count", matches.size()}, {"truncated", truncated}, {"matches", std::move(matches)}};
  return {out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

}  // namespace

std::shared_ptr<Tool> make_regex_extract_tool(const BuiltinToolOptions&) {
  ToolSpec spec{"regex_extract",
                "Find every match of an RE2 regular expression in a text; returns each match with its byte "
                "offsets and capture groups as JSON.",
                {{"type", "object"},
                 {"properties",
                  {{"text", {{"type", "string"}}},
                   {"pattern", {{"type", "string"}, {"minLength", 1}, {"description", "RE2 syntax"}}},
                   {"flags",
                    {{"type", "string"},
                     {"pattern", "^[ims]*$"},
                     {"description", "i: ignore case, m: ^/$ at line breaks, s: . matches newline"}}},
                   {"max_matches", {{"type", "integer"}, {"minimum", 1}, {"maximum", 10000}}}}},
                 {"required", {"text", "pattern"}},
                 {"additionalProperties", false}}};
  return std::make_shared<FunctionTool>(std::move(spec),
                                        [](const nlohmann::json& args, const CancelToken&) { return extract(args); });
}

}  // namespace exl
