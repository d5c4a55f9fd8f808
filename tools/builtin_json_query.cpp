// json_query: JSON Pointer (RFC 6901, through nlohmann::json_pointer) for "" and paths starting
// with "/"; otherwise a dotted path: optional "$", then segments — `.key` (or a bare first key),
// `[N]` (array index), `["key"]` / `['key']` (any key, with \" \' \\ escapes).
#include "kernels/error.h"
#include "tools/builtin_tools.h"
#include "tools/function_tool.h"

namespace exl {
namespace {

using nlohmann::json;

struct Step {
  bool index = false;
  size_t n = 0;
  std::string key;
};

[[noreturn]] void bad_path(std::string_view path, size_t at, const std::string& what) {
  fail("json_query: path '", path, "' at position ", at + 1, ": ", what);
}

std::string quoted_key(std::string_view path, size_t& i) {
  const char q = path[i++];
  std::string key;
  while (i < path.size() && path[i] != q) {
    if (path[i] == '\\' && i + 1 < path.size()) ++i;
    key += path[i++];
  }
  if (i >= path.size()) bad_path(path, i, "unterminated quoted key");
  ++i;
  return key;
}

std::vector<Step> parse_dotted(std::string_view path) {
  std::vector<Step> steps;
  size_t i = 0;
  if (!path.empty() && path[0] == '$') ++i;
  bool need_key = i == 0;  // a bare first key is allowed without a leading '.'
  while (i < path.size()) {
    if (path[i] == '[') {
      ++i;
      if (i < path.size() && (path[i] == '"' || path[i] == '\'')) {
        steps.push_back({false, 0, quoted_key(path, i)});
      } else {
        const size_t start = i;
        while (i < path.size() && path[i] >= '0' && path[i] <= '9') ++i;
        if (i == start || i - start > 18) bad_path(path, start, "expected an array index or a quoted key");
        steps.push_back({true, size_t(std::stoull(std::string(path.substr(start, i - start)))), {}});
      }
      if (i >= path.size() || path[i] != ']') bad_path(path, i, "expected ']'");
      ++i;
    } else {
      if (!need_key) {
        if (path[i] != '.') bad_path(path, i, "expected '.' or '['");
        ++i;
      }
      const size_t start = i;
      while (i < path.size() && path[i] != '.' && path[i] != '[') ++i;
      if (i == start) bad_path(path, start, "empty key");
      steps.push_back({false, 0, std::string(path.substr(start, i - start))});
    }
    need_key = false;
  }
  return steps;
}

std::string describe(const std::vector<Step>& steps, size_t n) {
  std::string out = "$";
  for (size_t k = 0; k < n; ++k) out += steps[k].index ? cat("[", steps[k].n, "]") : "." + steps[k].key;
  return out;
}

const json& walk(const json& doc, std::string_view path) {
  const std::vector<Step> steps = parse_dotted(path);
  const json* cur = &doc;
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& s = steps[k];
    const std::string at = describe(steps, k);
    if (s.index) {
      if (!cur->is_array()) fail("json_query: path '", path, "': ", at, " is ", cur->type_name(), ", not an array");
      if (s.n >= cur->size())
        fail("json_query: path '", path, "': index ", s.n, " out of range: ", at, " has ", cur->size(), " items");
      cur = &(*cur)[s.n];
    } else {
      if (!cur->is_object()) fail("json_query: path '", path, "': ", at, " is ", cur->type_name(), ", not an object");
      auto it = cur->find(s.key);
      if (it == cur->end()) fail("json_query: path '", path, "': ", at, " has no key '", s.key, "'");
      cur = &*it;
    }
  }
  return *cur;
}

ToolResult query(const json& args) {
  const json& input = args.at("json");
  const std::string path = args.at("path").get<std::string>();
  json doc;
  if (input.is_string()) {
    try {
      doc = json::parse(input.get<std::string>());
    } catch (const json::parse_error& e) {
      fail("json_query: 'json' is a string but not a JSON text: ", e.what());
    }
  } else {
    doc = input;
  }
  const json* value;
  if (path.empty() || path[0] == '/') {
    json::json_pointer ptr;
    try {
      ptr = json::json_pointer(path);
      value = &doc.at(ptr);
    } catch (const json::exception& e) {
      fail("json_query: JSON Pointer '", path, "': ", e.what());
    }
  } else {
    value = &walk(doc, path);
  }
  return {value->dump(-1, ' ', false, json::error_handler_t::replace)};
}

}  // namespace

std::shared_ptr<Tool> make_json_query_tool(const BuiltinToolOptions&) {
  ToolSpec spec{"json_query",
                "Return the value at a path in a JSON document. Paths: JSON Pointer (\"/a/0/b\", \"\" for the "
                "whole document) or dotted (\"a.b[0].c\", \"$.items[2]\", \"['key.with.dots']\").",
                {{"type", "object"},
                 {"properties",
                  {{"json", {{"description", "the document: a JSON text (string) or a JSON value"}}},
                   {"path", {{"type", "string"}}}}},
                 {"required", {"json", "path"}},
                 {"additionalProperties", false}}};
  return std::make_shared<FunctionTool>(std::move(spec),
                                        [](const nlohmann::json& args, const CancelToken&) { return query(args); });
}

}  // namespace exl
