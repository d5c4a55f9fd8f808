// JSON Schema -> Grammar. The grammar accepts exactly the JSON texts (in the chosen whitespace and
// property-order style) whose values the schema validates, for the supported keywords; a schema
// using anything else is a GrammarError naming the keyword and its JSON pointer
// ("grammar: json_schema: /properties/a: unsupported keyword 'not'"), never silently ignored.
//
// Supported: type (string or array), enum, const, properties, required, additionalProperties,
// patternProperties (pairwise disjoint patterns), items (schema, false, or draft-07 array form
// with additionalItems), prefixItems, minItems/maxItems, minLength/maxLength, pattern (search
// semantics, combined with lengths and formats by automaton intersection), format (the 2020-12
// list but 'regex', which is refused; a format name the spec does not define is an annotation, as
// 2020-12 says; each format accepts only what its RFC's grammar accepts: uri, uri-reference, iri,
// iri-reference, uri-template, date, date-time, time, duration, ipv4, ipv6, uuid, json-pointer and
// relative-json-pointer exactly, but for leap seconds only at 23:59:60 with a zero offset and no
// year 0000; hostname without A-labels ("--" in the 3rd and 4th position) or an all-numeric last
// label, and with a label-count-by-length subset of the 253-character limit (3 labels of up to 63
// characters, 4 of 62, 8 of 30, 16 of 14, 32 of 6; the same rule under a maxLength above 64,
// an exact count below); email as a dot-atom local part of up to 64 characters, '@', such a host
// name within 189 characters; idn-hostname and idn-email as their ASCII forms; beside other string
// keywords, URIs and IRIs leave out IP-literal hosts), minimum/maximum/exclusiveMinimum/
// exclusiveMaximum (exact; a bounded number is written without an exponent), anyOf, oneOf (each branch made exclusive:
// provably disjoint from the others, or conjoined with their complement when that is expressible
// — json_schema_oneof.cpp), not (type exclusions, required keys, property types, string lengths,
// patterns and formats (as automaton differences), number bounds, array sizes, prefixItems (and
// items false), integers (as the
// numbers with a non-zero fraction and no exponent: a subset of the non-integers), anyOf and
// oneOf (none of the branches, or two at once), "additionalProperties": false (as "one of the object's own keys
// outside the list", so only where a closed object takes it in), enums of
// strings/booleans/null/numbers (numbers as the open intervals around the listed ones)),
// if/then/else (as (if and then) or (not if and else), so 'if' must be negatable as for 'not';
// 'if' without then/else constrains nothing; a negation's property and item constraints do not
// count as evaluating them for unevaluatedProperties/unevaluatedItems), dependentSchemas / schema-valued
// dependencies, contains with minContains/maxContains (maxContains needs 'contains' negatable),
// allOf (merged; several multipleOf all apply), $ref and $dynamicRef: local JSON pointers and
// anchors, and every URI reference resolved per RFC 3986 against the base URI that $id sets
// (embedded resources, their $anchor/$dynamicAnchor, draft-07 "$id": "#name"), documents of
// JsonSchemaOptions::schema_store (a reference to any other document is an error naming its URI),
// $dynamicRef bound to the outermost $dynamicAnchor of the dynamic scope
// (json_schema_ref.cpp), including recursion; a $ref with a sibling $id that draft 7 and 2019-09+
// would resolve apart is refused unless $schema names the draft, nullable (OpenAPI),
// minProperties/maxProperties when implied by required/closed objects, uniqueItems (false; true
// over items of at most 12 enumerated values: enum, const, boolean, null; uniqueness of
// unbounded values is no grammar's), multipleOf (decimal, not too fine-grained), const/enum
// compared as values (1.0 = 1 when integer_zero_fraction; object members in any order under
// property order "any").
// Annotations are ignored: $schema $id id $comment title description default examples example
// readOnly writeOnly deprecated $defs definitions $anchor contentMediaType contentEncoding
// contentSchema and keys starting with "x-".
//
// Output text: compact (no whitespace), spaced (exactly ", " and ": " between items and after keys,
// no other whitespace: what Python's json.dumps writes by default, and what models trained on it
// expect) or flexible ([ \t\n\r]* between tokens, none around the top-level value); strings use the escapes a compact serializer writes (\" \\ \b \f \n \r \t,
// \u00XX for other controls, everything else raw UTF-8). Properties in schema order (named
// properties first, in schema order; then additional/pattern properties) or in any order
// (required properties tracked as a set, at most 12 per object; with more, the required ones
// must keep their schema order among themselves — never accepting a missing one).
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/grammar_budget.h"

namespace exl {

struct JsonSchemaOptions {
  enum class Whitespace { compact, spaced, flexible };
  enum class PropertyOrder { schema, any };
  Whitespace whitespace = Whitespace::compact;
  PropertyOrder property_order = PropertyOrder::schema;
  // Lenient mode: keywords listed here are ignored wherever they appear ("format" ignores every
  // format, "uniqueItems" every uniqueItems, ...).
  std::vector<std::string> ignore_keywords;
  // Lenient mode: keywords that are no validation keyword of any JSON Schema draft ("self",
  // "javaType", typos) are treated as annotations, as validators do, instead of being errors.
  // Known validation keywords that are not supported stay errors.
  bool ignore_unknown_keywords = false;
  // Checking instances: integers may be written with a zero fraction (1.0), which JSON Schema
  // counts as integers from draft-06 on. Off for generation, so integers come out canonical
  // (parsers read 1.0 as a float).
  bool integer_zero_fraction = false;
  // Documents that references may name by absolute URI (without fragment), as if retrieved from
  // there; nothing is ever fetched, and a reference to any other document is an error naming it.
  std::map<std::string, nlohmann::ordered_json> schema_store;
  // What the compilation may spend (grammar/grammar_budget.h); a budget already active on the
  // calling thread (the server's, per request) takes precedence.
  GrammarBudget budget;
};

// The options that shape the grammar (all but the budget) as a canonical text: the options part
// of a compiled grammar's cache key (grammar/grammar_cache.h).
std::string json_schema_options_key(const JsonSchemaOptions& opts);

// Throws GrammarError (GrammarBudgetError / GrammarCancelled when the budget stops it).
Grammar compile_json_schema(const nlohmann::ordered_json& schema, const JsonSchemaOptions& opts = {});
// Parses `schema_text` (keeping property order) then compiles it.
Grammar compile_json_schema_text(std::string_view schema_text, const JsonSchemaOptions& opts = {});

}  // namespace exl
