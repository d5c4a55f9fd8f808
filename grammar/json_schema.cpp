#include "grammar/json_schema.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <set>

#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema_impl.h"
#include "grammar/regex.h"

namespace exl {
namespace json_schema_detail {
namespace {

const std::set<std::string> kAnnotations = {
    "$schema", "$id", "id", "$comment", "title", "description", "default", "examples", "example",
    "readOnly", "writeOnly", "deprecated", "$defs", "definitions", "$anchor", "contentMediaType",
    "contentEncoding", "contentSchema", "$vocabulary", kResources};
const std::set<std::string> kSupported = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength",
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf",
    "oneOf", "allOf", "$ref", "nullable", "minProperties", "maxProperties", "uniqueItems", "multipleOf",
    "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains", "propertyNames", "not",
    "dependentRequired", "dependencies", "dependentSchemas", "if", "then", "else", kNotEnum, kNotString, kFractional, kHasKeyOutside, kNegated, kNegatedItems, kEvaluates};
const std::vector<std::string> kTypes = {"null", "boolean", "object", "array", "number", "integer", "string"};
constexpr int kMaxDepth = 64;
constexpr size_t kMaxAlternatives = 256;

std::string show(const std::string& ptr) { return "#" + ptr; }

// Validation keywords of some JSON Schema draft that this compiler does not implement.
const std::set<std::string> kValidationKeywords = {
    "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
    "$recursiveAnchor", "disallow", "extends", "divisibleBy"};

Json type_array(const Json& t, const std::string& ptr) {
  Json out = Json::array();
  auto add = [&](const Json& v) {
    if (!v.is_string() || std::find(kTypes.begin(), kTypes.end(), v.get<std::string>()) == kTypes.end())
      fail(pointer_append(ptr, "type"), "unknown type " + v.dump());
    out.push_back(v);
  };
  if (t.is_array()) {
    for (const Json& v : t) add(v);
  } else {
    add(t);
  }
  return out;
}

bool has_type(const Json& types, const std::string& t) {
  for (const Json& v : types)
    if (v == t) return true;
  return false;
}

}  // namespace

void fail(const std::string& ptr, const std::string& what) {
  grammar_fail("grammar: json_schema: ", show(ptr), ": ", what);
}

std::string pointer_append(const std::string& ptr, const std::string& token) {
  std::string t;
  for (char c : token) {
    if (c == '~') t += "~0";
    else if (c == '/') t += "~1";
    else t += c;
  }
  return ptr + "/" + t;
}

bool SchemaCompiler::ignored(const std::string& kw) const {
  return std::find(opts_.ignore_keywords.begin(), opts_.ignore_keywords.end(), kw) != opts_.ignore_keywords.end();
}

bool SchemaCompiler::old_draft() const {
  if (!root_.is_object() || !root_.contains("$schema") || !root_["$schema"].is_string()) return false;
  const std::string& v = root_["$schema"].get_ref<const std::string&>();
  return v.find("draft-04") != std::string::npos || v.find("draft-03") != std::string::npos;
}

bool SchemaCompiler::is_annotation(const std::string& k) const {
  if (kAnnotations.count(k) || k.rfind("x-", 0) == 0) return true;
  return opts_.ignore_unknown_keywords && !kSupported.count(k) && !kValidationKeywords.count(k);
}

void SchemaCompiler::check_keywords(const Json& s, const std::string& ptr) const {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (is_annotation(k) || kSupported.count(k) || ignored(k)) continue;
    fail(ptr, "unsupported keyword '" + k + "'");
  }
}

const Json& SchemaCompiler::resolve_ref(const std::string& ref, const std::string& ptr, std::string& target_ptr) const {
  std::string where = pointer_append(ptr, "$ref");
  if (ref.empty() || ref[0] != '#') fail(where, "'" + ref + "' does not resolve in this document");
  std::string frag = ref.substr(1);
  std::string decoded;
  for (size_t i = 0; i < frag.size(); ++i) {
    if (frag[i] == '%' && i + 2 < frag.size() && isxdigit(uint8_t(frag[i + 1])) && isxdigit(uint8_t(frag[i + 2]))) {
      decoded += char(std::stoi(frag.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      decoded += frag[i];
    }
  }
  if (!decoded.empty() && decoded[0] != '/') {
    // a plain-name fragment: the one schema of this document with "$anchor": name (or the
    // draft-04..07 "$id"/"id": "#name"), in a document that embeds no other resource
    const Json* found = nullptr;
    int matches = 0;
    bool embedded = false;
    auto walk = [&](auto&& self, const Json& x, const std::string& at) -> void {
      if (x.is_array()) {
        for (size_t i = 0; i < x.size(); ++i) self(self, x[i], pointer_append(at, std::to_string(i)));
        return;
      }
      if (!x.is_object()) return;
      for (const char* id : {"$id", "id"})
        if (x.contains(id) && x[id].is_string()) {
          const std::string& v = x[id].get_ref<const std::string&>();
          if (v == "#" + decoded) found = &x, target_ptr = at, ++matches;
          else if (!at.empty() && (v.empty() || v[0] != '#')) embedded = true;
        }
      if (x.contains("$anchor") && x["$anchor"] == decoded) found = &x, target_ptr = at, ++matches;
      for (auto it = x.begin(); it != x.end(); ++it)
        if (it.key() != "enum" && it.key() != "const" && it.key() != "default" && it.key() != "examples")
          self(self, it.value(), pointer_append(at, it.key()));
    };
    walk(walk, root_, "");
    if (embedded) fail(where, "'" + ref + "': anchors in a document that embeds other resources ($id) are not supported");
    if (matches != 1) fail(where, "'" + ref + "': " + (matches == 0 ? "no" : "more than one") + " schema has this anchor");
    return *found;
  }
  const Json* cur = &root_;
  target_ptr.clear();
  size_t pos = 0;
  while (pos < decoded.size()) {
    size_t next = decoded.find('/', pos + 1);
    std::string tok = decoded.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    std::string key;
    for (size_t i = 0; i < tok.size(); ++i) {
      if (tok[i] == '~' && i + 1 < tok.size() && (tok[i + 1] == '0' || tok[i + 1] == '1')) {
        key += tok[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        key += tok[i];
      }
    }
    if (cur->is_object() && cur->contains(key)) {
      cur = &(*cur)[key];
    } else if (cur->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
               std::stoull(key) < cur->size()) {
      cur = &(*cur)[std::stoull(key)];
    } else {
      fail(where, "'" + ref + "' does not resolve in this document");
    }
    target_ptr = pointer_append(target_ptr, key);
    if (next == std::string::npos) break;
    pos = next;
  }
  return *cur;
}

int32_t SchemaCompiler::ref_rule(const std::string& target_ptr, const Json& target, int depth) {
  auto it = ref_rules_.find(target_ptr);
  if (it != ref_rules_.end()) return it->second;
  int32_t r = gb_.add_rule("ref" + target_ptr);
  ref_rules_[target_ptr] = r;
  compile_into(r, target, target_ptr, depth + 1);
  return r;
}

int32_t SchemaCompiler::value_rule(const Json& s, const std::string& ptr, int depth) {
  int32_t r = gb_.add_rule(fresh(ptr));
  compile_into(r, s, ptr, depth + 1);
  return r;
}

// Returns an object without $ref/allOf/const/nullable at the top level (or a boolean schema).
Json SchemaCompiler::normalize(const Json& s, const std::string& ptr, int depth) {
  if (depth > kMaxDepth) fail(ptr, "schema nesting (or $ref inlining for allOf) deeper than 64");
  if (s.is_boolean()) return s;
  if (!s.is_object()) fail(ptr, "a schema must be an object or a boolean");
  check_keywords(s, ptr);
  Json n = Json::object();
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!is_annotation(it.key()) && !ignored(it.key())) n[it.key()] = it.value();
  if (n.contains("type")) n["type"] = type_array(n["type"], ptr);
  if (n.contains("format") && n["format"].is_string() && !format_asserted(n["format"].get<std::string>())) n.erase("format");
  if (n.contains("const")) {
    Json c = n["const"];
    n.erase("const");
    Json e = Json::array();
    if (n.contains("enum")) {
      for (const Json& v : n["enum"])
        if (v == c) e.push_back(v);
    } else {
      e.push_back(c);
    }
    n["enum"] = e;
  }
  if (n.contains("items") && n["items"].is_array()) {
    if (n.contains("prefixItems")) fail(pointer_append(ptr, "items"), "array form together with prefixItems");
    n["prefixItems"] = n["items"];
    n.erase("items");
    if (n.contains("additionalItems")) n["items"] = n["additionalItems"];
  }
  n.erase("additionalItems");
  if (n.contains("dependencies")) {
    std::string dp = pointer_append(ptr, "dependencies");
    if (!n["dependencies"].is_object()) fail(dp, "must be an object");
    Json req = n.contains("dependentRequired") ? n["dependentRequired"] : Json::object();
    Json schemas = Json::object();
    for (auto it = n["dependencies"].begin(); it != n["dependencies"].end(); ++it)
      (it.value().is_array() ? req : schemas)[it.key()] = it.value();
    n.erase("dependencies");
    if (!req.empty()) n["dependentRequired"] = req;
    if (!schemas.empty()) {
      Json dep = n.contains("dependentSchemas") ? n["dependentSchemas"] : Json::object();
      for (auto it = schemas.begin(); it != schemas.end(); ++it) dep[it.key()] = it.value();
      n["dependentSchemas"] = dep;
    }
  }
  if (n.contains("dependentSchemas")) {
    // key absent, or key present and the object satisfies the schema
    if (!n["dependentSchemas"].is_object()) fail(pointer_append(ptr, "dependentSchemas"), "must be an object");
    Json all = n.contains("allOf") ? n["allOf"] : Json::array();
    for (auto it = n["dependentSchemas"].begin(); it != n["dependentSchemas"].end(); ++it) {
      Json absent = {{"properties", {{it.key(), false}}}};
      Json present = {{"required", {it.key()}}, {"allOf", Json::array({it.value()})}};
      all.push_back(Json{{"anyOf", Json::array({absent, present})}});
    }
    n.erase("dependentSchemas");
    n["allOf"] = all;
  }
  // 'if' alone constrains nothing; beside unevaluated* it still evaluates what it names when it
  // holds (as if "then": true), when its negation is expressible
  const bool bare_if = n.contains("if") && !n.contains("then") && !n.contains("else");
  if (bare_if && !n.contains("unevaluatedProperties") && !n.contains("unevaluatedItems")) n.erase("if");
  if (n.contains("if")) {
    // (if and then) or (not if and else): the negation as for 'not'
    std::string ip = pointer_append(ptr, "if");
    Json then_s = n.contains("then") ? n["then"] : Json(true);
    Json else_s = n.contains("else") ? n["else"] : Json(true);
    Json branch = true;
    try {
      Json cond = normalize(n["if"], ip, depth + 1);
      if (cond == true || (cond.is_object() && cond.empty())) {
        branch = then_s;
      } else if (cond == false) {
        branch = else_s;
      } else {
        auto neg = negate(cond, 0);
        if (!neg)
          fail(ip, "if/then/else needs the negation of 'if', which is supported for type exclusions, required keys, "
                   "property types, string lengths, patterns, formats, number bounds and array sizes only");
        Json no = neg->empty() ? Json(false) : Json{{"allOf", Json::array({Json{{"anyOf", *neg}}, else_s})}};
        branch = Json{{"anyOf", Json::array({Json{{"allOf", Json::array({n["if"], then_s})}}, no})}};
      }
    } catch (const GrammarError&) {
      if (!bare_if) throw;
      grammar_budget_check();
    }
    Json all = n.contains("allOf") ? n["allOf"] : Json::array();
    all.push_back(branch);
    n["allOf"] = all;
  }
  n.erase("if"), n.erase("then"), n.erase("else");
  if (n.contains("enum") && !n["enum"].is_array()) fail(pointer_append(ptr, "enum"), "must be an array");
  if (n.contains("nullable")) {
    if (n["nullable"] == true && n.contains("type") && !has_type(n["type"], "null")) n["type"].push_back("null");
    n.erase("nullable");
  }
  Json unevaluated = Json::object();
  for (const char* kw : {"unevaluatedProperties", "unevaluatedItems"})
    if (n.contains(kw)) unevaluated[kw] = n[kw], n.erase(kw);
  if (n.contains("not")) {
    Json x = normalize(n["not"], pointer_append(ptr, "not"), depth + 1);
    n.erase("not");
    if (x == true || (x.is_object() && x.empty())) return Json(false);
    Json mine = n.contains("type") ? n["type"] : Json(kTypes);
    bool integers_from_numbers = x.is_object() && x.contains("type") && has_type(mine, "number") &&
                                 !has_type(x["type"], "number") && has_type(x["type"], "integer");
    if (x.is_object() && x.size() == 1 && x.contains("type") && !integers_from_numbers) {
      Json keep = Json::array();
      for (const Json& t : mine) {
        bool excluded = has_type(x["type"], t.get<std::string>()) || (t == "integer" && has_type(x["type"], "number"));
        if (!excluded) keep.push_back(t);
      }
      n["type"] = keep;
    } else if (x != false) {
      auto neg = negate(x, 0);
      if (!neg)
        fail(pointer_append(ptr, "not"),
             "unsupported keyword 'not' (only type exclusions, required keys, property types, string lengths, "
             "patterns, formats, number bounds and array sizes)");
      if (neg->empty()) return Json(false);
      Json any = Json{{"anyOf", *neg}};
      n = merge(n, any, ptr, depth);
    }
  }
  if (n.contains("$ref")) {
    if (!n["$ref"].is_string()) fail(pointer_append(ptr, "$ref"), "must be a string");
    std::string tp;
    const Json& target = resolve_ref(n["$ref"].get<std::string>(), ptr, tp);
    n.erase("$ref");
    Json t = normalize(target, tp, depth + 1);
    n = merge(n, t, ptr, depth);
  }
  if (n.is_object() && n.contains("allOf")) {
    Json all = n["allOf"];
    n.erase("allOf");
    if (!all.is_array()) fail(pointer_append(ptr, "allOf"), "must be an array");
    for (size_t i = 0; i < all.size(); ++i) {
      if (!n.is_object()) break;
      n = merge(n, normalize(all[i], pointer_append(pointer_append(ptr, "allOf"), std::to_string(i)), depth + 1), ptr, depth);
    }
  }
  if (n.is_object() && n.contains(kHasKeyOutside) && n.value("additionalProperties", Json(true)) == false &&
      !n.contains("patternProperties")) {
    // inside a closed object: one of its own (not forbidden) keys outside each list is present
    // (elsewhere it waits for a merge to close the object, or is refused when compiled)
    Json lists = n[kHasKeyOutside];
    n.erase(kHasKeyOutside);
    std::vector<std::string> own;
    if (n.contains("properties"))
      for (auto it = n["properties"].begin(); it != n["properties"].end(); ++it)
        if (normalize(it.value(), pointer_append(pointer_append(ptr, "properties"), it.key()), depth + 1) != false)
          own.push_back(it.key());
    for (const Json& list : lists) {
      Json any = Json::array();
      for (const std::string& k : own)
        if (std::find(list.begin(), list.end(), Json(k)) == list.end()) any.push_back(Json{{"required", {k}}});
      if (any.empty()) return Json(false);
      n = merge(n, Json{{"anyOf", any}}, ptr, depth);
    }
  }
  if (!n.is_object() || unevaluated.empty()) return n;
  if (n.contains(kEvaluates))
    fail(ptr, "unevaluatedProperties/unevaluatedItems beside the negation of a oneOf whose branches evaluate "
              "properties or items is not supported");
  if (n.contains("anyOf") || n.contains("oneOf")) {
    for (auto it = unevaluated.begin(); it != unevaluated.end(); ++it) n[it.key()] = it.value();
    return n;
  }
  // With every applicator merged into n, what is left unevaluated is exactly what
  // additionalProperties / items would apply to.
  if (unevaluated.contains("unevaluatedProperties") && !n.contains("additionalProperties"))
    n["additionalProperties"] = unevaluated["unevaluatedProperties"];
  if (unevaluated.contains("unevaluatedItems")) {
    if (n.contains("contains")) fail(pointer_append(ptr, "unevaluatedItems"), "unevaluatedItems with contains is not supported");
    bool tail = n.contains("items") && !n["items"].is_array();
    bool draft7_tail = n.contains("items") && n["items"].is_array() && n.contains("additionalItems");
    if (n.contains("items") && n["items"].is_array() && !draft7_tail) n["additionalItems"] = unevaluated["unevaluatedItems"];
    else if (!tail && !draft7_tail) n["items"] = unevaluated["unevaluatedItems"];
  }
  return n;
}

Json SchemaCompiler::merge(const Json& a, const Json& b, const std::string& ptr, int depth) {
  if (a.is_boolean()) return a == true ? b : a;
  if (b.is_boolean()) return b == true ? a : b;
  for (const Json* x : {&a, &b})
    for (const char* kw : {"unevaluatedProperties", "unevaluatedItems"})
      if (x->contains(kw)) fail(ptr, std::string(kw) + " inside allOf/anyOf/oneOf combinations is not supported");
  Json out = a;
  auto addl_of = [](const Json& s) { return s.contains("additionalProperties") ? s["additionalProperties"] : Json(true); };
  auto all_of = [](const Json& x, const Json& y) { return Json{{"allOf", Json::array({x, y})}}; };
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    const Json& v = it.value();
    if (!out.contains(k)) {
      out[k] = v;
      continue;
    }
    Json& o = out[k];
    if (k == "type") {
      Json t = Json::array();
      for (const Json& x : o) {
        if (has_type(v, x.get<std::string>())) t.push_back(x);
        else if (x == "number" && has_type(v, "integer")) t.push_back("integer");
        else if (x == "integer" && has_type(v, "number")) t.push_back("integer");
      }
      o = t;
    } else if (k == "enum") {
      Json e = Json::array();
      for (const Json& x : o)
        if (std::find(v.begin(), v.end(), x) != v.end()) e.push_back(x);
      o = e;
    } else if (k == "properties") {
      for (auto p = v.begin(); p != v.end(); ++p) o[p.key()] = o.contains(p.key()) ? all_of(o[p.key()], p.value()) : p.value();
    } else if (k == "required") {
      for (const Json& x : v)
        if (std::find(o.begin(), o.end(), x) == o.end()) o.push_back(x);
    } else if (k == "items" || k == "prefixItems") {
      continue;  // merged below, by position
    } else if (k == "additionalProperties" || k == "additionalItems") {
      o = all_of(o, v);
    } else if (k == "minItems" || k == "minLength" || k == "minProperties" || k == "minimum" ||
               (k == "exclusiveMinimum" && o.is_number() && v.is_number())) {
      if (v > o) o = v;
    } else if (k == "maxItems" || k == "maxLength" || k == "maxProperties" || k == "maximum" ||
               (k == "exclusiveMaximum" && o.is_number() && v.is_number())) {
      if (v < o) o = v;
    } else if (k == "pattern") {
      Json ps = o.is_array() ? o : Json::array({o});
      if (v.is_array()) for (const Json& x : v) ps.push_back(x);
      else ps.push_back(v);
      o = ps;
    } else if (k == "anyOf") {
      Json prod = Json::array();
      for (const Json& x : o)
        for (const Json& y : v) prod.push_back(all_of(x, y));
      if (prod.size() > kMaxAlternatives) fail(ptr, "allOf: too many anyOf combinations");
      o = prod;
    } else if (k == kNegated || k == kNegatedItems) {
      for (auto p = v.begin(); p != v.end(); ++p) o[p.key()] = o.contains(p.key()) ? all_of(o[p.key()], p.value()) : p.value();
    } else if (k == kNotEnum || k == kNotString || k == kHasKeyOutside) {
      for (const Json& x : v) o.push_back(x);
    } else if (k == "multipleOf") {
      // both: kept as a list, each a DFA the number's must be in
      Json ms = o.is_array() ? o : Json::array({o});
      for (const Json& x : v.is_array() ? v : Json::array({v}))
        if (std::find(ms.begin(), ms.end(), x) == ms.end()) ms.push_back(x);
      o = ms.size() == 1 ? ms[0] : ms;
    } else if (k == "uniqueItems") {
      o = o == true || v == true;
    } else if (o != v) {
      fail(ptr, "allOf: cannot combine differing '" + k + "' keywords");
    }
  }
  // items: position i < max(prefix lengths) gets each side's prefix schema or its tail
  if (a.contains("prefixItems") || b.contains("prefixItems") || a.contains("items") || b.contains("items")) {
    auto prefix = [](const Json& s) { return s.contains("prefixItems") ? s["prefixItems"] : Json::array(); };
    auto tail = [](const Json& s) { return s.contains("items") ? s["items"] : Json(true); };
    Json pa = prefix(a), pb = prefix(b);
    size_t k = std::max(pa.size(), pb.size());
    Json merged = Json::array();
    for (size_t i = 0; i < k; ++i) {
      Json x = i < pa.size() ? pa[i] : tail(a), y = i < pb.size() ? pb[i] : tail(b);
      merged.push_back(x == true ? y : y == true ? x : all_of(x, y));
    }
    out.erase("prefixItems");
    out.erase("items");
    if (k > 0) out["prefixItems"] = merged;
    if (a.contains("items") || b.contains("items")) {
      Json ta = tail(a), tb = tail(b);
      out["items"] = ta == true ? tb : tb == true ? ta : all_of(ta, tb);
    }
  }
  // properties one side adds are still subject to the other side's additionalProperties
  for (const Json* side : {&a, &b}) {
    const Json& other = side == &a ? b : a;
    Json addl = addl_of(*side);
    if (addl == true || !other.contains("properties")) continue;
    if (side->contains("patternProperties")) fail(ptr, "allOf: additionalProperties with patternProperties across branches");
    for (auto p = other["properties"].begin(); p != other["properties"].end(); ++p) {
      bool own = side->contains("properties") && (*side)["properties"].contains(p.key());
      if (!own) out["properties"][p.key()] = all_of(out["properties"][p.key()], addl);
    }
  }
  (void)depth;
  return out;
}

void SchemaCompiler::compile_into(int32_t rule, const Json& s, const std::string& ptr, int depth) {
  if (depth > kMaxDepth * 4) fail(ptr, "schema nesting too deep");
  FragBuilder fb = gb_.frags(rule);
  if (s.is_object()) {
    check_keywords(s, ptr);
    size_t constraints = 0;
    for (auto it = s.begin(); it != s.end(); ++it) constraints += !is_annotation(it.key()) && !ignored(it.key());
    if (constraints == 1 && s.contains("$ref") && s["$ref"].is_string()) {
      std::string tp;
      const Json& target = resolve_ref(s["$ref"].get<std::string>(), ptr, tp);
      int32_t callee = ref_rule(tp, target, depth);
      gb_.frags(rule).set_root(gb_.frags(rule).call(callee));
      return;
    }
  }
  Json n = normalize(s, ptr, 0);
  if (n.is_boolean()) {
    gb_.frags(rule).set_root(n == true ? gb_.frags(rule).call(any_value_rule()) : gb_.frags(rule).alt({}));
    return;
  }
  if (n.contains("anyOf") || n.contains("oneOf")) {
    Json base = n;
    base.erase("anyOf");
    base.erase("oneOf");
    Json unevaluated = Json::object();
    for (const char* kw : {"unevaluatedProperties", "unevaluatedItems"})
      if (base.contains(kw)) unevaluated[kw] = base[kw], base.erase(kw);
    std::vector<Json> alts{base};
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (!n.contains(kw)) continue;
      const Json& branches = n[kw];
      if (!branches.is_array() || branches.empty()) fail(pointer_append(ptr, kw), "must be a non-empty array");
      std::vector<Json> next;
      bool one = std::string(kw) == "oneOf";
      std::vector<Json> normalized;
      if (one)
        for (size_t i = 0; i < branches.size(); ++i)
          normalized.push_back(normalize(branches[i], pointer_append(pointer_append(ptr, kw), std::to_string(i)), 0));
      for (const Json& a : alts) {
        if (one) {
          for (Json& x : exclusive_branches(a, normalized, ptr)) next.push_back(std::move(x));
          continue;
        }
        for (size_t i = 0; i < branches.size(); ++i) {
          std::string bp = pointer_append(pointer_append(ptr, kw), std::to_string(i));
          // an unconstrained base keeps the branch as written, so $ref recursion stays a call
          if (a.is_object() && a.empty() && unevaluated.empty()) next.push_back(branches[i]);
          else next.push_back(merge(a, normalize(branches[i], bp, 0), ptr, 0));
        }
      }
      if (next.size() > kMaxAlternatives) fail(ptr, std::string(kw) + ": too many alternatives");
      alts = std::move(next);
    }
    for (Json& a : alts) {
      if (unevaluated.empty() || !a.is_object()) continue;
      if (a.contains("$ref") || a.contains("allOf")) a = Json{{"allOf", Json::array({a})}};
      for (auto it = unevaluated.begin(); it != unevaluated.end(); ++it) a[it.key()] = it.value();
    }
    std::vector<Frag> calls;
    for (size_t i = 0; i < alts.size(); ++i) {
      int32_t r = value_rule(alts[i], ptr, depth);
      calls.push_back(gb_.frags(rule).call(r));
    }
    gb_.frags(rule).set_root(gb_.frags(rule).alt(calls));
    return;
  }
  Frag f = typed_frag(rule, n, ptr, depth);
  gb_.frags(rule).set_root(f);
  (void)fb;
}

Frag SchemaCompiler::typed_frag(int32_t rule, const Json& s, const std::string& ptr, int depth) {
  Json types = s.contains("type") ? s["type"] : Json(kTypes);
  Json n = s;
  n.erase(kEvaluates);
  if (n.contains(kNegatedItems)) {
    // the negations' item constraints, on the positions' own schemas (prefixItems, else items)
    Json negs = n[kNegatedItems];
    n.erase(kNegatedItems);
    if (has_type(types, "array")) {
      Json pre = n.contains("prefixItems") ? n["prefixItems"] : Json::array();
      Json tail = n.contains("items") ? n["items"] : Json(true);
      for (auto p = negs.begin(); p != negs.end(); ++p) {
        size_t i = std::stoul(p.key());
        if (i >= 64) fail(ptr, "a negated item constraint beyond position 64 is not supported");
        while (pre.size() <= i) pre.push_back(tail);
        pre[i] = Json{{"allOf", Json::array({pre[i], p.value()})}};
      }
      n["prefixItems"] = pre;
    }
  }
  if (n.contains(kNegated)) {
    // the negations' property constraints, on what evaluates each property (named, else additional)
    Json negs = n[kNegated];
    n.erase(kNegated);
    if (has_type(types, "object")) {
      Json addl = n.contains("additionalProperties") ? n["additionalProperties"] : Json(true);
      for (auto p = negs.begin(); p != negs.end(); ++p) {
        if (n.contains("properties") && n["properties"].contains(p.key())) {
          n["properties"][p.key()] = Json{{"allOf", Json::array({n["properties"][p.key()], p.value()})}};
          continue;
        }
        // a key a pattern matches is evaluated by it (object_frag applies the pattern's schema to
        // named keys too); any other, by additionalProperties
        bool by_pattern = false;
        if (n.contains("patternProperties") && n["patternProperties"].is_object()) {
          std::string content = Json(p.key()).dump();
          content = content.substr(1, content.size() - 2);
          for (auto pp = n["patternProperties"].begin(); pp != n["patternProperties"].end(); ++pp)
            by_pattern |= accepts_bytes(key_pattern_dfa(pp.key(), pointer_append(pointer_append(ptr, "patternProperties"), pp.key())),
                                        content);
        }
        n["properties"][p.key()] = addl == true || by_pattern ? p.value() : Json{{"allOf", Json::array({p.value(), addl})}};
      }
    }
  }
  if (n.contains("enum")) return enum_frag(rule, n, ptr);

  if (n.contains(kHasKeyOutside) && has_type(types, "object"))
    fail(ptr, "the negation of 'additionalProperties: false' is supported inside closed objects only");
  std::vector<Frag> alts;
  if (has_type(types, "null")) alts.push_back(gb_.frags(rule).literal("null"));
  if (has_type(types, "boolean")) alts.push_back(gb_.frags(rule).alt({gb_.frags(rule).literal("true"), gb_.frags(rule).literal("false")}));
  if (has_type(types, "number") || has_type(types, "integer")) {
    bool number = has_type(types, "number");
    if (n.contains("multipleOf") || n.contains(kFractional)) {
      int32_t r = gb_.add_rule(fresh(ptr + "/multipleOf"));
      Frag f = number ? number_frag(r, n, ptr) : integer_frag(r, n, ptr);
      gb_.frags(r).set_root(f);
      Rule d = determinize_bytes(gb_.nfa(r), "number", 200000);
      if (n.contains("multipleOf"))
        for (const Json& m : n["multipleOf"].is_array() ? n["multipleOf"] : Json::array({n["multipleOf"]}))
          d = intersect_bytes(d, multiple_of_dfa(m, pointer_append(ptr, "multipleOf")), false, 200000);
      if (n.contains(kFractional)) {
        GrammarBuilder fb;
        int32_t fr = fb.add_rule("fraction");
        fb.frags(fr).set_root(emit_regex(fb, fr, "-?(0|[1-9][0-9]*)\\.[0-9]*[1-9][0-9]*", {.byte_only = true}));
        d = intersect_bytes(d, determinize_bytes(fb.nfa(fr), "fraction", 1000), false, 200000);
      }
      gb_.set_from_dfa(r, d);
      alts.push_back(gb_.frags(rule).call(r));
    } else {
      alts.push_back(number ? number_frag(rule, n, ptr) : integer_frag(rule, n, ptr));
    }
  }
  if (has_type(types, "string")) alts.push_back(string_frag(rule, n, ptr));
  if (has_type(types, "array")) {
    bool unique = n.contains("uniqueItems") && n["uniqueItems"] == true;
    alts.push_back(unique ? unique_array_frag(rule, n, ptr, depth) : array_frag(rule, n, ptr, depth));
  }
  if (has_type(types, "object")) alts.push_back(object_frag(rule, n, ptr, depth));
  return gb_.frags(rule).alt(alts);
}

Frag SchemaCompiler::repeat_frag(int32_t rule, int32_t body, uint32_t min, uint32_t max) {
  constexpr uint32_t kInline = 8;
  if (max != kUnbounded && max <= kInline) {
    std::vector<Frag> parts;
    for (uint32_t i = 0; i < min; ++i) parts.push_back(gb_.frags(rule).call(body));
    Frag tail = gb_.frags(rule).empty();
    for (uint32_t i = min; i < max; ++i) tail = gb_.frags(rule).opt(gb_.frags(rule).seq({gb_.frags(rule).call(body), tail}));
    parts.push_back(tail);
    return gb_.frags(rule).seq(parts);
  }
  if (max == kUnbounded && min <= kInline) {
    std::vector<Frag> parts;
    for (uint32_t i = 0; i < min; ++i) parts.push_back(gb_.frags(rule).call(body));
    parts.push_back(gb_.frags(rule).star(gb_.frags(rule).call(body)));
    return gb_.frags(rule).seq(parts);
  }
  int32_t rep = gb_.add_repeat(gb_.name(body) + "/count", body, min, max);
  return gb_.frags(rule).call(rep);
}

namespace {

// The values a normalized item schema allows when they are finitely many and it says nothing
// else: an enum (with a type), or the types boolean and null.
std::optional<std::vector<Json>> finite_values(const Json& s) {
  if (s == false) return std::vector<Json>{};
  if (!s.is_object()) return std::nullopt;
  static const std::set<std::string> bounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  bool bounded = false;
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (bounds.count(it.key()) && it.value().is_number()) bounded = true;
    else if (it.key() != "enum" && it.key() != "type") return std::nullopt;
  }
  Json types = s.contains("type") ? s["type"] : Json(kTypes);
  if (bounded) {
    // integers between two bounds, when few
    if (s.contains("enum") || types.size() != 1 || types[0] != "integer") return std::nullopt;
    auto num = [&](const char* kw) { return s.contains(kw) ? std::optional<double>(s[kw].get<double>()) : std::nullopt; };
    std::optional<double> lo = num("minimum"), hi = num("maximum"), xlo = num("exclusiveMinimum"), xhi = num("exclusiveMaximum");
    if ((!lo && !xlo) || (!hi && !xhi)) return std::nullopt;
    double first = std::max(lo ? std::ceil(*lo) : -1e300, xlo ? std::floor(*xlo) + 1 : -1e300);
    double last = std::min(hi ? std::floor(*hi) : 1e300, xhi ? std::ceil(*xhi) - 1 : 1e300);
    if (last - first >= 12 || std::fabs(first) > 1e15 || std::fabs(last) > 1e15) return std::nullopt;
    std::vector<Json> out;
    for (double v = first; v <= last; ++v) out.push_back(int64_t(v));
    return out;
  }
  auto type_ok = [&](const Json& v) {
    if (v.is_null()) return has_type(types, "null");
    if (v.is_boolean()) return has_type(types, "boolean");
    if (v.is_string()) return has_type(types, "string");
    if (v.is_array()) return has_type(types, "array");
    if (v.is_object()) return has_type(types, "object");
    if (v.is_number_integer() || v.is_number_unsigned()) return has_type(types, "integer") || has_type(types, "number");
    return has_type(types, "number");
  };
  std::vector<Json> out;
  if (s.contains("enum")) {
    for (const Json& v : s["enum"])
      if (type_ok(v) && std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    return out;
  }
  for (const Json& t : types)
    if (t != "null" && t != "boolean") return std::nullopt;
  if (has_type(types, "null")) out.push_back(nullptr);
  if (has_type(types, "boolean")) out.push_back(false), out.push_back(true);
  return out;
}

}  // namespace

Frag SchemaCompiler::unique_array_frag(int32_t rule, const Json& n, const std::string& ptr, int depth) {
  std::string up = pointer_append(ptr, "uniqueItems");
  auto refuse = [&] {
    fail(up, "unsupported keyword 'uniqueItems' (true), but for items of at most 12 enumerated values (enum, "
             "const, boolean, null, integers between two bounds) or at most one item: no grammar tells "
             "unbounded values apart");
  };
  if (n.contains("maxItems") && n["maxItems"].is_number() && n["maxItems"].get<double>() < 2)
    return array_frag(rule, n, ptr, depth);
  if (n.contains("contains")) refuse();
  std::vector<Json> prefix;
  Json tail = n.contains("items") ? n["items"] : Json(true);
  if (n.contains("prefixItems")) {
    if (!n["prefixItems"].is_array()) fail(pointer_append(ptr, "prefixItems"), "must be an array");
    for (const Json& x : n["prefixItems"]) prefix.push_back(x);
  }
  auto count = [&](const char* kw, uint64_t dflt) -> uint64_t {
    if (!n.contains(kw)) return dflt;
    const Json& v = n[kw];
    if (!v.is_number() || v.get<double>() < 0) fail(pointer_append(ptr, kw), "must be a non-negative integer");
    return uint64_t(std::min(v.get<double>(), 1e9));
  };
  uint64_t min = count("minItems", 0), max = count("maxItems", kUnbounded);
  // per position (the prefix, then the tail), the allowed values, as indexes into `values`
  std::vector<Json> values;
  std::vector<std::vector<int>> allowed;
  for (size_t i = 0; i <= prefix.size(); ++i) {
    const bool is_tail = i == prefix.size();
    Json item = is_tail ? tail : prefix[i];
    std::string ip = is_tail ? pointer_append(ptr, "items") : pointer_append(pointer_append(ptr, "prefixItems"), std::to_string(i));
    auto vs = finite_values(normalize(item, ip, depth + 1));
    if (!vs) refuse();
    std::vector<int> idx;
    for (const Json& v : *vs) {
      auto it = std::find(values.begin(), values.end(), v);
      if (it == values.end()) it = values.insert(values.end(), v);
      idx.push_back(int(it - values.begin()));
    }
    allowed.push_back(std::move(idx));
  }
  if (values.size() > 12) refuse();
  // states: the set of values used so far (its size is the number of items)
  FragBuilder fb = gb_.frags(rule);
  Frag open = fb.seq({fb.literal("["), ws(rule)});
  Frag close = gb_.frags(rule).seq({ws(rule), gb_.frags(rule).literal("]")});
  std::map<uint32_t, int32_t> state_of{{0u, open.out}};
  std::vector<uint32_t> work{0u};
  while (!work.empty()) {
    uint32_t mask = work.back();
    work.pop_back();
    int32_t from = state_of[mask];
    uint64_t c = uint64_t(std::popcount(mask));
    if (c >= min) gb_.frags(rule).eps(from, close.in);
    if (c >= max) continue;
    const std::vector<int>& next = allowed[std::min<size_t>(c, prefix.size())];
    for (int v : next) {
      if (mask >> v & 1) continue;
      uint32_t to_mask = mask | (1u << v);
      auto [it, fresh_state] = state_of.emplace(to_mask, -1);
      if (fresh_state) it->second = gb_.nfa(rule).add_state(), work.push_back(to_mask);
      Frag lit = gb_.frags(rule).literal(values[size_t(v)].dump());
      Frag el = c == 0 ? lit : gb_.frags(rule).seq({sep(rule, ','), lit});
      gb_.frags(rule).eps(from, el.in);
      gb_.frags(rule).eps(el.out, it->second);
    }
  }
  return {open.in, close.out};
}

Frag SchemaCompiler::array_frag(int32_t rule, const Json& n, const std::string& ptr, int depth) {
  std::vector<Json> prefix;
  Json tail = true;
  std::string tail_ptr = pointer_append(ptr, "items");
  if (n.contains("prefixItems")) {
    if (!n["prefixItems"].is_array()) fail(pointer_append(ptr, "prefixItems"), "must be an array");
    for (const Json& x : n["prefixItems"]) prefix.push_back(x);
    if (n.contains("items")) tail = n["items"];
  } else if (n.contains("items") && n["items"].is_array()) {
    for (const Json& x : n["items"]) prefix.push_back(x);
    if (n.contains("additionalItems")) tail = n["additionalItems"], tail_ptr = pointer_append(ptr, "additionalItems");
  } else if (n.contains("items")) {
    tail = n["items"];
  }
  auto count = [&](const char* kw, uint64_t dflt) -> uint64_t {
    if (!n.contains(kw)) return dflt;
    const Json& v = n[kw];
    if (!v.is_number() || v.get<double>() < 0) fail(pointer_append(ptr, kw), "must be a non-negative integer");
    return uint64_t(std::min(v.get<double>(), 1e9));
  };
  uint64_t k = prefix.size();
  uint64_t min = count("minItems", 0), max = count("maxItems", kUnbounded);
  uint64_t min_contains = count("minContains", 1), max_contains = count("maxContains", kUnbounded);
  if (n.contains("contains") && (min_contains > 0 || max_contains != kUnbounded))
    return contains_frag(rule, n, ptr, depth, tail, min, max, min_contains, max_contains);
  if (tail == false) max = std::min(max, k);
  FragBuilder fb = gb_.frags(rule);
  if (min > max) return fb.alt({});
  std::vector<int32_t> prefix_rules;
  for (size_t i = 0; i < k && i < max; ++i)
    prefix_rules.push_back(value_rule(prefix[i], pointer_append(pointer_append(ptr, "prefixItems"), std::to_string(i)), depth));
  int32_t tail_rule = (max > k && tail != false) ? value_rule(tail, tail_ptr, depth) : -1;
  Nfa& nfa = gb_.nfa(rule);
  Frag open = gb_.frags(rule).seq({gb_.frags(rule).literal("["), ws(rule)});
  Frag close = gb_.frags(rule).seq({ws(rule), gb_.frags(rule).literal("]")});
  int32_t cur = open.out;
  for (uint64_t i = 0; i < prefix_rules.size(); ++i) {
    if (i >= min) gb_.frags(rule).eps(cur, close.in);
    Frag el = i == 0 ? gb_.frags(rule).call(prefix_rules[i])
                     : gb_.frags(rule).seq({sep(rule, ','), gb_.frags(rule).call(prefix_rules[i])});
    gb_.frags(rule).eps(cur, el.in);
    cur = el.out;
  }
  (void)nfa;
  uint64_t done = prefix_rules.size();
  if (done == k && tail_rule >= 0 && max > k) {
    uint64_t tmin = min > k ? min - k : 0;
    uint64_t tmax = max == kUnbounded ? kUnbounded : max - k;
    int32_t elem = gb_.add_rule(fresh(tail_ptr + "/elem"));
    gb_.frags(elem).set_root(gb_.frags(elem).seq({sep(elem, ','), gb_.frags(elem).call(tail_rule)}));
    Frag t;
    if (k > 0) {
      t = repeat_frag(rule, elem, uint32_t(tmin), uint32_t(tmax));
    } else {
      Frag first = gb_.frags(rule).call(tail_rule);
      Frag rest = repeat_frag(rule, elem, uint32_t(tmin > 0 ? tmin - 1 : 0), tmax == kUnbounded ? kUnbounded : uint32_t(tmax - 1));
      t = gb_.frags(rule).seq({first, rest});
      if (tmin == 0) t = gb_.frags(rule).opt(t);
    }
    gb_.frags(rule).eps(cur, t.in);
    gb_.frags(rule).eps(t.out, close.in);
  } else if (done >= min) {
    gb_.frags(rule).eps(cur, close.in);
  }
  return {open.in, close.out};
}

// Arrays with `contains`: between m and mc elements satisfy contains (and items), the rest only
// items (and, when mc bounds the count, not contains: its negation, as for 'not').
Frag SchemaCompiler::contains_frag(int32_t rule, const Json& n, const std::string& ptr, int depth, const Json& tail,
                                   uint64_t min, uint64_t max, uint64_t m, uint64_t mc) {
  std::string cp = pointer_append(ptr, "contains");
  if (n.contains("prefixItems") || (n.contains("items") && n["items"].is_array()))
    fail(cp, "contains together with prefixItems is not supported");
  if (max != kUnbounded || m > 64 || min > m || (mc != kUnbounded && mc > 64))
    fail(cp, "contains with minItems/maxItems, or minContains/maxContains above 64, is not supported");
  if (mc < m) return gb_.frags(rule).alt({});
  const bool bounded = mc != kUnbounded;
  const uint64_t top = bounded ? mc : m;  // count states 0..top
  Json plain_schema = tail;
  if (bounded) {
    Json c = normalize(n["contains"], cp, depth + 1);
    auto neg = negate(c, 0);
    if (!neg)
      fail(pointer_append(ptr, "maxContains"),
           "maxContains needs the negation of 'contains', which is supported as for 'not' only");
    plain_schema = neg->empty() ? Json(false) : Json{{"allOf", Json::array({tail, Json{{"anyOf", *neg}}})}};
  }
  const bool plain_ok = tail != false && plain_schema != false;
  const bool hit_ok = tail != false;
  int32_t plain = plain_ok ? value_rule(plain_schema, pointer_append(ptr, "items"), depth) : -1;
  int32_t hit = hit_ok ? value_rule(Json{{"allOf", Json::array({tail, n["contains"]})}}, cp, depth) : -1;
  Nfa& nfa = gb_.nfa(rule);
  std::vector<int32_t> more(size_t(top) + 1);
  for (auto& x : more) x = nfa.add_state();
  Frag open = gb_.frags(rule).seq({gb_.frags(rule).literal("["), ws(rule)});
  Frag close = gb_.frags(rule).seq({ws(rule), gb_.frags(rule).literal("]")});
  auto edge = [&](int32_t from, int32_t to, int32_t callee, bool with_sep) {
    if (callee < 0) return;
    Frag c = with_sep ? gb_.frags(rule).seq({sep(rule, ','), gb_.frags(rule).call(callee)}) : gb_.frags(rule).call(callee);
    gb_.frags(rule).eps(from, c.in);
    gb_.frags(rule).eps(c.out, to);
  };
  auto after_hit = [&](uint64_t c) -> int64_t {
    if (!bounded) return int64_t(std::min(c + 1, m));
    return c + 1 <= mc ? int64_t(c + 1) : -1;
  };
  if (m == 0) gb_.frags(rule).eps(open.out, close.in);
  edge(open.out, more[0], plain, false);
  if (after_hit(0) >= 0) edge(open.out, more[size_t(after_hit(0))], hit, false);
  for (uint64_t c = 0; c <= top; ++c) {
    edge(more[c], more[c], plain, true);
    if (after_hit(c) >= 0) edge(more[c], more[size_t(after_hit(c))], hit, true);
    if (c >= m) gb_.frags(rule).eps(more[c], close.in);
  }
  return {open.in, close.out};
}

}  // namespace json_schema_detail

Grammar compile_json_schema(const nlohmann::ordered_json& schema, const JsonSchemaOptions& opts) {
  return with_grammar_budget(opts.budget, [&] {
    try {
      std::optional<nlohmann::ordered_json> rewritten = json_schema_detail::resolve_references(schema, opts);
      json_schema_detail::SchemaCompiler c(rewritten ? *rewritten : schema, opts);
      return c.run();
    } catch (const nlohmann::json::exception& e) {
      grammar_fail("grammar: json_schema: a keyword has a value of the wrong type: ", e.what());
    }
  });
}

std::string json_schema_options_key(const JsonSchemaOptions& opts) {
  nlohmann::ordered_json k = {{"whitespace", int(opts.whitespace)},
                              {"property_order", int(opts.property_order)},
                              {"ignore_keywords", opts.ignore_keywords},
                              {"ignore_unknown_keywords", opts.ignore_unknown_keywords},
                              {"integer_zero_fraction", opts.integer_zero_fraction}};
  if (!opts.schema_store.empty()) k["schema_store"] = opts.schema_store;
  return k.dump();
}

Grammar compile_json_schema_text(std::string_view schema_text, const JsonSchemaOptions& opts) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    grammar_fail("grammar: json_schema: not valid JSON: ", e.what());
  }
  return compile_json_schema(j, opts);
}

}  // namespace exl
