#include "tools/argument_validator.h"

#include <algorithm>
#include <cmath>

#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "kernels/error.h"

namespace exl {
namespace {

using nlohmann::json;

// A value or property name in the serialized arguments: bytes [begin, end).
struct Span {
  size_t begin, end;
  std::string pointer;  // the value's pointer, or the owning object's for a property name
  bool is_key = false;
  std::string key;
};

std::string escape_token(const std::string& k) {
  std::string out;
  for (char c : k) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

constexpr int kMaxArgumentDepth = 256;

struct TooDeep {};

void serialize(const json& v, const std::string& ptr, std::string& out, std::vector<Span>& spans, int depth = 0) {
  if (depth > kMaxArgumentDepth) throw TooDeep{};
  const size_t begin = out.size();
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) out += ',';
      first = false;
      const size_t kb = out.size();
      out += json(k).dump();
      spans.push_back({kb, out.size(), ptr, true, k});
      out += ':';
      serialize(x, ptr + "/" + escape_token(k), out, spans, depth + 1);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      serialize(v[i], ptr + "/" + std::to_string(i), out, spans, depth + 1);
    }
    out += ']';
  } else {
    out += v.dump();
  }
  spans.push_back({begin, out.size(), ptr, false, {}});
}

// The first byte offset the matcher rejects, or text.size() when all bytes are accepted.
size_t first_rejected(Matcher& m, std::string_view text) {
  constexpr size_t kChunk = 64;
  for (size_t pos = 0; pos < text.size(); pos += kChunk) {
    std::string_view chunk = text.substr(pos, kChunk);
    if (m.accept_bytes(chunk)) continue;
    for (size_t i = 0; i < chunk.size(); ++i)
      if (!m.accept_bytes(chunk.substr(i, 1))) return pos + i;
  }
  return text.size();
}

// The schema at `pointer` when it can be read by following properties/items alone.
const json* subschema(const json& root, const std::string& pointer) {
  const json* s = &root;
  auto plain = [](const json* x) {
    return x->is_object() && !x->contains("$ref") && !x->contains("anyOf") && !x->contains("oneOf") &&
           !x->contains("allOf");
  };
  if (!plain(s)) return nullptr;
  if (pointer.empty()) return s;
  std::vector<std::string> tokens;
  for (json::json_pointer p(pointer); !p.empty(); p.pop_back()) tokens.insert(tokens.begin(), p.back());
  for (const std::string& token : tokens) {
    const json* next = nullptr;
    if (s->contains("properties") && (*s)["properties"].is_object() && (*s)["properties"].contains(token))
      next = &(*s)["properties"][token];
    else if (s->contains("items") && (*s)["items"].is_object())
      next = &(*s)["items"];
    else if (s->contains("additionalProperties") && (*s)["additionalProperties"].is_object())
      next = &(*s)["additionalProperties"];
    if (!next || !plain(next)) return nullptr;
    s = next;
  }
  return s;
}

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  return v.type_name();
}

bool type_matches(const json& v, const std::string& t) {
  // 1.0 is an integer (JSON Schema draft-06 on), as the argument grammar allows
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  return v.type_name() == t;
}

size_t code_points(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

std::string short_dump(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

std::string object_hint(const json& s, const json& v) {
  if (s.contains("required") && s["required"].is_array())
    for (const json& r : s["required"])
      if (r.is_string() && !v.contains(r.get<std::string>()))
        return "missing required property '" + r.get<std::string>() + "'";
  if (s.value("additionalProperties", json(true)) == json(false) && !s.contains("patternProperties"))
    for (const auto& [k, x] : v.items())
      if (!s.contains("properties") || !s["properties"].contains(k)) return "unexpected property '" + k + "'";
  return {};
}

std::string value_hint(const json& s, const json& v) {
  if (s.contains("type")) {
    json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool ok = std::any_of(types.begin(), types.end(),
                          [&](const json& t) { return t.is_string() && type_matches(v, t.get<std::string>()); });
    if (!ok) {
      std::string want;
      for (const json& t : types) want += (want.empty() ? "" : " or ") + t.get<std::string>();
      return "expected " + want + ", got " + type_name(v);
    }
  }
  if (s.contains("const") && s["const"] != v) return "must be " + short_dump(s["const"]);
  if (s.contains("enum") && s["enum"].is_array() &&
      std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
    return "must be one of " + short_dump(s["enum"]);
  if (v.is_object()) return object_hint(s, v);
  if (v.is_string()) {
    const size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && s["minLength"].is_number() && double(n) < s["minLength"].get<double>())
      return "shorter than minLength " + s["minLength"].dump();
    if (s.contains("maxLength") && s["maxLength"].is_number() && double(n) > s["maxLength"].get<double>())
      return "longer than maxLength " + s["maxLength"].dump();
    if (s.contains("pattern")) return "does not match pattern " + short_dump(s["pattern"]);
    if (s.contains("format")) return "is not a valid " + short_dump(s["format"]);
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && s["minimum"].is_number() && x < s["minimum"].get<double>())
      return "below minimum " + s["minimum"].dump();
    if (s.contains("maximum") && s["maximum"].is_number() && x > s["maximum"].get<double>())
      return "above maximum " + s["maximum"].dump();
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && x <= s["exclusiveMinimum"].get<double>())
      return "not above exclusiveMinimum " + s["exclusiveMinimum"].dump();
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && x >= s["exclusiveMaximum"].get<double>())
      return "not below exclusiveMaximum " + s["exclusiveMaximum"].dump();
  }
  if (v.is_array()) {
    if (s.contains("minItems") && s["minItems"].is_number() && double(v.size()) < s["minItems"].get<double>())
      return "fewer than minItems " + s["minItems"].dump() + " items";
    if (s.contains("maxItems") && s["maxItems"].is_number() && double(v.size()) > s["maxItems"].get<double>())
      return "more than maxItems " + s["maxItems"].dump() + " items";
  }
  return {};
}

std::string where(const std::string& pointer) { return pointer.empty() ? "top level" : "'" + pointer + "'"; }

std::string describe(const json& schema, const json& args, const Span& at) {
  const json* s = subschema(schema, at.pointer);
  if (at.is_key) {
    std::string hint = s ? object_hint(*s, args.at(json::json_pointer(at.pointer))) : "";
    if (hint.empty()) hint = "property '" + at.key + "' is not allowed";
    return "at " + where(at.pointer) + ": " + hint;
  }
  const json& v = args.at(json::json_pointer(at.pointer));
  std::string hint = s ? value_hint(*s, v) : "";
  if (hint.empty()) hint = "value " + short_dump(v) + " does not match the schema";
  return "at " + where(at.pointer) + ": " + hint;
}

}  // namespace

ArgumentValidator::ArgumentValidator(const nlohmann::json& schema)
    : schema_(schema.is_null() ? json{{"type", "object"}} : schema) {
  JsonSchemaOptions opts;
  opts.whitespace = JsonSchemaOptions::Whitespace::flexible;
  opts.property_order = JsonSchemaOptions::PropertyOrder::any;
  opts.integer_zero_fraction = true;
  try {
    grammar_ = std::make_shared<CompiledGrammar>(compile_json_schema(nlohmann::ordered_json::parse(schema_.dump()), opts),
                                                 nullptr);
  } catch (const GrammarError& e) {
    fail("tools: arguments: input schema: ", e.what());
  }
}

ArgumentValidator::~ArgumentValidator() = default;

std::optional<std::string> ArgumentValidator::check(const nlohmann::json& arguments) const {
  std::string text;
  std::vector<Span> spans;
  try {
    serialize(arguments, "", text, spans);
  } catch (const json::exception&) {
    return "arguments contain a string that is not valid UTF-8";
  } catch (const TooDeep&) {
    return cat("arguments are nested deeper than ", kMaxArgumentDepth, " levels");
  }
  if (text.size() > kMaxArgumentBytes)
    return cat("arguments are ", text.size(), " bytes, more than the limit of ", kMaxArgumentBytes);
  Matcher m(grammar_);
  const size_t bad = first_rejected(m, text);
  if (bad == text.size()) {
    if (m.is_accepting()) return std::nullopt;
    return "arguments do not match the input schema: " + describe(schema_, arguments, spans.back());
  }
  const Span* best = &spans.back();
  for (const Span& s : spans)
    if (s.begin <= bad && bad < s.end && s.end - s.begin < best->end - best->begin) best = &s;
  return "arguments do not match the input schema: " + describe(schema_, arguments, *best);
}

}  // namespace exl
