// Keywords beyond the basic set: oneOf made exclusive, unknown formats, schema dependencies,
// non-integer number bounds. Every check is an instance the JSON Schema spec accepts or rejects.
#include <gtest/gtest.h>

#include "grammar/grammar_error.h"
#include "grammar_test_util.h"

namespace exl {
namespace json_schema_coverage_test {

using test::any_order;
using test::schema_accepts;

bool compiles(const std::string& schema) {
  try {
    compile_json_schema_text(schema, any_order());
    return true;
  } catch (const GrammarError&) {
    return false;
  }
}

bool ok(const std::string& schema, const std::string& text) { return schema_accepts(schema, text, any_order()); }

TEST(GrammarJsonSchemaCoverage, UnknownFormatsAreAnnotations) {
  EXPECT_TRUE(ok(R"({"type":"string","format":"non-blank"})", R"("")"));
  EXPECT_TRUE(ok(R"({"type":"string","format":"binary","maxLength":2})", R"("ab")"));
  EXPECT_FALSE(ok(R"({"type":"string","format":"binary","maxLength":2})", R"("abc")"));
  EXPECT_FALSE(ok(R"({"type":"string","format":"url"})", "3"));
  EXPECT_TRUE(ok(R"({"enum":["a","b"],"format":"strict-uri"})", R"("b")"));
  EXPECT_FALSE(ok(R"({"type":"string","format":"date"})", R"("2024-13-01")"));
  EXPECT_FALSE(compiles(R"({"type":"string","format":"regex"})"));
}

TEST(GrammarJsonSchemaCoverage, OneOfRequiredSetsAreExclusive) {
  const std::string s = R"({"type":"object","properties":{"r":{"type":"number"},"l":{"type":"number"},"w":{"type":"number"}},
    "oneOf":[{"required":["r"]},{"required":["l","w"]}]})";
  EXPECT_TRUE(ok(s, R"({"r":1})"));
  EXPECT_TRUE(ok(s, R"({"l":1,"w":2})"));
  EXPECT_TRUE(ok(s, R"({"r":1,"l":2})"));
  EXPECT_FALSE(ok(s, R"({"r":1,"l":2,"w":3})"));
  EXPECT_FALSE(ok(s, R"({"w":3,"l":2,"r":1})"));
  EXPECT_FALSE(ok(s, R"({"l":2})"));
  EXPECT_FALSE(ok(s, "{}"));
}

TEST(GrammarJsonSchemaCoverage, OneOfBranchPropertiesAreNegated) {
  // branch 0 matches {"a":true,"b":"x"}; branch 1 needs b to be a number
  const std::string s = R"({"oneOf":[{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]},
    {"type":"object","properties":{"b":{"type":"number"}},"required":["b"]}]})";
  EXPECT_TRUE(ok(s, R"({"a":true,"b":"x"})"));
  EXPECT_TRUE(ok(s, R"({"a":"x","b":1})"));
  EXPECT_TRUE(ok(s, R"({"a":false})"));
  EXPECT_FALSE(ok(s, R"({"a":true,"b":2})"));
  EXPECT_FALSE(ok(s, R"({"a":"x","b":"y"})"));
  EXPECT_FALSE(ok(s, "1"));
  // identical branches: nothing matches exactly one
  EXPECT_FALSE(ok(R"({"oneOf":[{"type":"string"},{"type":"string","x-format":"uri"}]})", R"("a")"));
  // strings by length
  const std::string len = R"({"type":"string","oneOf":[{"minLength":2},{"maxLength":3}]})";
  EXPECT_TRUE(ok(len, R"("a")"));
  EXPECT_FALSE(ok(len, R"("ab")"));
  EXPECT_FALSE(ok(len, R"("abc")"));
  EXPECT_TRUE(ok(len, R"("abcd")"));
}

TEST(GrammarJsonSchemaCoverage, OneOfDisjointByValuesOrObjects) {
  EXPECT_TRUE(ok(R"({"oneOf":[{"type":"null"},{"enum":["GET","POST"]}]})", "null"));
  EXPECT_TRUE(ok(R"({"oneOf":[{"type":"null"},{"enum":["GET","POST"]}]})", R"("GET")"));
  // a number in the enum: the other branch excludes it as the numbers around it
  const std::string num = R"({"oneOf":[{"type":"string"},{"enum":["GET",1]}]})";
  EXPECT_TRUE(ok(num, R"("POST")"));
  EXPECT_TRUE(ok(num, "1"));
  EXPECT_FALSE(ok(num, R"("GET")"));
  EXPECT_FALSE(ok(num, "2"));
  // discriminated objects without a type: non-objects match both branches, so they are refused
  const std::string d = R"({"oneOf":[{"properties":{"k":{"const":"a"}},"required":["k"]},
    {"properties":{"k":{"const":"b"},"n":{"type":"integer"}},"required":["k"]}]})";
  EXPECT_TRUE(ok(d, R"({"k":"a","n":"x"})"));
  EXPECT_TRUE(ok(d, R"({"k":"b","n":1})"));
  EXPECT_FALSE(ok(d, R"({"k":"c"})"));
  EXPECT_FALSE(ok(d, R"("text")"));
  EXPECT_FALSE(ok(d, "3"));
  // a base property merged with a branch const still discriminates
  const std::string m = R"({"type":"object","properties":{"k":{"type":"string"}},"required":["k"],
    "oneOf":[{"properties":{"k":{"const":"a"}}},{"properties":{"k":{"const":"b"}}}]})";
  EXPECT_TRUE(ok(m, R"({"k":"b"})"));
  EXPECT_FALSE(ok(m, R"({"k":"c"})"));
}

TEST(GrammarJsonSchemaCoverage, NonIntegerNumberBoundsAreExact) {
  const std::string s = R"({"type":"number","minimum":0.5,"exclusiveMaximum":2.25})";
  for (const char* v : {"0.5", "0.50", "0.51", "0.6", "1", "1.0", "2", "2.2", "2.24999", "0.5000001"}) EXPECT_TRUE(ok(s, v)) << v;
  for (const char* v : {"0.49", "0.4999", "0", "-1", "2.25", "2.250", "2.26", "3", "0.05", "-0.5"}) EXPECT_FALSE(ok(s, v)) << v;
  const std::string neg = R"({"type":"number","exclusiveMinimum":-1.5,"maximum":-0.25})";
  for (const char* v : {"-1.49", "-1", "-0.25", "-0.250", "-0.3"}) EXPECT_TRUE(ok(neg, v)) << v;
  for (const char* v : {"-1.5", "-1.50", "-2", "-0.24", "0", "-0.2", "1"}) EXPECT_FALSE(ok(neg, v)) << v;
  const std::string tiny = R"({"type":"number","minimum":1e-3,"maximum":100})";
  for (const char* v : {"0.001", "0.01", "100", "99.9"}) EXPECT_TRUE(ok(tiny, v)) << v;
  for (const char* v : {"0.0009", "0", "100.1", "-0.001"}) EXPECT_FALSE(ok(tiny, v)) << v;
  // draft-04 boolean exclusiveMaximum applies to a non-integer maximum
  EXPECT_FALSE(ok(R"({"type":"number","maximum":1.5,"exclusiveMaximum":true})", "1.5"));
  EXPECT_TRUE(ok(R"({"type":"number","maximum":1.5,"exclusiveMaximum":true})", "1.49"));
  // integers under non-integer bounds
  EXPECT_TRUE(ok(R"({"type":"integer","minimum":0.5})", "1"));
  EXPECT_FALSE(ok(R"({"type":"integer","minimum":0.5})", "0"));
}

TEST(GrammarJsonSchemaCoverage, SchemaDependencies) {
  const std::string s = R"({"type":"object","properties":{"shape":{"type":"string"},"r":{"type":"number"}},
    "dependencies":{"shape":{"required":["r"]},"r":["shape"]}})";
  EXPECT_TRUE(ok(s, "{}"));
  EXPECT_TRUE(ok(s, R"({"shape":"c","r":1})"));
  EXPECT_FALSE(ok(s, R"({"shape":"c"})"));
  EXPECT_FALSE(ok(s, R"({"r":1})"));
  const std::string d = R"({"dependentSchemas":{"a":{"properties":{"b":{"type":"integer"}}}}})";
  EXPECT_TRUE(ok(d, R"({"b":"x"})"));
  EXPECT_TRUE(ok(d, R"({"a":1,"b":2})"));
  EXPECT_FALSE(ok(d, R"({"a":1,"b":"x"})"));
  EXPECT_TRUE(ok(d, "[1]"));
}

TEST(GrammarJsonSchemaCoverage, NotOfRequiredEnumAndProperties) {
  const std::string r = R"({"type":"object","not":{"required":["a","b"]}})";
  EXPECT_TRUE(ok(r, R"({"a":1})"));
  EXPECT_TRUE(ok(r, "{}"));
  EXPECT_FALSE(ok(r, R"({"b":1,"a":2})"));
  const std::string e = R"({"type":"string","not":{"enum":["test","src"]}})";
  EXPECT_TRUE(ok(e, R"("tes")"));
  EXPECT_TRUE(ok(e, R"("tests")"));
  EXPECT_FALSE(ok(e, R"("test")"));
  EXPECT_FALSE(ok(e, R"("src")"));
  const std::string mixed = R"({"not":{"enum":["a",null,true]}})";
  EXPECT_TRUE(ok(mixed, "false"));
  EXPECT_TRUE(ok(mixed, "1.5"));
  EXPECT_TRUE(ok(mixed, R"("b")"));
  EXPECT_TRUE(ok(mixed, "[]"));
  EXPECT_FALSE(ok(mixed, "true"));
  EXPECT_FALSE(ok(mixed, "null"));
  EXPECT_FALSE(ok(mixed, R"("a")"));
  EXPECT_TRUE(ok(R"({"enum":["x","y"],"not":{"enum":["y"]}})", R"("x")"));
  EXPECT_FALSE(ok(R"({"enum":["x","y"],"not":{"enum":["y"]}})", R"("y")"));
  const std::string p = R"({"not":{"properties":{"k":{"type":"string","maxLength":2}}}})";
  EXPECT_TRUE(ok(p, R"({"k":"abc"})"));
  EXPECT_TRUE(ok(p, R"({"k":1})"));
  EXPECT_FALSE(ok(p, R"({"k":"ab"})"));
  EXPECT_FALSE(ok(p, "{}"));
  EXPECT_FALSE(ok(p, "2"));
  // numbers: the open intervals around and between the listed ones
  const std::string n = R"({"not":{"enum":[1,"a",2.5]}})";
  EXPECT_TRUE(ok(n, "0"));
  EXPECT_TRUE(ok(n, "1.5"));
  EXPECT_TRUE(ok(n, "3"));
  EXPECT_TRUE(ok(n, R"("b")"));
  EXPECT_FALSE(ok(n, "1"));
  EXPECT_FALSE(ok(n, "1.0"));
  EXPECT_FALSE(ok(n, "2.5"));
  EXPECT_FALSE(ok(n, "2.50"));
  EXPECT_FALSE(ok(n, R"("a")"));
  EXPECT_FALSE(compiles(R"({"not":{"enum":[[1]]}})"));
}

TEST(GrammarJsonSchemaCoverage, LeapSecondsOnlyAt2359Utc) {
  const std::string t = R"({"type":"string","format":"time"})";
  EXPECT_TRUE(ok(t, R"("23:59:60Z")"));
  EXPECT_TRUE(ok(t, R"("23:59:60.5+00:00")"));
  EXPECT_TRUE(ok(t, R"("12:34:59-08:00")"));
  for (const char* bad : {R"("22:59:60Z")", R"("23:58:60Z")", R"("23:59:60+01:00")", R"("23:59:60-00:30")", R"("00:60:00Z")",
                          R"("01:02:03+00:60")"})
    EXPECT_FALSE(ok(t, bad)) << bad;
  EXPECT_TRUE(ok(R"({"type":"string","format":"date-time"})", R"("2016-12-31T23:59:60Z")"));
  EXPECT_FALSE(ok(R"({"type":"string","format":"date-time"})", R"("2016-12-31T12:00:60Z")"));
}

TEST(GrammarJsonSchemaCoverage, IntegersMayHaveZeroFractions) {
  const std::string s = R"({"type":"integer","minimum":1,"maximum":3})";
  EXPECT_TRUE(ok(s, "1.0"));
  EXPECT_TRUE(ok(s, "3.00"));
  EXPECT_FALSE(ok(s, "1.5"));
  EXPECT_FALSE(ok(s, "0.0"));
  EXPECT_FALSE(ok(s, "4.0"));
  EXPECT_FALSE(ok(s, "2."));
  EXPECT_TRUE(ok(R"({"type":"integer","multipleOf":2})", "4.0"));
  EXPECT_FALSE(ok(R"({"type":"integer","multipleOf":2})", "3.0"));
  // draft-04: an integer has no fraction part
  EXPECT_FALSE(ok(R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"integer"})", "1.0"));
  EXPECT_TRUE(ok(R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"integer"})", "1"));
  // Generation writes integers canonically (parsers read 1.0 as a float).
  EXPECT_TRUE(schema_accepts(s, "2", JsonSchemaOptions{}));
  EXPECT_FALSE(schema_accepts(s, "2.0", JsonSchemaOptions{}));
}

// if/then/else as (if and then) or (not if and else), JSON-Schema-Test-Suite style instances.
TEST(GrammarJsonSchemaCoverage, IfThenElse) {
  const std::string s = R"({"if":{"properties":{"kind":{"const":"a"}},"required":["kind"]},)"
                        R"("then":{"required":["x"]},"else":{"required":["y"]}})";
  EXPECT_TRUE(ok(s, R"({"kind":"a","x":1})"));
  EXPECT_FALSE(ok(s, R"({"kind":"a","y":1})"));
  EXPECT_TRUE(ok(s, R"({"kind":"b","y":1})"));
  EXPECT_FALSE(ok(s, R"({"kind":"b","x":1})"));
  EXPECT_TRUE(ok(s, R"({"y":1})"));
  EXPECT_FALSE(ok(s, R"({"x":1})"));
  EXPECT_TRUE(ok(s, "3"));  // not an object: 'if' holds (no keyword applies), 'then' holds too
  const std::string num = R"({"if":{"exclusiveMaximum":0},"then":{"minimum":-10},"else":{"multipleOf":1}})";
  EXPECT_TRUE(ok(num, "-1"));
  EXPECT_FALSE(ok(num, "-100"));
  EXPECT_TRUE(ok(num, "3"));
  EXPECT_FALSE(ok(num, "3.5"));
  EXPECT_TRUE(ok(R"({"then":{"type":"string"}})", "1"));  // then without if: no effect
  EXPECT_TRUE(ok(R"({"if":true,"then":{"type":"string"},"else":false})", R"("a")"));
  EXPECT_FALSE(ok(R"({"if":false,"then":true,"else":{"type":"string"}})", "1"));
  EXPECT_FALSE(compiles(R"({"if":{"multipleOf":2},"then":{"minimum":1}})"));  // no negation of multipleOf
  const std::string pat = R"({"if":{"pattern":"^a"},"then":{"maxLength":2},"else":{"minLength":3}})";
  EXPECT_TRUE(ok(pat, R"("ab")"));
  EXPECT_FALSE(ok(pat, R"("abc")"));
  EXPECT_TRUE(ok(pat, R"("bcd")"));
  EXPECT_FALSE(ok(pat, R"("bc")"));
  // annotations of a failed 'if' do not count as evaluated: its negation constrains 'a' without
  // evaluating it
  const std::string unev = R"({"if":{"properties":{"a":{"const":1}}},"else":{"required":["b"]},)"
                           R"("unevaluatedProperties":false})";
  EXPECT_TRUE(ok(unev, R"({"a":1})"));
  EXPECT_TRUE(ok(unev, "{}"));
  EXPECT_FALSE(ok(unev, R"({"a":2,"b":0})"));
  EXPECT_FALSE(ok(unev, R"({"b":0})"));
  EXPECT_FALSE(ok(unev, R"({"a":1,"b":0})"));
  // evaluated elsewhere, the property is allowed under the negation's constraint
  const std::string named = R"({"properties":{"a":true,"b":true},"if":{"properties":{"a":{"const":1}}},)"
                            R"("else":{"required":["b"]},"unevaluatedProperties":false})";
  EXPECT_TRUE(ok(named, R"({"a":2,"b":0})"));
  EXPECT_FALSE(ok(named, R"({"a":2})"));
}

TEST(GrammarJsonSchemaCoverage, NotOfBoundsAndSizes) {
  EXPECT_TRUE(ok(R"({"not":{"minimum":1}})", "0.5"));
  EXPECT_FALSE(ok(R"({"not":{"minimum":1}})", "1"));
  EXPECT_FALSE(ok(R"({"not":{"minimum":1}})", R"("x")"));  // strings satisfy minimum
  EXPECT_TRUE(ok(R"({"not":{"exclusiveMaximum":1}})", "1"));
  EXPECT_FALSE(ok(R"({"not":{"exclusiveMaximum":1}})", "0"));
  EXPECT_TRUE(ok(R"({"not":{"type":"array","minItems":2}})", "[1]"));
  EXPECT_FALSE(ok(R"({"not":{"type":"array","minItems":2}})", "[1,2]"));
  EXPECT_TRUE(ok(R"({"not":{"type":"array","minItems":2}})", "{}"));
  EXPECT_TRUE(ok(R"({"not":{"maxItems":1}})", "[1,2]"));
  EXPECT_FALSE(ok(R"({"not":{"maxItems":1}})", "[1]"));
}

// Patterns and formats are negated as automaton differences: 'not', and oneOf branches whose
// patterns overlap made exclusive exactly.
TEST(GrammarJsonSchemaCoverage, NotAndOneOfOfPatternsAndFormats) {
  EXPECT_TRUE(ok(R"({"not":{"pattern":"^x"}})", R"("ax")"));
  EXPECT_FALSE(ok(R"({"not":{"pattern":"^x"}})", R"("xa")"));
  EXPECT_FALSE(ok(R"({"not":{"pattern":"^x"}})", "1"));  // a number satisfies any pattern
  EXPECT_FALSE(ok(R"({"type":"string","not":{"format":"date"}})", R"("2024-01-31")"));
  EXPECT_TRUE(ok(R"({"type":"string","not":{"format":"date"}})", R"("2024-02-31")"));
  const std::string one = R"({"oneOf":[{"type":"string","pattern":"customer"},{"type":"string","pattern":"admin"}]})";
  EXPECT_TRUE(ok(one, R"("a customer")"));
  EXPECT_TRUE(ok(one, R"("admin x")"));
  EXPECT_FALSE(ok(one, R"("customer admin")"));  // both branches: not exactly one
  EXPECT_FALSE(ok(one, R"("guest")"));
  const std::string id = R"({"oneOf":[{"type":"string","pattern":"^[A-Fa-f0-9]{4}$"},{"type":"string"}]})";
  EXPECT_TRUE(ok(id, R"("xyz")"));
  EXPECT_FALSE(ok(id, R"("beef")"));
  EXPECT_TRUE(ok(R"({"oneOf":[{"format":"uri"},{"format":"hostname"}]})", R"("example.com")"));
  EXPECT_TRUE(ok(R"({"oneOf":[{"format":"uri"},{"format":"hostname"}]})", R"("http://example.com")"));
}

// The negation of "integer" is the numbers written with a non-zero fraction (a subset of the
// non-integers: 2.0 is an integer, 1.5e1 is never produced); anyOf and disjoint oneOf negate as
// the conjunction of their branches' negations.
TEST(GrammarJsonSchemaCoverage, NegatedIntegersAndCombinators) {
  const std::string one = R"({"oneOf":[{"type":"integer"},{"minimum":2}]})";
  EXPECT_TRUE(ok(one, "1"));
  EXPECT_FALSE(ok(one, "3"));    // both branches
  EXPECT_FALSE(ok(one, "2.0"));  // an integer too
  EXPECT_TRUE(ok(one, "2.5"));
  EXPECT_FALSE(ok(one, "1.5"));  // neither
  EXPECT_TRUE(ok(one, R"("x")"));
  const std::string types = R"({"oneOf":[{"type":"integer"},{"type":"number"},{"type":"string"}]})";
  EXPECT_TRUE(ok(types, "0.25"));
  EXPECT_FALSE(ok(types, "7"));
  const std::string dims = R"({"type":"object","oneOf":[{"not":{"required":["r"]},"required":["w","h"]},)"
                           R"({"not":{"required":["w","h"]},"required":["r"]}]})";
  EXPECT_TRUE(ok(dims, R"({"w":1,"h":2})"));
  EXPECT_TRUE(ok(dims, R"({"r":1})"));
  EXPECT_TRUE(ok(dims, R"({"r":1,"w":2})"));
  EXPECT_FALSE(ok(dims, R"({"r":1,"w":2,"h":3})"));
  EXPECT_FALSE(ok(dims, R"({"w":2})"));
  EXPECT_FALSE(ok(R"({"not":{"anyOf":[{"type":"string"},{"minimum":3}]}})", "4"));
  EXPECT_TRUE(ok(R"({"not":{"anyOf":[{"type":"string"},{"minimum":3}]}})", "2"));
  EXPECT_FALSE(ok(R"({"not":{"anyOf":[{"type":"string"},{"minimum":3}]}})", R"("a")"));
}

// uniqueItems over enumerated items: the automaton's state is the set of values used so far.
TEST(GrammarJsonSchemaCoverage, UniqueItemsOfEnumeratedValues) {
  const std::string tags = R"({"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true,"minItems":1})";
  EXPECT_TRUE(ok(tags, R"(["c","a"])"));
  EXPECT_TRUE(ok(tags, R"(["a","b","c"])"));
  EXPECT_FALSE(ok(tags, R"(["a","b","a"])"));
  EXPECT_FALSE(ok(tags, R"([])"));
  EXPECT_FALSE(ok(tags, R"(["d"])"));
  const std::string bools = R"({"prefixItems":[{"type":"boolean"},{"type":"boolean"}],"uniqueItems":true,"items":false})";
  EXPECT_TRUE(ok(bools, "[false,true]"));
  EXPECT_FALSE(ok(bools, "[true,true]"));
  EXPECT_TRUE(ok(bools, "[true]"));
  EXPECT_FALSE(ok(bools, "[true,false,null]"));
  EXPECT_TRUE(ok(R"({"items":{"enum":[1,2]},"uniqueItems":true,"maxItems":1})", "[2]"));
  EXPECT_FALSE(ok(R"({"items":{"enum":[1,2]},"uniqueItems":true,"maxItems":1})", "[1,2]"));
  EXPECT_TRUE(ok(R"({"items":{"enum":[1,2]},"uniqueItems":true})", R"("not an array")"));
  EXPECT_FALSE(compiles(R"({"items":{"type":"string"},"uniqueItems":true})"));  // not enumerable
}

// "$ref": "#name" finds the one schema with "$anchor": name (or the older "$id": "#name").
TEST(GrammarJsonSchemaCoverage, RefsToAnchors) {
  const std::string s = R"({"properties":{"a":{"$ref":"#pos"}},"$defs":{"p":{"$anchor":"pos","minimum":0}}})";
  EXPECT_TRUE(ok(s, R"({"a":1})"));
  EXPECT_FALSE(ok(s, R"({"a":-1})"));
  EXPECT_TRUE(ok(R"({"items":{"$ref":"#s"},"definitions":{"x":{"$id":"#s","type":"string"}}})", R"(["x"])"));
  EXPECT_FALSE(ok(R"({"items":{"$ref":"#s"},"definitions":{"x":{"$id":"#s","type":"string"}}})", "[1]"));
  EXPECT_FALSE(compiles(R"({"$ref":"#nowhere"})"));
  EXPECT_FALSE(compiles(R"({"$ref":"#a","$defs":{"x":{"$anchor":"a"},"y":{"$anchor":"a"}}})"));
  // an anchor inside an embedded resource belongs to that resource's base URI: refused
  EXPECT_FALSE(compiles(R"({"$ref":"#a","$defs":{"x":{"$id":"http://e.com/x","$anchor":"a"}}})"));
}

// Closed objects: the negation of "additionalProperties": false is "some key outside the named
// ones", which inside another closed object is one of its own keys.
TEST(GrammarJsonSchemaCoverage, OneOfOfClosedObjects) {
  const std::string s = R"({"type":"object","oneOf":[)"
                        R"({"properties":{"kind":{"const":"a"},"x":{"type":"boolean"}},"additionalProperties":false},)"
                        R"({"properties":{"kind":{"const":"b"},"y":{"type":"boolean"}},"additionalProperties":false}]})";
  EXPECT_TRUE(ok(s, R"({"kind":"a","x":true})"));
  EXPECT_TRUE(ok(s, R"({"x":true})"));
  EXPECT_TRUE(ok(s, R"({"y":false})"));
  EXPECT_FALSE(ok(s, R"({})"));           // both
  EXPECT_TRUE(ok(s, R"({"kind":"a"})"));  // the second refuses "kind":"a"
  EXPECT_FALSE(ok(s, R"({"x":true,"y":true})"));  // neither
  EXPECT_FALSE(ok(s, R"({"kind":"b","x":true})"));
  EXPECT_TRUE(ok(s, R"({"kind":"b","y":true})"));
  EXPECT_FALSE(compiles(R"({"not":{"additionalProperties":false,"properties":{"a":{}}}})"));  // open: refused
}

}  // namespace json_schema_coverage_test
}  // namespace exl
