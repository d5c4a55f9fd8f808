#include <algorithm>

#include <re2/re2.h>

#include "grammar/grammar_error.h"
#include "grammar/json_schema_impl.h"

namespace exl::json_schema_detail {
namespace {

constexpr size_t kMaxAnyOrderRequired = 12;

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

std::string key_content(const std::string& name) {
  std::string d = Json(name).dump();
  return d.substr(1, d.size() - 2);
}

}  // namespace

Frag SchemaCompiler::enum_frag(int32_t rule, const Json& n, const std::string& ptr) {
  Json types = n.contains("type") ? n["type"] : Json::array();
  auto type_ok = [&](const Json& v) {
    if (!n.contains("type")) return true;
    auto has = [&](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
    if (v.is_null()) return has("null");
    if (v.is_boolean()) return has("boolean");
    if (v.is_string()) return has("string");
    if (v.is_array()) return has("array");
    if (v.is_object()) return has("object");
    if (v.is_number_integer() || v.is_number_unsigned()) return has("integer") || has("number");
    double d = v.get<double>();
    return has("number") || (has("integer") && d == double(int64_t(d)));
  };
  auto string_ok = [&](const std::string& s) {
    size_t len = utf8_length(s);
    if (n.contains("minLength") && double(len) < n["minLength"].get<double>()) return false;
    if (n.contains("maxLength") && double(len) > n["maxLength"].get<double>()) return false;
    if (n.contains("pattern")) {
      Json ps = n["pattern"].is_array() ? n["pattern"] : Json::array({n["pattern"]});
      for (const Json& p : ps) {
        RE2 re(p.get<std::string>(), RE2::Quiet);
        if (!re.ok()) fail(pointer_append(ptr, "pattern"), "pattern together with enum: RE2 cannot check it: " + re.error());
        if (!RE2::PartialMatch(s, re)) return false;
      }
    }
    if (n.contains("format")) fail(pointer_append(ptr, "format"), "format together with enum is not supported");
    return true;
  };
  auto number_ok = [&](const Json& v) {
    double d = v.get<double>();
    if (n.contains("minimum") && n["minimum"].is_number() && d < n["minimum"].get<double>()) return false;
    if (n.contains("maximum") && n["maximum"].is_number() && d > n["maximum"].get<double>()) return false;
    if (n.contains("exclusiveMinimum") && n["exclusiveMinimum"].is_number() && d <= n["exclusiveMinimum"].get<double>()) return false;
    if (n.contains("exclusiveMaximum") && n["exclusiveMaximum"].is_number() && d >= n["exclusiveMaximum"].get<double>()) return false;
    return true;
  };
  for (auto it = n.begin(); it != n.end(); ++it) {
    static const std::vector<std::string> ok = {"enum", "type", "minLength", "maxLength", "pattern", "format",
                                                "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", kNotEnum};
    if (std::find(ok.begin(), ok.end(), it.key()) == ok.end())
      fail(pointer_append(ptr, it.key()), "'" + it.key() + "' together with enum/const is not supported");
  }
  std::vector<Frag> alts;
  for (const Json& v : n["enum"]) {
    if (!type_ok(v)) continue;
    if (v.is_string() && !string_ok(v.get<std::string>())) continue;
    if (v.is_number() && !number_ok(v)) continue;
    if (n.contains(kNotEnum) && std::find(n[kNotEnum].begin(), n[kNotEnum].end(), v) != n[kNotEnum].end()) continue;
    alts.push_back(gb_.frags(rule).literal(v.dump()));
  }
  return gb_.frags(rule).alt(alts);
}

Frag SchemaCompiler::object_frag(int32_t rule, const Json& n, const std::string& ptr, int depth) {
  struct Named {
    std::string name;
    Json schema;
    std::string ptr;
    bool required;
  };
  std::vector<Named> named;
  std::vector<std::string> required;
  if (n.contains("required")) {
    if (!n["required"].is_array()) fail(pointer_append(ptr, "required"), "must be an array");
    for (const Json& r : n["required"]) {
      if (!r.is_string()) fail(pointer_append(ptr, "required"), "entries must be strings");
      if (std::find(required.begin(), required.end(), r.get<std::string>()) == required.end()) required.push_back(r.get<std::string>());
    }
  }
  auto is_required = [&](const std::string& k) { return std::find(required.begin(), required.end(), k) != required.end(); };
  if (n.contains("properties")) {
    if (!n["properties"].is_object()) fail(pointer_append(ptr, "properties"), "must be an object");
    for (auto it = n["properties"].begin(); it != n["properties"].end(); ++it)
      named.push_back({it.key(), it.value(), pointer_append(pointer_append(ptr, "properties"), it.key()), is_required(it.key())});
  }
  Json addl = n.contains("additionalProperties") ? n["additionalProperties"] : Json(true);
  struct Pat {
    std::string pattern;
    Json schema;
    std::string ptr;
    Rule dfa;
  };
  std::vector<Pat> pats;
  if (n.contains("patternProperties")) {
    if (!n["patternProperties"].is_object()) fail(pointer_append(ptr, "patternProperties"), "must be an object");
    for (auto it = n["patternProperties"].begin(); it != n["patternProperties"].end(); ++it) {
      std::string pp = pointer_append(pointer_append(ptr, "patternProperties"), it.key());
      pats.push_back({it.key(), it.value(), pp, key_pattern_dfa(it.key(), pp)});
    }
  }
  for (const std::string& r : required) {
    bool listed = std::any_of(named.begin(), named.end(), [&](const Named& x) { return x.name == r; });
    if (!listed) named.push_back({r, Json(true), pointer_append(pointer_append(ptr, "required"), r), true});
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> deps;
  if (n.contains("dependentRequired")) {
    std::string dp = pointer_append(ptr, "dependentRequired");
    if (!n["dependentRequired"].is_object()) fail(dp, "must be an object");
    for (auto it = n["dependentRequired"].begin(); it != n["dependentRequired"].end(); ++it) {
      if (!it.value().is_array()) fail(pointer_append(dp, it.key()), "must be an array of strings");
      std::vector<std::string> names;
      for (const Json& v : it.value()) names.push_back(v.get<std::string>());
      deps.push_back({it.key(), names});
    }
    for (const auto& [a, bs] : deps) {
      std::vector<std::string> all = bs;
      all.push_back(a);
      for (const std::string& x : all)
        if (std::none_of(named.begin(), named.end(), [&](const Named& y) { return y.name == x; }))
          named.push_back({x, Json(true), pointer_append(dp, a), false});
    }
  }
  // pattern and additional schemas that apply to the named properties
  for (Named& x : named) {
    Json all = Json::array({x.schema});
    bool by_pattern = false;
    for (const Pat& p : pats)
      if (accepts_bytes(p.dfa, key_content(x.name))) all.push_back(p.schema), by_pattern = true;
    bool listed = n.contains("properties") && n["properties"].contains(x.name);
    if (!listed && !by_pattern) all.push_back(addl);
    if (all.size() > 1) x.schema = Json{{"allOf", all}};
  }
  // propertyNames: restrict every key
  std::optional<Rule> names_ok;
  if (n.contains("propertyNames")) {
    std::string pp = pointer_append(ptr, "propertyNames");
    Json pn = normalize(n["propertyNames"], pp, 0);
    if (pn != true) {
      bool strings = pn.is_object() && (!pn.contains("type") || std::find(pn["type"].begin(), pn["type"].end(), "string") != pn["type"].end());
      if (pn.is_object())
        for (auto it = pn.begin(); it != pn.end(); ++it)
          if (it.key() != "type" && it.key() != "pattern" && it.key() != "minLength" && it.key() != "maxLength" &&
              it.key() != "format" && it.key() != "enum")
            fail(pp, "'" + it.key() + "' in propertyNames is not supported");
      if (!strings) {
        names_ok = literal_set_dfa({});
      } else if (pn.contains("enum")) {
        std::vector<std::string> lits;
        for (const Json& v : pn["enum"])
          if (v.is_string()) lits.push_back(key_content(v.get<std::string>()));
        bool trivial = false;
        names_ok = intersect_bytes(literal_set_dfa(lits), string_content_dfa(pn, pp, trivial), false, 200000);
      } else {
        bool trivial = false;
        names_ok = string_content_dfa(pn, pp, trivial);
      }
    }
  }
  if (names_ok) {
    std::vector<Named> kept;
    for (Named& x : named) {
      if (accepts_bytes(*names_ok, key_content(x.name))) kept.push_back(std::move(x));
      else if (x.required) return gb_.frags(rule).alt({});
    }
    named = std::move(kept);
    for (Pat& p : pats) p.dfa = intersect_bytes(p.dfa, *names_ok, false, 200000);
  }
  std::vector<std::string> literals;
  for (const Named& x : named) literals.push_back(key_content(x.name));
  Rule named_dfa = literal_set_dfa(literals);

  auto member = [&](Frag key, int32_t mrule, int32_t value) {
    FragBuilder fb = gb_.frags(mrule);
    fb.set_root(gb_.frags(mrule).seq({key, sep(mrule, ':'), gb_.frags(mrule).call(value)}));
    (void)fb;
  };
  std::vector<int32_t> named_rules;
  for (const Named& x : named) {
    int32_t m = gb_.add_rule(fresh(x.ptr + "/member"));
    int32_t v = value_rule(x.schema, x.ptr, depth);
    member(gb_.frags(m).literal(Json(x.name).dump()), m, v);
    named_rules.push_back(m);
  }
  std::vector<int32_t> extras;
  auto keyed_member = [&](const Rule& key_dfa, const Json& schema, const std::string& sptr) {
    if (is_empty_bytes(key_dfa)) return;
    int32_t m = gb_.add_rule(fresh(sptr + "/member"));
    int32_t v = value_rule(schema, sptr, depth);
    Frag key = gb_.frags(m).seq({gb_.frags(m).literal("\""), gb_.frags(m).dfa(key_dfa), gb_.frags(m).literal("\"")});
    member(key, m, v);
    extras.push_back(m);
  };
  // patternProperties: one member kind per non-empty region of overlapping patterns
  if (pats.size() > 6) fail(pointer_append(ptr, "patternProperties"), "more than 6 patterns are not supported");
  for (size_t mask = 1; mask < (size_t(1) << pats.size()); ++mask) {
    std::optional<Rule> region;
    Json schemas = Json::array();
    std::string rptr;
    for (size_t i = 0; i < pats.size(); ++i)
      if (mask >> i & 1) {
        region = region ? intersect_bytes(*region, pats[i].dfa, false, 200000) : pats[i].dfa;
        schemas.push_back(pats[i].schema);
        if (rptr.empty()) rptr = pats[i].ptr;
      }
    for (size_t i = 0; i < pats.size() && !is_empty_bytes(*region); ++i)
      if (!(mask >> i & 1)) region = intersect_bytes(*region, pats[i].dfa, true, 200000);
    region = intersect_bytes(*region, named_dfa, true, 200000);
    keyed_member(*region, schemas.size() == 1 ? schemas[0] : Json{{"allOf", schemas}}, rptr);
  }
  if (addl != false) {
    bool trivial = false;
    Rule any = names_ok ? *names_ok : string_content_dfa(Json::object(), ptr, trivial);
    Rule rest = intersect_bytes(any, named_dfa, true, 200000);
    for (const Pat& p : pats) rest = intersect_bytes(rest, p.dfa, true, 200000);
    keyed_member(rest, addl, pointer_append(ptr, "additionalProperties"));
  }
  size_t n_required = std::count_if(named.begin(), named.end(), [](const Named& x) { return x.required; });
  bool any_order = opts_.property_order == JsonSchemaOptions::PropertyOrder::any;
  auto count_kw = [&](const char* kw) -> std::optional<uint64_t> {
    if (!n.contains(kw)) return std::nullopt;
    if (!n[kw].is_number() || n[kw].get<double>() < 0) fail(pointer_append(ptr, kw), "must be a non-negative integer");
    return uint64_t(std::min(n[kw].get<double>(), 1e9));
  };
  std::optional<uint64_t> min_props = count_kw("minProperties"), max_props = count_kw("maxProperties");
  if (min_props && *min_props <= n_required) min_props.reset();
  if (max_props && extras.empty() && named.size() <= *max_props) max_props.reset();
  if (!any_order && (min_props || max_props || !deps.empty()))
    fail(ptr, "minProperties/maxProperties/dependentRequired need property order 'any' (or to be implied by required)");
  Frag open = gb_.frags(rule).seq({gb_.frags(rule).literal("{"), ws(rule)});
  Frag close = gb_.frags(rule).seq({ws(rule), gb_.frags(rule).literal("}")});
  auto edge = [&](int32_t from, int32_t to, int32_t m, bool with_sep) {
    Frag c = with_sep ? gb_.frags(rule).seq({sep(rule, ','), gb_.frags(rule).call(m)}) : gb_.frags(rule).call(m);
    gb_.frags(rule).eps(from, c.in);
    gb_.frags(rule).eps(c.out, to);
  };
  Nfa& nfa = gb_.nfa(rule);
  if (opts_.property_order == JsonSchemaOptions::PropertyOrder::schema) {
    int32_t first = open.out, more = nfa.add_state();
    for (size_t i = 0; i < named.size(); ++i) {
      int32_t nf = nfa.add_state(), nm = nfa.add_state();
      edge(first, nm, named_rules[i], false);
      edge(more, nm, named_rules[i], true);
      if (!named[i].required) {
        gb_.frags(rule).eps(first, nf);
        gb_.frags(rule).eps(more, nm);
      }
      first = nf;
      more = nm;
    }
    for (int32_t e : extras) {
      edge(first, more, e, false);
      edge(more, more, e, true);
    }
    gb_.frags(rule).eps(first, close.in);
    gb_.frags(rule).eps(more, close.in);
    return {open.in, close.out};
  }
  // any order: the state tracks which tracked properties (required or in dependentRequired) have
  // been written and, for min/maxProperties, how many members (capped)
  std::vector<int> bit(named.size(), -1);
  int nb = 0;
  size_t required_mask = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    bool tracked = named[i].required ||
                   std::any_of(deps.begin(), deps.end(), [&](const auto& d) {
                     return d.first == named[i].name || std::find(d.second.begin(), d.second.end(), named[i].name) != d.second.end();
                   });
    if (!tracked) continue;
    if (named[i].required) required_mask |= size_t(1) << nb;
    bit[i] = nb++;
  }
  auto bit_of = [&](const std::string& name) {
    for (size_t i = 0; i < named.size(); ++i)
      if (named[i].name == name) return bit[i];
    return -1;
  };
  uint64_t cap = max_props ? *max_props : min_props ? *min_props : 0;
  if (nb > int(kMaxAnyOrderRequired) && deps.empty() && !min_props && !max_props) {
    // Too many required properties to track as a set: they must come in schema order relative
    // to each other (optional and additional ones anywhere). Never accepts a missing one.
    std::vector<size_t> req_idx;
    for (size_t i = 0; i < named.size(); ++i)
      if (named[i].required) req_idx.push_back(i);
    std::vector<int32_t> at(req_idx.size() + 1);
    for (auto& x : at) x = nfa.add_state();
    int32_t first = open.out;
    auto others = [&](int32_t from, int32_t to, bool with_sep) {
      for (size_t i = 0; i < named.size(); ++i)
        if (!named[i].required) edge(from, to, named_rules[i], with_sep);
      for (int32_t e : extras) edge(from, to, e, with_sep);
    };
    edge(first, at[1], named_rules[req_idx[0]], false);
    others(first, at[0], false);
    for (size_t j = 0; j <= req_idx.size(); ++j) {
      others(at[j], at[j], true);
      if (j < req_idx.size()) edge(at[j], at[j + 1], named_rules[req_idx[j]], true);
    }
    gb_.frags(rule).eps(at.back(), close.in);
    return {open.in, close.out};
  }
  if (nb > int(kMaxAnyOrderRequired) || (size_t(1) << nb) * (cap + 1) > 8192)
    fail(ptr, "too many required/dependent properties or too large min/maxProperties for property order 'any'");
  size_t masks = size_t(1) << nb;
  auto idx = [&](size_t mask, uint64_t c) { return size_t(c) * masks + mask; };
  std::vector<int32_t> more(masks * size_t(cap + 1));
  for (auto& x : more) x = nfa.add_state();
  auto accepting = [&](size_t mask, uint64_t c) {
    if ((mask & required_mask) != required_mask) return false;
    if (min_props && c < *min_props) return false;
    for (const auto& [a, bs] : deps) {
      if (!(mask >> bit_of(a) & 1)) continue;
      for (const std::string& b : bs)
        if (!(mask >> bit_of(b) & 1)) return false;
    }
    return true;
  };
  auto next_count = [&](uint64_t c) -> std::optional<uint64_t> {
    if (max_props) return c + 1 <= *max_props ? std::optional<uint64_t>(c + 1) : std::nullopt;
    return std::min<uint64_t>(c + 1, cap);
  };
  auto all_members = [&](int32_t from, size_t mask, uint64_t c, bool with_sep) {
    auto nc = next_count(c);
    if (!nc) return;
    for (size_t i = 0; i < named.size(); ++i) {
      if (bit[i] >= 0 && (mask >> bit[i] & 1)) continue;
      size_t nm = bit[i] >= 0 ? (mask | (size_t(1) << bit[i])) : mask;
      edge(from, more[idx(nm, *nc)], named_rules[i], with_sep);
    }
    for (int32_t e : extras) edge(from, more[idx(mask, *nc)], e, with_sep);
  };
  int32_t first = open.out;
  all_members(first, 0, 0, false);
  if (accepting(0, 0)) gb_.frags(rule).eps(first, close.in);
  for (uint64_t c = 0; c <= cap; ++c)
    for (size_t mask = 0; mask < masks; ++mask) {
      all_members(more[idx(mask, c)], mask, c, true);
      if (accepting(mask, c)) gb_.frags(rule).eps(more[idx(mask, c)], close.in);
    }
  return {open.in, close.out};
}

}  // namespace exl::json_schema_detail
