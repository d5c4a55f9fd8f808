#include <algorithm>
#include <cmath>
#include <unordered_map>

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
    alts.push_back(value_frag(rule, v, ptr));
  }
  return gb_.frags(rule).alt(alts);
}

Frag SchemaCompiler::value_frag(int32_t rule, const Json& v, const std::string& ptr) {
  // (a fresh builder per use: compiling a member schema adds rules, which moves the NFAs)
  auto fb = [&] { return gb_.frags(rule); };
  if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::trunc(v.get<double>()) &&
      std::fabs(v.get<double>()) < 9007199254740992.0)
    return value_frag(rule, Json(int64_t(v.get<double>())), ptr);
  if (v.is_number_integer() || v.is_number_unsigned()) {
    Frag f = fb().literal(v.dump());
    if (!opts_.integer_zero_fraction) return f;
    return fb().seq({f, fb().opt(fb().seq({fb().literal(".0"), fb().star(fb().literal("0"))}))});
  }
  if (v.is_array()) {
    std::vector<Frag> parts{fb().literal("["), ws(rule)};
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) parts.push_back(sep(rule, ','));
      parts.push_back(value_frag(rule, v[i], ptr));
    }
    parts.push_back(ws(rule));
    parts.push_back(fb().literal("]"));
    return fb().seq(parts);
  }
  if (v.is_object() && v.size() >= 2 && opts_.property_order == JsonSchemaOptions::PropertyOrder::any) {
    // the same members in any order: as a closed object whose every property is required
    Json props = Json::object(), req = Json::array();
    for (auto it = v.begin(); it != v.end(); ++it) props[it.key()] = Json{{"const", it.value()}}, req.push_back(it.key());
    Json obj = {{"type", "object"}, {"properties", props}, {"required", req}, {"additionalProperties", false}};
    return fb().call(value_rule(obj, ptr, 0));
  }
  if (v.is_object()) {
    std::vector<Frag> parts{fb().literal("{"), ws(rule)};
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) parts.push_back(sep(rule, ','));
      first = false;
      parts.push_back(fb().literal(Json(it.key()).dump()));
      parts.push_back(sep(rule, ':'));
      parts.push_back(value_frag(rule, it.value(), ptr));
    }
    parts.push_back(ws(rule));
    parts.push_back(fb().literal("}"));
    return fb().seq(parts);
  }
  return fb().literal(v.dump());
}

namespace {

// Compiles one object schema (the keywords properties, required, additionalProperties,
// patternProperties, dependentRequired, propertyNames, min/maxProperties) into `rule`: first the
// kinds of members (named properties, regions of overlapping key patterns, additional keys), each
// a rule of its own, then the layout of members between the braces for the property order.
class ObjectFragCompiler {
 public:
  ObjectFragCompiler(SchemaCompiler& sc, int32_t rule, const Json& n, const std::string& ptr, int depth,
                     JsonSchemaOptions::PropertyOrder order)
      : sc_(sc), gb_(sc.gb_), rule_(rule), n_(n), ptr_(ptr), depth_(depth), order_(order) {}

  Frag run() {
    read_required();
    read_properties();
    addl_ = n_.contains("additionalProperties") ? n_["additionalProperties"] : Json(true);
    read_pattern_properties();
    add_unlisted_required();
    read_dependent_required();
    apply_key_schemas();
    if (!restrict_names()) return gb_.frags(rule_).alt({});
    std::vector<std::string> literals;
    for (const Named& x : named_) literals.push_back(key_content(x.name));
    const Rule named_dfa = SchemaCompiler::literal_set_dfa(literals);
    add_named_members();
    add_pattern_members(named_dfa);
    add_additional_member(named_dfa);
    read_counts();
    const Frag open = gb_.frags(rule_).seq({gb_.frags(rule_).literal("{"), sc_.ws(rule_)});
    const Frag close = gb_.frags(rule_).seq({sc_.ws(rule_), gb_.frags(rule_).literal("}")});
    if (order_ == JsonSchemaOptions::PropertyOrder::schema) layout_schema_order(open.out, close.in);
    else layout_any_order(open.out, close.in);
    return {open.in, close.out};
  }

 private:
  struct Named {
    std::string name;
    Json schema;
    std::string ptr;
    bool required;
  };
  struct Pat {
    std::string pattern;
    Json schema;
    std::string ptr;
    Rule dfa;
  };

  bool is_required(const std::string& k) const {
    return std::find(required_.begin(), required_.end(), k) != required_.end();
  }
  bool is_named(const std::string& k) const {
    return std::any_of(named_.begin(), named_.end(), [&](const Named& x) { return x.name == k; });
  }

  void read_required() {
    if (!n_.contains("required")) return;
    if (!n_["required"].is_array()) fail(pointer_append(ptr_, "required"), "must be an array");
    for (const Json& r : n_["required"]) {
      if (!r.is_string()) fail(pointer_append(ptr_, "required"), "entries must be strings");
      if (!is_required(r.get<std::string>())) required_.push_back(r.get<std::string>());
    }
  }

  void read_properties() {
    if (!n_.contains("properties")) return;
    if (!n_["properties"].is_object()) fail(pointer_append(ptr_, "properties"), "must be an object");
    for (auto it = n_["properties"].begin(); it != n_["properties"].end(); ++it)
      named_.push_back({it.key(), it.value(), pointer_append(pointer_append(ptr_, "properties"), it.key()),
                        is_required(it.key())});
  }

  void read_pattern_properties() {
    if (!n_.contains("patternProperties")) return;
    if (!n_["patternProperties"].is_object()) fail(pointer_append(ptr_, "patternProperties"), "must be an object");
    for (auto it = n_["patternProperties"].begin(); it != n_["patternProperties"].end(); ++it) {
      std::string pp = pointer_append(pointer_append(ptr_, "patternProperties"), it.key());
      pats_.push_back({it.key(), it.value(), pp, sc_.key_pattern_dfa(it.key(), pp)});
    }
  }

  void add_unlisted_required() {
    for (const std::string& r : required_)
      if (!is_named(r)) named_.push_back({r, Json(true), pointer_append(pointer_append(ptr_, "required"), r), true});
  }

  void read_dependent_required() {
    if (!n_.contains("dependentRequired")) return;
    std::string dp = pointer_append(ptr_, "dependentRequired");
    if (!n_["dependentRequired"].is_object()) fail(dp, "must be an object");
    for (auto it = n_["dependentRequired"].begin(); it != n_["dependentRequired"].end(); ++it) {
      if (!it.value().is_array()) fail(pointer_append(dp, it.key()), "must be an array of strings");
      std::vector<std::string> names;
      for (const Json& v : it.value()) names.push_back(v.get<std::string>());
      deps_.push_back({it.key(), names});
    }
    for (const auto& [a, bs] : deps_) {
      std::vector<std::string> all = bs;
      all.push_back(a);
      for (const std::string& x : all)
        if (!is_named(x)) named_.push_back({x, Json(true), pointer_append(dp, a), false});
    }
  }

  // The pattern and additional schemas that apply to the named properties.
  void apply_key_schemas() {
    for (Named& x : named_) {
      Json all = Json::array({x.schema});
      bool by_pattern = false;
      for (const Pat& p : pats_)
        if (accepts_bytes(p.dfa, key_content(x.name))) all.push_back(p.schema), by_pattern = true;
      bool listed = n_.contains("properties") && n_["properties"].contains(x.name);
      if (!listed && !by_pattern) all.push_back(addl_);
      if (all.size() > 1) x.schema = Json{{"allOf", all}};
    }
  }

  // The key contents propertyNames allows (nullopt: every key).
  std::optional<Rule> property_names_dfa() {
    if (!n_.contains("propertyNames")) return std::nullopt;
    std::string pp = pointer_append(ptr_, "propertyNames");
    Json pn = sc_.normalize(n_["propertyNames"], pp, 0);
    if (pn == true) return std::nullopt;
    bool strings = pn.is_object() &&
                   (!pn.contains("type") || std::find(pn["type"].begin(), pn["type"].end(), "string") != pn["type"].end());
    if (pn.is_object())
      for (auto it = pn.begin(); it != pn.end(); ++it)
        if (it.key() != "type" && it.key() != "pattern" && it.key() != "minLength" && it.key() != "maxLength" &&
            it.key() != "format" && it.key() != "enum")
          fail(pp, "'" + it.key() + "' in propertyNames is not supported");
    bool trivial = false;
    if (!strings) return SchemaCompiler::literal_set_dfa({});
    if (!pn.contains("enum")) return sc_.string_content_dfa(pn, pp, trivial);
    std::vector<std::string> lits;
    for (const Json& v : pn["enum"])
      if (v.is_string()) lits.push_back(key_content(v.get<std::string>()));
    return intersect_bytes(SchemaCompiler::literal_set_dfa(lits), sc_.string_content_dfa(pn, pp, trivial), false, 200000);
  }

  // Drops the named properties and narrows the patterns propertyNames excludes; false when it
  // excludes a required property (no object is valid).
  bool restrict_names() {
    names_ok_ = property_names_dfa();
    if (!names_ok_) return true;
    std::vector<Named> kept;
    for (Named& x : named_) {
      if (accepts_bytes(*names_ok_, key_content(x.name))) kept.push_back(std::move(x));
      else if (x.required) return false;
    }
    named_ = std::move(kept);
    for (Pat& p : pats_) p.dfa = intersect_bytes(p.dfa, *names_ok_, false, 200000);
    return true;
  }

  // Makes member rule m: key ':' value.
  void member(Frag key, int32_t m, int32_t value) {
    gb_.frags(m).set_root(gb_.frags(m).seq({key, sc_.sep(m, ':'), gb_.frags(m).call(value)}));
  }

  void add_named_members() {
    for (const Named& x : named_) {
      int32_t m = gb_.add_rule(sc_.fresh(x.ptr + "/member"));
      int32_t v = sc_.value_rule(x.schema, x.ptr, depth_);
      member(gb_.frags(m).literal(Json(x.name).dump()), m, v);
      named_rules_.push_back(m);
    }
  }

  // A member kind whose keys are the strings of key_dfa (none when it is empty).
  void add_keyed_member(const Rule& key_dfa, const Json& schema, const std::string& sptr) {
    if (is_empty_bytes(key_dfa)) return;
    int32_t m = gb_.add_rule(sc_.fresh(sptr + "/member"));
    int32_t v = sc_.value_rule(schema, sptr, depth_);
    Frag key = gb_.frags(m).seq({gb_.frags(m).literal("\""), gb_.frags(m).dfa(key_dfa), gb_.frags(m).literal("\"")});
    member(key, m, v);
    extras_.push_back(m);
  }

  // patternProperties: one member kind per non-empty region of overlapping patterns.
  void add_pattern_members(const Rule& named_dfa) {
    if (pats_.size() > 6) fail(pointer_append(ptr_, "patternProperties"), "more than 6 patterns are not supported");
    for (size_t mask = 1; mask < (size_t(1) << pats_.size()); ++mask) {
      std::optional<Rule> region;
      Json schemas = Json::array();
      std::string rptr;
      for (size_t i = 0; i < pats_.size(); ++i)
        if (mask >> i & 1) {
          region = region ? intersect_bytes(*region, pats_[i].dfa, false, 200000) : pats_[i].dfa;
          schemas.push_back(pats_[i].schema);
          if (rptr.empty()) rptr = pats_[i].ptr;
        }
      for (size_t i = 0; i < pats_.size() && !is_empty_bytes(*region); ++i)
        if (!(mask >> i & 1)) region = intersect_bytes(*region, pats_[i].dfa, true, 200000);
      region = intersect_bytes(*region, named_dfa, true, 200000);
      add_keyed_member(*region, schemas.size() == 1 ? schemas[0] : Json{{"allOf", schemas}}, rptr);
    }
  }

  // additionalProperties: keys neither named nor matched by a pattern.
  void add_additional_member(const Rule& named_dfa) {
    if (addl_ == false) return;
    bool trivial = false;
    Rule any = names_ok_ ? *names_ok_ : sc_.string_content_dfa(Json::object(), ptr_, trivial);
    Rule rest = intersect_bytes(any, named_dfa, true, 200000);
    for (const Pat& p : pats_) rest = intersect_bytes(rest, p.dfa, true, 200000);
    add_keyed_member(rest, addl_, pointer_append(ptr_, "additionalProperties"));
  }

  std::optional<uint64_t> count_keyword(const char* kw) const {
    if (!n_.contains(kw)) return std::nullopt;
    if (!n_[kw].is_number() || n_[kw].get<double>() < 0) fail(pointer_append(ptr_, kw), "must be a non-negative integer");
    return uint64_t(std::min(n_[kw].get<double>(), 1e9));
  }

  // min/maxProperties, dropped where the members already imply them.
  void read_counts() {
    size_t n_required = std::count_if(named_.begin(), named_.end(), [](const Named& x) { return x.required; });
    min_props_ = count_keyword("minProperties");
    max_props_ = count_keyword("maxProperties");
    if (min_props_ && *min_props_ <= n_required) min_props_.reset();
    if (max_props_ && extras_.empty() && named_.size() <= *max_props_) max_props_.reset();
    if (order_ != JsonSchemaOptions::PropertyOrder::any && (min_props_ || max_props_ || !deps_.empty()))
      fail(ptr_, "minProperties/maxProperties/dependentRequired need property order 'any' (or to be implied by required)");
  }

  // A member m between NFA states from and to, after a ',' when with_sep. The members leaving one
  // state share its separator (one "after the comma" state per source), so a layout's NFA grows
  // with its states and members, not with a separator copy per edge (any order over ten tracked
  // properties: 50,000 NFA states before, 2,000 now).
  void edge(int32_t from, int32_t to, int32_t m, bool with_sep) {
    if (with_sep) {
      auto [it, fresh] = after_sep_.try_emplace(from, -1);
      if (fresh) {
        Frag c = sc_.sep(rule_, ',');
        gb_.frags(rule_).eps(from, c.in);
        it->second = c.out;
      }
      from = it->second;
    }
    gb_.nfa(rule_).out[size_t(from)].push_back({NfaEdge::Kind::call, 0, 0, m, to});
  }

  // Schema order: named properties in their order (optional ones may be skipped), additional
  // members anywhere after the named ones written so far.
  void layout_schema_order(int32_t open, int32_t close) {
    Nfa& nfa = gb_.nfa(rule_);
    int32_t first = open, more = nfa.add_state();
    for (size_t i = 0; i < named_.size(); ++i) {
      int32_t nf = nfa.add_state(), nm = nfa.add_state();
      edge(first, nm, named_rules_[i], false);
      edge(more, nm, named_rules_[i], true);
      if (!named_[i].required) {
        gb_.frags(rule_).eps(first, nf);
        gb_.frags(rule_).eps(more, nm);
      }
      first = nf;
      more = nm;
    }
    for (int32_t e : extras_) {
      edge(first, more, e, false);
      edge(more, more, e, true);
    }
    gb_.frags(rule_).eps(first, close);
    gb_.frags(rule_).eps(more, close);
  }

  // Any order: the state tracks which tracked properties (required or in dependentRequired) have
  // been written and, for min/maxProperties, how many members (capped).
  void layout_any_order(int32_t open, int32_t close) {
    std::vector<int> bit(named_.size(), -1);
    int nb = 0;
    size_t required_mask = 0;
    for (size_t i = 0; i < named_.size(); ++i) {
      bool tracked = named_[i].required || std::any_of(deps_.begin(), deps_.end(), [&](const auto& d) {
                       return d.first == named_[i].name ||
                              std::find(d.second.begin(), d.second.end(), named_[i].name) != d.second.end();
                     });
      if (!tracked) continue;
      if (named_[i].required) required_mask |= size_t(1) << nb;
      bit[i] = nb++;
    }
    if (nb > int(kMaxAnyOrderRequired) && deps_.empty() && !min_props_ && !max_props_)
      return layout_required_in_order(open, close);
    const uint64_t cap = max_props_ ? *max_props_ : min_props_ ? *min_props_ : 0;
    if (nb > int(kMaxAnyOrderRequired) || (size_t(1) << nb) * (cap + 1) > 8192)
      fail(ptr_, "too many required/dependent properties or too large min/maxProperties for property order 'any'");
    layout_tracked_sets(open, close, bit, nb, required_mask, cap);
  }

  // Too many required properties to track as a set: they must come in schema order relative to
  // each other (optional and additional ones anywhere). Never accepts a missing one.
  void layout_required_in_order(int32_t open, int32_t close) {
    Nfa& nfa = gb_.nfa(rule_);
    std::vector<size_t> req_idx;
    for (size_t i = 0; i < named_.size(); ++i)
      if (named_[i].required) req_idx.push_back(i);
    std::vector<int32_t> at(req_idx.size() + 1);
    for (auto& x : at) x = nfa.add_state();
    auto others = [&](int32_t from, int32_t to, bool with_sep) {
      for (size_t i = 0; i < named_.size(); ++i)
        if (!named_[i].required) edge(from, to, named_rules_[i], with_sep);
      for (int32_t e : extras_) edge(from, to, e, with_sep);
    };
    edge(open, at[1], named_rules_[req_idx[0]], false);
    others(open, at[0], false);
    for (size_t j = 0; j <= req_idx.size(); ++j) {
      others(at[j], at[j], true);
      if (j < req_idx.size()) edge(at[j], at[j + 1], named_rules_[req_idx[j]], true);
    }
    gb_.frags(rule_).eps(at.back(), close);
  }

  // One NFA state per (set of tracked properties written, members written up to cap).
  void layout_tracked_sets(int32_t open, int32_t close, const std::vector<int>& bit, int nb, size_t required_mask,
                           uint64_t cap) {
    Nfa& nfa = gb_.nfa(rule_);
    const size_t masks = size_t(1) << nb;
    auto idx = [&](size_t mask, uint64_t c) { return size_t(c) * masks + mask; };
    std::vector<int32_t> more(masks * size_t(cap + 1));
    for (auto& x : more) x = nfa.add_state();
    auto bit_of = [&](const std::string& name) {
      for (size_t i = 0; i < named_.size(); ++i)
        if (named_[i].name == name) return bit[i];
      return -1;
    };
    auto accepting = [&](size_t mask, uint64_t c) {
      if ((mask & required_mask) != required_mask) return false;
      if (min_props_ && c < *min_props_) return false;
      for (const auto& [a, bs] : deps_) {
        if (!(mask >> bit_of(a) & 1)) continue;
        for (const std::string& b : bs)
          if (!(mask >> bit_of(b) & 1)) return false;
      }
      return true;
    };
    auto next_count = [&](uint64_t c) -> std::optional<uint64_t> {
      if (max_props_) return c + 1 <= *max_props_ ? std::optional<uint64_t>(c + 1) : std::nullopt;
      return std::min<uint64_t>(c + 1, cap);
    };
    auto all_members = [&](int32_t from, size_t mask, uint64_t c, bool with_sep) {
      auto nc = next_count(c);
      if (!nc) return;
      for (size_t i = 0; i < named_.size(); ++i) {
        if (bit[i] >= 0 && (mask >> bit[i] & 1)) continue;
        size_t nm = bit[i] >= 0 ? (mask | (size_t(1) << bit[i])) : mask;
        edge(from, more[idx(nm, *nc)], named_rules_[i], with_sep);
      }
      for (int32_t e : extras_) edge(from, more[idx(mask, *nc)], e, with_sep);
    };
    all_members(open, 0, 0, false);
    if (accepting(0, 0)) gb_.frags(rule_).eps(open, close);
    for (uint64_t c = 0; c <= cap; ++c)
      for (size_t mask = 0; mask < masks; ++mask) {
        all_members(more[idx(mask, c)], mask, c, true);
        if (accepting(mask, c)) gb_.frags(rule_).eps(more[idx(mask, c)], close);
      }
  }

  SchemaCompiler& sc_;
  GrammarBuilder& gb_;
  const int32_t rule_;
  const Json& n_;
  const std::string& ptr_;
  const int depth_;
  const JsonSchemaOptions::PropertyOrder order_;
  std::vector<std::string> required_;
  std::vector<Named> named_;  // properties, then required and dependentRequired names not listed there
  std::vector<Pat> pats_;
  std::vector<std::pair<std::string, std::vector<std::string>>> deps_;
  Json addl_;
  std::optional<Rule> names_ok_;  // propertyNames
  std::vector<int32_t> named_rules_;  // member rule of named_[i]
  std::vector<int32_t> extras_;       // member rules of pattern regions and additional keys
  std::optional<uint64_t> min_props_, max_props_;
  std::unordered_map<int32_t, int32_t> after_sep_;  // layout NFA state -> its state after ','
};

}  // namespace

Frag SchemaCompiler::object_frag(int32_t rule, const Json& n, const std::string& ptr, int depth) {
  return ObjectFragCompiler(*this, rule, n, ptr, depth, opts_.property_order).run();
}

}  // namespace exl::json_schema_detail
