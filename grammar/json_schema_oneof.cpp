// oneOf: an instance must match exactly one branch. Branch i is compiled as base ∧ b_i ∧ ¬b_j for
// every j whose overlap with i is not ruled out by provably_disjoint; ¬b_j is written as a list of
// alternatives (other types, a required key absent, a property of the wrong type, a string of the
// wrong length or outside a pattern or format, a number beyond a bound, an array of the wrong size)
// when b_j's keywords allow it, and the schema is refused otherwise.
#include <algorithm>
#include <cmath>
#include <set>

#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema_impl.h"

namespace exl::json_schema_detail {
namespace {

const std::vector<std::string> kAllTypes = {"null", "boolean", "object", "array", "number", "integer", "string"};
constexpr int kMaxNegationDepth = 8;
constexpr size_t kMaxNegationAlternatives = 64;

std::set<std::string> type_set(const Json& s) {
  std::set<std::string> t;
  if (!s.is_object() || !s.contains("type")) return {kAllTypes.begin(), kAllTypes.end()};
  for (const Json& x : s["type"]) t.insert(x.get<std::string>());
  if (t.count("number")) t.insert("integer");
  return t;
}

// The JSON type of a value, "integer" for integral numbers.
std::string value_type(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  double d = v.get<double>();
  return d == double(int64_t(d)) ? "integer" : "number";
}

bool type_admits(const std::set<std::string>& types, const Json& v) { return types.count(value_type(v)) > 0; }

bool in_array(const Json& arr, const Json& v) { return std::find(arr.begin(), arr.end(), v) != arr.end(); }

const std::set<std::string> kObjectKeywords = {"properties", "required", "additionalProperties", "patternProperties",
                                               "minProperties", "maxProperties", "propertyNames", "dependentRequired"};

}  // namespace

// A superset of the values a (raw or normalized) schema allows, when it is a finite list.
std::optional<Json> SchemaCompiler::value_list(const Json& s, int depth) const {
  if (!s.is_object() || depth > kMaxNegationDepth) return std::nullopt;
  if (s.contains("const")) return Json::array({s["const"]});
  if (s.contains("enum") && s["enum"].is_array()) return s["enum"];
  if (s.contains("allOf") && s["allOf"].is_array())
    for (const Json& x : s["allOf"])
      if (auto v = value_list(x, depth + 1)) return v;
  if (s.contains("$ref") && s["$ref"].is_string()) {
    try {
      std::string tp;
      return value_list(resolve_ref(s["$ref"].get<std::string>(), "", tp), depth + 1);
    } catch (const GrammarError&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

bool SchemaCompiler::provably_disjoint(const Json& a, const Json& b, int depth) {
  if (a.is_boolean() || b.is_boolean()) return a == false || b == false;
  if (depth > kMaxNegationDepth) return false;
  std::set<std::string> ta = type_set(a), tb = type_set(b), common;
  for (const auto& t : ta)
    if (tb.count(t)) common.insert(t);
  if (common.empty()) return true;
  for (const Json* x : {&a, &b}) {
    const Json& other = x == &a ? b : a;
    if (!x->contains("enum")) continue;
    const std::set<std::string>& other_types = x == &a ? tb : ta;
    bool any = false;
    for (const Json& v : (*x)["enum"])
      any |= type_admits(other_types, v) && (!other.contains("enum") || in_array(other["enum"], v));
    if (!any) return true;
  }
  // objects_disjoint says nothing about non-objects, which satisfy both sides' object keywords.
  return common.size() == 1 && common.count("object") && objects_disjoint(a, b, depth);
}

// No object satisfies both a and b.
bool SchemaCompiler::objects_disjoint(const Json& a, const Json& b, int depth) {
  if (a.is_boolean() || b.is_boolean()) return a == false || b == false;
  if (depth > kMaxNegationDepth) return false;
  // a key one side requires, whose values the two sides' property schemas keep apart
  auto prop = [](const Json& s, const std::string& k) -> std::optional<Json> {
    if (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(k)) return s["properties"][k];
    if (s.contains("patternProperties")) return std::nullopt;
    if (s.contains("additionalProperties") && s["additionalProperties"] == false) return Json(false);
    return std::nullopt;
  };
  std::set<std::string> keys;
  for (const Json* x : {&a, &b})
    if (x->contains("required") && (*x)["required"].is_array())
      for (const Json& k : (*x)["required"])
        if (k.is_string()) keys.insert(k.get<std::string>());
  for (const std::string& k : keys) {
    auto pa = prop(a, k), pb = prop(b, k);
    if ((pa && *pa == false) || (pb && *pb == false)) return true;
    if (!pa || !pb) continue;
    auto va = value_list(*pa, 0), vb = value_list(*pb, 0);
    if (va && vb) {
      bool common_value = false;
      for (const Json& x : *va) common_value |= in_array(*vb, x);
      if (!common_value) return true;
    }
    try {
      if (provably_disjoint(normalize(*pa, "", 0), normalize(*pb, "", 0), depth + 1)) return true;
    } catch (const GrammarError&) {
    }
  }
  return false;
}

// Alternatives whose union is the complement of the normalized schema s (exactly, but for the
// non-integer numbers, which are those written with a fraction and no exponent: a subset, so a
// negation never accepts what s accepts), or nullopt when s uses keywords this cannot complement.
std::optional<std::vector<Json>> SchemaCompiler::negate(const Json& schema, int depth) {
  if (schema.is_boolean()) return schema == true ? std::vector<Json>{} : std::vector<Json>{Json(true)};
  if (!schema.is_object() || depth > kMaxNegationDepth) return std::nullopt;
  Json s = schema;
  if (s.contains("patternProperties") && s.value("additionalProperties", Json(true)) == true && s["patternProperties"].is_object()) {
    // patterns whose schemas are true constrain nothing (with no additionalProperties to exempt keys from)
    bool all_true = true;
    for (auto it = s["patternProperties"].begin(); it != s["patternProperties"].end(); ++it)
      all_true &= it.value() == true || (it.value().is_object() && it.value().empty());
    if (all_true) s.erase("patternProperties");
  }
  static const std::set<std::string> ok = {"type", "required", "properties", "minLength", "maxLength", "enum", "pattern", "format",
                                           "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                           "minItems", "maxItems", "anyOf", "oneOf", "additionalProperties", "prefixItems",
                                           "items", kNegated, kNegatedItems};
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!ok.count(it.key())) return std::nullopt;
  std::vector<Json> out;
  std::set<std::string> types = type_set(s);
  const bool integers_only = types.count("integer") && !types.count("number");
  if (s.contains("type")) {
    Json rest = Json::array();
    for (const std::string& t : kAllTypes)
      if (t != "integer" && !types.count(t) && !(t == "number" && integers_only)) rest.push_back(t);
    if (!rest.empty()) out.push_back(Json{{"type", rest}});
    if (integers_only) out.push_back(Json{{"type", {"number"}}, {kFractional, true}});
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!s.contains(kw)) continue;
    // not (a or b ...) = not a and not b ...: one alternative of each negation, merged; a oneOf
    // counts as an anyOf when its branches are provably disjoint
    std::vector<Json> branches;
    for (const Json& b : s[kw]) branches.push_back(normalize(b, "", 0));
    if (std::string(kw) == "oneOf") {
      // not exactly one = none, or two at once: each pair of overlapping branches, merged, made
      // to evaluate nothing (a failed oneOf evaluates nothing)
      for (size_t i = 0; i < branches.size(); ++i)
        for (size_t j = i + 1; j < branches.size(); ++j) {
          if (provably_disjoint(branches[i], branches[j], 0)) continue;
          Json both;
          try {
            both = merge(branches[i], branches[j], "", 0);
            if (both == false) continue;
            both = without_evaluation(both, 0);
          } catch (const GrammarError&) {
            grammar_budget_check();
            return std::nullopt;
          }
          out.push_back(std::move(both));
          if (out.size() > kMaxNegationAlternatives) return std::nullopt;
        }
    }
    std::vector<Json> acc{Json::object()};
    for (const Json& b : branches) {
      auto nb = negate(b, depth + 1);
      if (!nb) return std::nullopt;
      std::vector<Json> next;
      for (const Json& x : acc)
        for (const Json& y : *nb) {
          try {
            Json m = merge(x, y, "", 0);
            if (m != false) next.push_back(std::move(m));
          } catch (const GrammarError&) {
            grammar_budget_check();
            return std::nullopt;
          }
          if (next.size() > kMaxNegationAlternatives) return std::nullopt;
        }
      acc = std::move(next);
    }
    for (Json& x : acc) out.push_back(std::move(x));
  }
  if (s.contains("additionalProperties") && s["additionalProperties"] != true) {
    // a key outside the named properties (with no patternProperties to claim it)
    if (s["additionalProperties"] != false) return std::nullopt;
    if (types.count("object")) {
      Json keys = Json::array();
      if (s.contains("properties"))
        for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) keys.push_back(it.key());
      out.push_back(Json{{"type", {"object"}}, {kHasKeyOutside, Json::array({keys})}});
    }
  }
  if (types.count("object")) {
    if (s.contains("required"))
      for (const Json& k : s["required"])
        out.push_back(Json{{"type", {"object"}}, {"properties", {{k.get<std::string>(), false}}}});
    if (s.contains("properties")) {
      for (auto p = s["properties"].begin(); p != s["properties"].end(); ++p) {
        auto np = negate(normalize(p.value(), "", 0), depth + 1);
        if (!np) return std::nullopt;
        for (const Json& alt : *np)
          out.push_back(
              Json{{"type", {"object"}}, {"required", {p.key()}}, {kNegated, {{p.key(), alt}}}});
      }
    }
  }
  if (s.contains("enum")) {
    // values outside the list: whole types it does not mention, other booleans, other strings,
    // the numbers in the open intervals around and between the listed ones
    Json strings = Json::array();
    std::set<std::string> seen;
    std::vector<Json> numbers;
    for (const Json& v : s["enum"]) {
      std::string t = value_type(v);
      if (t == "object" || t == "array") return std::nullopt;
      if (t == "integer" || t == "number") {
        if (!std::isfinite(v.get<double>())) return std::nullopt;
        numbers.push_back(v);
        t = "number";
      }
      seen.insert(t);
      if (v.is_string()) strings.push_back(v);
    }
    std::sort(numbers.begin(), numbers.end(), [](const Json& a, const Json& b) { return a.get<double>() < b.get<double>(); });
    for (size_t i = 0; i + 1 < numbers.size(); ++i)
      if (numbers[i].get<double>() == numbers[i + 1].get<double>() && numbers[i] != numbers[i + 1])
        return std::nullopt;  // equal as doubles but written apart: beyond what the bounds can tell
    const bool numbers_wanted = types.count("number") || types.count("integer");
    if (numbers_wanted && !numbers.empty()) {
      Json num_type = Json::array({integers_only ? "integer" : "number"});
      out.push_back(Json{{"type", num_type}, {"exclusiveMaximum", numbers.front()}});
      out.push_back(Json{{"type", num_type}, {"exclusiveMinimum", numbers.back()}});
      for (size_t i = 0; i + 1 < numbers.size(); ++i)
        if (numbers[i].get<double>() < numbers[i + 1].get<double>())
          out.push_back(Json{{"type", num_type}, {"exclusiveMinimum", numbers[i]}, {"exclusiveMaximum", numbers[i + 1]}});
    }
    for (const std::string& t : kAllTypes) {
      if (t == "integer" || !types.count(t)) continue;
      if (t == "number" && !numbers.empty()) continue;
      if (!seen.count(t)) out.push_back(Json{{"type", {t}}});
      else if (t == "string") out.push_back(Json{{"type", {"string"}}, {kNotEnum, strings}});
      else if (t == "boolean")
        for (bool b : {false, true})
          if (!in_array(s["enum"], Json(b))) out.push_back(Json{{"enum", {b}}});
    }
  }
  if (types.count("string")) {
    auto len = [&](const char* kw) {
      return s.contains(kw) && s[kw].is_number() && s[kw].get<double>() >= 0 ? std::optional<double>(std::min(s[kw].get<double>(), 4e9))
                                                                             : std::nullopt;
    };
    if (auto mn = len("minLength"); mn && *mn >= 1) out.push_back(Json{{"type", {"string"}}, {"maxLength", uint64_t(*mn) - 1}});
    if (auto mx = len("maxLength")) out.push_back(Json{{"type", {"string"}}, {"minLength", uint64_t(*mx) + 1}});
    for (const char* kw : {"pattern", "format"})
      if (s.contains(kw)) out.push_back(Json{{"type", {"string"}}, {kNotString, Json::array({Json{{kw, s[kw]}}})}});
  }
  if (types.count("number") || types.count("integer")) {
    // a bound's complement is the opposite bound on numbers (draft-04 boolean exclusives aside)
    static const std::pair<const char*, const char*> opposite[] = {{"minimum", "exclusiveMaximum"},
                                                                  {"maximum", "exclusiveMinimum"},
                                                                  {"exclusiveMinimum", "maximum"},
                                                                  {"exclusiveMaximum", "minimum"}};
    for (auto [kw, inv] : opposite)
      if (s.contains(kw)) {
        if (!s[kw].is_number()) return std::nullopt;
        out.push_back(Json{{"type", {"number"}}, {inv, s[kw]}});
      }
  }
  if (types.count("array")) {
    auto count = [&](const char* kw) -> std::optional<double> {
      if (!s.contains(kw)) return std::nullopt;
      if (!s[kw].is_number() || s[kw].get<double>() < 0) return -1.0;
      return std::min(s[kw].get<double>(), 4e9);
    };
    auto mn = count("minItems"), mx = count("maxItems");
    if ((mn && *mn < 0) || (mx && *mx < 0)) return std::nullopt;
    if (mn && *mn >= 1) out.push_back(Json{{"type", {"array"}}, {"maxItems", uint64_t(std::ceil(*mn)) - 1}});
    if (mx) out.push_back(Json{{"type", {"array"}}, {"minItems", uint64_t(std::floor(*mx)) + 1}});
    // an item at position i outside prefixItems[i] (not evaluated: kNegatedItems); an item past
    // the prefix where items is false
    size_t k = 0;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array() || s["prefixItems"].size() > 16) return std::nullopt;
      k = s["prefixItems"].size();
      for (size_t i = 0; i < k; ++i) {
        auto ni = negate(normalize(s["prefixItems"][i], "", 0), depth + 1);
        if (!ni) return std::nullopt;
        for (const Json& alt : *ni)
          out.push_back(Json{{"type", {"array"}}, {"minItems", i + 1}, {kNegatedItems, {{std::to_string(i), alt}}}});
      }
    }
    if (s.contains("items")) {
      Json t = normalize(s["items"], "", 0);
      if (t == false) out.push_back(Json{{"type", {"array"}}, {"minItems", k + 1}});
      else if (!(t == true || (t.is_object() && t.empty()))) return std::nullopt;
    }
  }
  return out;
}

// The same constraint as the normalized schema s, evaluating nothing: named properties become
// kNegated, patterns and additional properties that allow anything go, nested anyOf/oneOf branches
// likewise; marked kEvaluates where something that evaluates stays.
Json SchemaCompiler::without_evaluation(const Json& s, int depth) {
  if (!s.is_object()) return s;
  grammar_poll();
  Json out = s;
  if (depth > kMaxNegationDepth) {
    out[kEvaluates] = true;
    return out;
  }
  if (out.contains("patternProperties") && out["patternProperties"].is_object()) {
    Json kept = Json::object();
    for (auto it = out["patternProperties"].begin(); it != out["patternProperties"].end(); ++it)
      if (!(it.value() == true || (it.value().is_object() && it.value().empty()))) kept[it.key()] = it.value();
    if (kept.empty() && out.value("additionalProperties", Json(true)) == true) out.erase("patternProperties");
    else out["patternProperties"] = kept;
  }
  if (out.contains("additionalProperties") && out["additionalProperties"] == true) out.erase("additionalProperties");
  if (out.contains("properties") && out["properties"].is_object() && !out.contains("patternProperties") &&
      !out.contains("additionalProperties")) {
    Json negs = out.value(kNegated, Json::object());
    for (auto p = out["properties"].begin(); p != out["properties"].end(); ++p)
      negs[p.key()] = negs.contains(p.key()) ? Json{{"allOf", Json::array({negs[p.key()], p.value()})}} : p.value();
    out.erase("properties");
    out[kNegated] = negs;
  }
  if (out.contains("prefixItems") && out["prefixItems"].is_array() && !out.contains("items")) {
    Json negs = out.value(kNegatedItems, Json::object());
    for (size_t i = 0; i < out["prefixItems"].size(); ++i) {
      std::string key = std::to_string(i);
      const Json& x = out["prefixItems"][i];
      negs[key] = negs.contains(key) ? Json{{"allOf", Json::array({negs[key], x})}} : x;
    }
    out.erase("prefixItems");
    out[kNegatedItems] = negs;
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!out.contains(kw) || !out[kw].is_array()) continue;
    Json branches = Json::array();
    for (const Json& b : out[kw]) branches.push_back(without_evaluation(normalize(b, "", 0), depth + 1));
    out[kw] = branches;
  }
  for (const char* ev : {"properties", "patternProperties", "additionalProperties", "prefixItems", "items", "contains",
                         "unevaluatedProperties", "unevaluatedItems", "allOf", "$ref"})
    if (out.contains(ev)) out[kEvaluates] = true;
  return out;
}

// The oneOf branches (normalized) under `base`, each made exclusive of the others.
std::vector<Json> SchemaCompiler::exclusive_branches(const Json& base, const std::vector<Json>& branches,
                                                     const std::string& ptr) {
  std::vector<Json> merged, out;
  for (const Json& b : branches) merged.push_back(merge(base, b, ptr, 0));
  for (size_t i = 0; i < merged.size(); ++i) {
    Json cur = merged[i];
    for (size_t j = 0; j < merged.size() && cur != false; ++j) {
      if (i == j || provably_disjoint(merged[i], merged[j], 0)) continue;
      if (objects_disjoint(merged[i], merged[j], 0) && branches[j].is_object()) {
        // only non-objects can match both: keep those b_j refuses by type, when that is all it checks
        bool object_only = true;
        for (auto it = branches[j].begin(); it != branches[j].end(); ++it)
          object_only &= it.key() == "type" || kObjectKeywords.count(it.key()) > 0;
        if (object_only) {
          std::set<std::string> tj = type_set(branches[j]);
          Json keep = Json::array({"object"});
          for (const std::string& t : kAllTypes)
            if (t != "object" && t != "integer" && !tj.count(t)) keep.push_back(t);
          cur = merge(cur, Json{{"type", keep}}, ptr, 0);
          continue;
        }
      }
      auto neg = negate(branches[j], 0);
      if (!neg)
        fail(pointer_append(ptr, "oneOf"), "branches " + std::to_string(std::min(i, j)) + " and " +
                                               std::to_string(std::max(i, j)) +
                                               " may overlap (only provably exclusive oneOf is supported)");
      if (neg->empty()) cur = Json(false);
      else cur = merge(cur, Json{{"anyOf", *neg}}, ptr, 0);
    }
    out.push_back(cur);
  }
  return out;
}

}  // namespace exl::json_schema_detail
