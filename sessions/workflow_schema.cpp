#include "sessions/workflow_schema.h"

#include <re2/re2.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "kernels/error.h"

namespace exl {

std::string_view workflow_schema_text() {
  static constexpr std::string_view text = R"SCHEMA(
{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "https://github.com/exlagent/exlagent/docs/workflow.schema.json",
  "title": "exlagent workflow",
  "description": "A scripted multi-turn workflow run by `exlagent run`. See docs/workflow-format.md.",
  "type": "object",
  "required": ["steps"],
  "additionalProperties": false,
  "properties": {
    "$schema": {"type": "string"},
    "name": {"type": "string", "description": "A label for the trace."},
    "description": {"type": "string"},
    "model": {"type": "string", "minLength": 1, "description": "Model directory, relative to the workflow file; --model overrides it."},
    "inputs": {
      "type": "object",
      "description": "Named input values; {\"file\": PATH} reads a text file relative to the workflow file. --input KEY=VALUE overrides.",
      "additionalProperties": {"$ref": "#/$defs/input"}
    },
    "mcp": {
      "type": "object",
      "description": "MCP servers whose tools steps may name as NAME__tool: NAME (1-32 letters, digits or '-') -> \"COMMAND ARGS...\" (started over stdio; split as --mcp splits it) or \"http://HOST:PORT/PATH\" (Streamable HTTP). exlagent run --mcp adds more; a NAME given twice is an error.",
      "additionalProperties": {"type": "string", "minLength": 1}
    },
    "defaults": {"$ref": "#/$defs/settings"},
    "steps": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/step"}}
  },
  "$defs": {
    "input": {
      "description": "Any JSON value; an object whose only key is \"file\" (a string) stands for that file's text."
    },
    "settings": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "system": {"type": "string", "description": "System prompt (templated)."},
        "max_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0},
        "seed": {"type": "integer", "minimum": 0}
      }
    },
    "path": {
      "type": "string",
      "pattern": "^(inputs|steps|item|index)(\\.[A-Za-z0-9_-]+)*$",
      "description": "A dotted path into the context: inputs.x, steps.NAME.field, item.field, index; numeric segments index arrays."
    },
    "condition": {
      "anyOf": [
        {"$ref": "#/$defs/path"},
        {
          "type": "object",
          "required": ["path"],
          "additionalProperties": false,
          "properties": {
            "path": {"$ref": "#/$defs/path"},
            "equals": {},
            "not_equals": {}
          }
        }
      ]
    },
    "step": {
      "type": "object",
      "required": ["name", "prompt"],
      "additionalProperties": false,
      "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_-]*$"},
        "prompt": {"type": "string", "minLength": 1, "description": "The user message (templated)."},
        "system": {"type": "string", "description": "System prompt (templated); overrides defaults.system."},
        "schema": {"type": ["object", "boolean"], "description": "JSON Schema of the reply; the step's output is then the parsed JSON."},
        "continue": {"type": "string", "description": "Name of an earlier step whose conversation this step continues."},
        "for_each": {"$ref": "#/$defs/path", "description": "Run once per element of this array (as item, at index), all at once."},
        "if": {"$ref": "#/$defs/condition"},
        "tools": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, "minItems": 1, "description": "Built-in tools the model may call (calculator, regex_extract, json_query, current_time; read_file with run --read-root): the step runs the agent loop."},
        "max_turns": {"type": "integer", "minimum": 1, "description": "Model generations per conversation in a step with tools (default 10)."},
        "max_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0},
        "seed": {"type": "integer", "minimum": 0}
      }
    }
  }
}
)SCHEMA";
  return text.substr(1);  // the raw string starts with a newline
}

namespace {

using ojson = nlohmann::ordered_json;

const std::set<std::string, std::less<>> kKnown = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "minLength", "pattern",
    "minimum", "enum", "anyOf", "$ref", "$schema", "$id", "title", "description", "$defs", "examples"};

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

bool has_type(const ojson& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  fail("sessions: schema: unknown type '", t, "'");
}

class Validator {
 public:
  Validator(const ojson& root, size_t max) : root_(root), max_(max) {}
  std::vector<std::string> errors;

  void check(const ojson& s, const ojson& v, const std::string& ptr) {
    if (errors.size() >= max_ || s.is_boolean()) {
      if (s.is_boolean() && !s.get<bool>()) add(ptr, "no value is allowed here");
      return;
    }
    EXL_CHECK(s.is_object(), "sessions: schema: ", ptr, ": a schema must be an object or a boolean");
    for (const auto& [k, _] : s.items())
      EXL_CHECK(kKnown.count(k), "sessions: schema: unsupported keyword '", k, "'");
    if (auto r = s.find("$ref"); r != s.end()) check(resolve(r->get<std::string>()), v, ptr);
    if (auto t = s.find("type"); t != s.end()) {
      bool ok = false;
      std::string names;
      for (const auto& n : t->is_array() ? *t : ojson::array({*t})) {
        ok = ok || has_type(v, n.get<std::string>());
        names += (names.empty() ? "" : " or ") + n.get<std::string>();
      }
      if (!ok) return add(ptr, cat("must be ", names, ", not ", type_name(v)));
    }
    if (auto e = s.find("enum"); e != s.end() && std::find(e->begin(), e->end(), v) == e->end())
      add(ptr, cat("must be one of ", e->dump()));
    if (auto a = s.find("anyOf"); a != s.end()) any_of(*a, v, ptr);
    if (v.is_string()) check_string(s, v.get<std::string>(), ptr);
    if (v.is_number())
      if (auto m = s.find("minimum"); m != s.end() && v.get<double>() < m->get<double>())
        add(ptr, cat("must be at least ", m->dump()));
    if (v.is_array()) check_array(s, v, ptr);
    if (v.is_object()) check_object(s, v, ptr);
  }

 private:
  static std::string type_name(const ojson& v) {
    if (v.is_number_integer()) return "an integer";
    if (v.is_number()) return "a number";
    const std::string n = v.type_name();
    return (n == "object" || n == "array") ? "an " + n : "a " + n;
  }
  void add(const std::string& ptr, std::string msg) {
    if (errors.size() < max_) errors.push_back(cat(ptr.empty() ? "(root)" : ptr, ": ", msg));
  }
  const ojson& resolve(const std::string& ref) {
    EXL_CHECK(ref.starts_with("#/$defs/"), "sessions: schema: unsupported $ref '", ref, "'");
    const std::string name = ref.substr(8);
    const auto defs = root_.find("$defs");
    EXL_CHECK(defs != root_.end() && defs->contains(name), "sessions: schema: $ref '", ref, "' names no definition");
    return (*defs)[name];
  }
  void any_of(const ojson& branches, const ojson& v, const std::string& ptr) {
    std::vector<std::string> first;
    for (const auto& b : branches) {
      Validator sub(root_, max_);
      sub.check(b, v, ptr);
      if (sub.errors.empty()) return;
      if (first.empty()) first = std::move(sub.errors);
    }
    add(ptr, cat("matches none of the allowed forms (first form: ", first.empty() ? "" : first.front(), ")"));
  }
  void check_string(const ojson& s, const std::string& v, const std::string& ptr) {
    if (auto m = s.find("minLength"); m != s.end() && v.size() < m->get<size_t>())
      add(ptr, cat("must have at least ", m->get<size_t>(), " characters"));
    if (auto p = s.find("pattern"); p != s.end()) {
      const std::string pat = p->get<std::string>();
      auto& re = patterns_[pat];
      if (!re) re = std::make_unique<RE2>(pat);
      EXL_CHECK(re->ok(), "sessions: schema: bad pattern '", pat, "'");
      if (!RE2::PartialMatch(v, *re)) add(ptr, cat("'", v, "' does not match ", pat));
    }
  }
  void check_array(const ojson& s, const ojson& v, const std::string& ptr) {
    if (auto m = s.find("minItems"); m != s.end() && v.size() < m->get<size_t>())
      add(ptr, cat("must have at least ", m->get<size_t>(), " items"));
    if (auto it = s.find("items"); it != s.end())
      for (size_t i = 0; i < v.size(); ++i) check(*it, v[i], cat(ptr, "/", i));
  }
  void check_object(const ojson& s, const ojson& v, const std::string& ptr) {
    if (auto r = s.find("required"); r != s.end())
      for (const auto& k : *r)
        if (!v.contains(k.get<std::string>())) add(ptr, cat("missing required property '", k.get<std::string>(), "'"));
    const auto props = s.find("properties");
    const auto extra = s.find("additionalProperties");
    for (const auto& [k, val] : v.items()) {
      const std::string sub = ptr + "/" + escape_pointer(k);
      if (props != s.end() && props->contains(k)) check((*props)[k], val, sub);
      else if (extra != s.end() && extra->is_boolean() && !extra->get<bool>())
        add(ptr, cat("unknown property '", k, "'"));
      else if (extra != s.end() && extra->is_object()) check(*extra, val, sub);
    }
  }

  const ojson& root_;
  size_t max_;
  std::map<std::string, std::unique_ptr<RE2>> patterns_;
};

}  // namespace

std::vector<std::string> schema_violations(const ojson& schema, const ojson& doc, size_t max_errors) {
  Validator v(schema, max_errors);
  v.check(schema, doc, "");
  return std::move(v.errors);
}

}  // namespace exl
