// Internals of the JSON Schema compiler, shared by json_schema.cpp (dispatch, combinators,
// objects, arrays) and json_schema_leaf.cpp (numbers, strings, formats).
#pragma once
#include <map>
#include <optional>
#include <vector>
#include <string>

#include "grammar/json_schema.h"

namespace exl::json_schema_detail {

using Json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& ptr, const std::string& what);

// Integers wide enough for bounds up to about 1e37; a bound on one (nullopt = unbounded).
using Int = __int128;
using IntBound = std::optional<Int>;

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& opts) : root_(root), opts_(opts) {}
  Grammar run();

  // rule id whose language is the schema's JSON texts
  int32_t value_rule(const Json& s, const std::string& ptr, int depth = 0);

  // json_schema_leaf.cpp
  Frag integer_frag(int32_t rule, const Json& s, const std::string& ptr);
  Frag number_frag(int32_t rule, const Json& s, const std::string& ptr);
  Frag integral_number_frag(int32_t rule, const Json& s, const std::string& ptr);
  Frag decimal_bound(int32_t rule, const Json& bound, bool lower, bool strict, const std::string& ptr);
  Frag fraction_cmp(int32_t rule, const std::string& f, bool greater, bool strict);
  Frag string_frag(int32_t rule, const Json& s, const std::string& ptr);
  Frag int_range(int32_t rule, IntBound lo, IntBound hi);
  // A byte-only DFA for string contents (between the quotes) satisfying the string keywords.
  Rule string_content_dfa(const Json& s, const std::string& ptr, bool& trivial);
  Rule key_pattern_dfa(const std::string& pattern, const std::string& ptr);
  static Rule literal_set_dfa(const std::vector<std::string>& literals);
  static Rule length_dfa(uint64_t min, uint64_t max);
  // Decimal numbers (optional '-', digits, optional fraction, no exponent) that are multiples of m.
  static Rule multiple_of_dfa(const Json& m, const std::string& ptr);

  // shared rules
  int32_t any_value_rule();
  int32_t any_string_rule();
  int32_t json_char_rule();
  Frag ws(int32_t rule);
  Frag sep(int32_t rule, char c);  // ws c ws

  GrammarBuilder gb_;
  bool ignored(const std::string& kw) const;
  // The root's $schema names draft-04 or earlier.
  bool old_draft() const;
  bool is_annotation(const std::string& kw) const;

 private:
  friend struct Impl;
  const Json& root_;
  JsonSchemaOptions opts_;
  std::map<std::string, int32_t> ref_rules_;
  int32_t any_value_ = -1, any_string_ = -1, json_char_ = -1;
  // String rules by their string keywords (as JSON text): one prebuilt automaton per distinct
  // constraint, however many properties share it.
  std::map<std::string, int32_t> string_rules_;
  int counter_ = 0;

 public:
  std::string fresh(const std::string& base) { return base + "#" + std::to_string(counter_++); }
  const Json& resolve_ref(const std::string& ref, const std::string& ptr, std::string& target_ptr) const;
  int32_t ref_rule(const std::string& target_ptr, const Json& target, int depth);
  void compile_into(int32_t rule, const Json& s, const std::string& ptr, int depth);
  Json normalize(const Json& s, const std::string& ptr, int depth);
  Json merge(const Json& a, const Json& b, const std::string& ptr, int depth);
  void check_keywords(const Json& s, const std::string& ptr) const;
  Frag typed_frag(int32_t rule, const Json& s, const std::string& ptr, int depth);
  Frag array_frag(int32_t rule, const Json& s, const std::string& ptr, int depth);
  // uniqueItems: true over items of few enumerated values (the set of values used is the state).
  Frag unique_array_frag(int32_t rule, const Json& s, const std::string& ptr, int depth);
  Frag contains_frag(int32_t rule, const Json& n, const std::string& ptr, int depth, const Json& tail, uint64_t min,
                     uint64_t max, uint64_t m, uint64_t mc);
  Frag object_frag(int32_t rule, const Json& s, const std::string& ptr, int depth);
  Frag enum_frag(int32_t rule, const Json& s, const std::string& ptr);
  // One JSON value, in the output style: numbers equal to it (an integral float as its integer,
  // with a zero fraction when integer_zero_fraction), members in any order when the property
  // order is "any".
  Frag value_frag(int32_t rule, const Json& v, const std::string& ptr);
  Frag repeat_frag(int32_t rule, int32_t body_rule, uint32_t min, uint32_t max);
  // json_schema_oneof.cpp
  bool provably_disjoint(const Json& a, const Json& b, int depth);
  bool objects_disjoint(const Json& a, const Json& b, int depth);
  std::optional<Json> value_list(const Json& s, int depth) const;
  std::optional<std::vector<Json>> negate(const Json& s, int depth);
  Json without_evaluation(const Json& s, int depth);
  std::vector<Json> exclusive_branches(const Json& base, const std::vector<Json>& branches, const std::string& ptr);
};

// Internal keyword (never in user schemas' meaning): a list of strings the value must not equal.
inline constexpr char kNotEnum[] = "$exl_notEnum";
// Internal keyword: a list of schemas of string keywords (pattern, format) the string must not
// satisfy (the negation of patterns and formats, as automaton differences).
inline constexpr char kNotString[] = "$exl_notString";
// Internal keyword: the number is not an integer (written with a fraction that has a non-zero
// digit and no exponent: a subset of the non-integers, as a negation of "integer" needs).
inline constexpr char kFractional[] = "$exl_fractional";
// Internal keyword: a list of key lists; for each, the object has some key outside it (the
// negation of "additionalProperties": false). Compiled only inside a closed object, where it is
// "one of its own keys outside the list is present".
inline constexpr char kHasKeyOutside[] = "$exl_hasKeyOutside";
// Internal keyword: property schemas from a negation ('not', if/then/else, oneOf exclusivity): a
// property present must satisfy its schema, but the negation does not evaluate it (for
// unevaluatedProperties, what else names the property, or additionalProperties, still applies).
inline constexpr char kNegated[] = "$exl_negated";
// Internal keyword: item schemas by position ({"1": schema}) from a negation: an item at that
// index must satisfy its schema, but the negation does not evaluate it (for unevaluatedItems,
// prefixItems or items still apply).
inline constexpr char kNegatedItems[] = "$exl_negatedItems";
// Internal keyword: the schema is part of a negation (two oneOf branches at once) but evaluates
// properties or items, which a failed oneOf does not: refused beside unevaluatedProperties/Items.
inline constexpr char kEvaluates[] = "$exl_negationEvaluates";

// Internal keyword, at the root of a rewritten document (resolve_references): the copies of the
// schema resources its references reach, other than the document itself.
inline constexpr char kResources[] = "$exl_resources";

// A document whose references need base URIs ($id), anchors of embedded resources, the schema
// store or dynamic scopes ($dynamicRef), rewritten into one whose every $ref is a JSON pointer
// into itself (json_schema_ref.cpp); nullopt when the document needs no rewriting. Throws
// GrammarError naming a reference that resolves nowhere.
std::optional<Json> resolve_references(const Json& root, const JsonSchemaOptions& opts);

// Whether a format name is one JSON Schema defines (enforced, or refused when not implemented);
// other names are annotations.
bool format_asserted(const std::string& format);

std::string pointer_append(const std::string& ptr, const std::string& token);

}  // namespace exl::json_schema_detail
