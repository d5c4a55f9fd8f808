#include <gtest/gtest.h>

#include <cmath>

#include "grammar/grammar_error.h"
#include "grammar_test_util.h"

namespace exl {
namespace json_schema_test {

using test::any_order;
using test::schema_accepts;

std::string compile_error(const std::string& schema, JsonSchemaOptions opts = {}) {
  try {
    compile_json_schema_text(schema, opts);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarJsonSchema, Scalars) {
  EXPECT_TRUE(schema_accepts(R"({"type":"null"})", "null"));
  EXPECT_TRUE(schema_accepts(R"({"type":"boolean"})", "false"));
  EXPECT_FALSE(schema_accepts(R"({"type":"boolean"})", "null"));
  EXPECT_TRUE(schema_accepts(R"({"type":"number"})", "-12.5e+3"));
  EXPECT_FALSE(schema_accepts(R"({"type":"number"})", "01"));
  EXPECT_TRUE(schema_accepts(R"({"type":["string","null"]})", "null"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string"})", R"("a\"b\\c\n\u0001é")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string"})", "\"a\nb\""));
}

TEST(GrammarJsonSchema, IntegerRangesAreExact) {
  const std::string s = R"({"type":"integer","minimum":-17,"exclusiveMaximum":1234})";
  for (int v = -40; v < 1300; ++v)
    EXPECT_EQ(schema_accepts(s, std::to_string(v)), v >= -17 && v < 1234) << v;
  EXPECT_FALSE(schema_accepts(s, "-0"));
  EXPECT_FALSE(schema_accepts(s, "007"));
  const std::string big = R"({"type":"integer","minimum":99,"maximum":100001})";
  for (int v : {98, 99, 100, 999, 1000, 99999, 100000, 100001, 100002, 1000000})
    EXPECT_EQ(schema_accepts(big, std::to_string(v)), v >= 99 && v <= 100001) << v;
  EXPECT_TRUE(schema_accepts(R"({"type":"integer","minimum":5})", "123456789012345"));
  EXPECT_FALSE(schema_accepts(R"({"type":"integer","maximum":-5})", "-4"));
  EXPECT_TRUE(schema_accepts(R"({"type":"integer","maximum":-5})", "-5000"));
  const std::string u64 = R"({"type":"integer","minimum":-1e20,"maximum":18446744073709551615})";
  EXPECT_TRUE(schema_accepts(u64, "18446744073709551615"));
  EXPECT_FALSE(schema_accepts(u64, "18446744073709551616"));
  EXPECT_TRUE(schema_accepts(u64, "-100000000000000000000"));
  EXPECT_FALSE(schema_accepts(u64, "-100000000000000000001"));
}

TEST(GrammarJsonSchema, NumberBounds) {
  const std::string s = R"({"type":"number","exclusiveMinimum":-2,"maximum":3})";
  auto ok = [](double v) { return v > -2 && v <= 3; };
  for (const char* t : {"-2", "-2.0", "-1.99", "-2.5", "0", "0.5", "3", "3.0", "3.0001", "2.999", "-0.5", "4", "-3"}) {
    EXPECT_EQ(schema_accepts(s, t), ok(std::stod(t))) << t;
  }
  EXPECT_NE(compile_error(R"({"type":"number","minimum":1e300})").find("#/minimum: bound out of the supported range"),
            std::string::npos);
}

TEST(GrammarJsonSchema, MultipleOf) {
  const std::string i = R"({"type":"integer","multipleOf":7,"minimum":-30,"maximum":30})";
  for (int v = -40; v <= 40; ++v) EXPECT_EQ(schema_accepts(i, std::to_string(v)), v % 7 == 0 && v >= -30 && v <= 30) << v;
  const std::string d = R"({"type":"number","multipleOf":0.25})";
  for (const char* t : {"0.25", "1", "1.5", "-2.75", "0.1", "3.125", "10.50", "2.2500", "0.3"}) {
    double v = std::stod(t);
    EXPECT_EQ(schema_accepts(d, t), std::fmod(v * 4, 1.0) == 0) << t;
  }
}

TEST(GrammarJsonSchema, StringsPatternsAndLengths) {
  EXPECT_TRUE(schema_accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("éé")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("é")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","minLength":2,"maxLength":3})", R"("abcd")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","maxLength":100})", "\"" + std::string(100, 'x') + "\""));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","maxLength":100})", "\"" + std::string(101, 'x') + "\""));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","pattern":"^[a-z]+$","maxLength":3})", R"("abc")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","pattern":"^[a-z]+$","maxLength":3})", R"("abcd")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","pattern":"b"})", R"("abc")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","pattern":"^\""})", R"("\"x")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","format":"date"})", R"("2024-02-29")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","format":"date"})", R"("2024-02-30")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","format":"ipv6"})", R"("::1")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_NE(compile_error(R"({"type":"string","format":"regex"})").find("#/format: unsupported format 'regex'"), std::string::npos);
  JsonSchemaOptions lenient;
  lenient.ignore_keywords = {"format"};
  EXPECT_TRUE(schema_accepts(R"({"type":"string","format":"regex"})", R"("x")", lenient));
}

// Found by feeding fuzz_json_schema by hand: a negative or huge minLength/maxLength was converted
// to uint64 unchecked (undefined; on x86 minLength -5 became a bound no string meets).
TEST(GrammarJsonSchema, StringLengthBoundsAreCheckedBeforeConversion) {
  for (const char* s : {R"({"type":"string","minLength":-5})", R"({"type":"string","pattern":"a","minLength":-5})"})
    EXPECT_NE(compile_error(s).find("/minLength: must be a non-negative integer"), std::string::npos) << s;
  for (const char* s : {R"({"type":"string","maxLength":-1e300})", R"({"oneOf":[{"type":"string","maxLength":-1},{"type":"null"}]})"})
    EXPECT_NE(compile_error(s).find("/maxLength: must be a non-negative integer"), std::string::npos) << s;
  EXPECT_FALSE(schema_accepts(R"({"type":"string","minLength":1e300})", R"("abc")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","maxLength":1e300})", R"("abc")"));
  const std::string one = R"({"oneOf":[{"type":"string","minLength":1e300},{"type":"string","maxLength":2}]})";
  EXPECT_TRUE(schema_accepts(one, R"("ab")"));
  EXPECT_FALSE(schema_accepts(one, R"("abc")"));
}

TEST(GrammarJsonSchema, ObjectsInSchemaOrder) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},
                           "required":["b"],"additionalProperties":false})";
  EXPECT_TRUE(schema_accepts(s, R"({"a":1,"b":"x"})"));
  EXPECT_TRUE(schema_accepts(s, R"({"b":"x"})"));
  EXPECT_FALSE(schema_accepts(s, R"({"a":1})"));
  EXPECT_FALSE(schema_accepts(s, R"({"b":"x","a":1})"));
  EXPECT_TRUE(schema_accepts(s, R"({"b":"x","a":1})", any_order()));
  EXPECT_FALSE(schema_accepts(s, R"({"b":"x","c":1})", any_order()));
  const std::string open = R"({"properties":{"a":{"type":"integer"}}})";
  EXPECT_TRUE(schema_accepts(open, R"({"a":1,"zz":[1,{"q":null}]})"));
  EXPECT_FALSE(schema_accepts(open, R"({"a":"no"})"));
  EXPECT_FALSE(schema_accepts(open, R"({"zz":1,"a":"no"})", any_order()));
  const std::string pat = R"({"patternProperties":{"^x-":{"type":"integer"}},"additionalProperties":{"type":"string"}})";
  EXPECT_TRUE(schema_accepts(pat, R"({"x-a":1,"b":"s"})"));
  EXPECT_FALSE(schema_accepts(pat, R"({"x-a":"s"})"));
  EXPECT_FALSE(schema_accepts(pat, R"({"b":1})"));
}

TEST(GrammarJsonSchema, FlexibleWhitespace) {
  JsonSchemaOptions o;
  o.whitespace = JsonSchemaOptions::Whitespace::flexible;
  const std::string s = R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}}})";
  EXPECT_TRUE(schema_accepts(s, "{ \"a\" :\n [ 1 , 2 ] }", o));
  EXPECT_FALSE(schema_accepts(s, "{ \"a\" :\n [ 1 , 2 ] }"));
}

TEST(GrammarJsonSchema, SpacedWhitespaceIsPythonJsonDumps) {
  JsonSchemaOptions o;
  o.whitespace = JsonSchemaOptions::Whitespace::spaced;
  const std::string s = R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{"type":"object"}}})";
  // json.dumps({"a": [1, 2], "b": {"k": [None, "x, y"]}}) and json.dumps({"a": []})
  EXPECT_TRUE(schema_accepts(s, R"({"a": [1, 2], "b": {"k": [null, "x, y"]}})", o));
  EXPECT_TRUE(schema_accepts(s, R"({"a": []})", o));
  EXPECT_FALSE(schema_accepts(s, R"({"a":[1,2]})", o));
  EXPECT_FALSE(schema_accepts(s, R"({"a": [1,2]})", o));
  EXPECT_FALSE(schema_accepts(s, R"({"a" : [1, 2]})", o));
  EXPECT_FALSE(schema_accepts(s, "{\"a\": [1,\n2]}", o));
  EXPECT_FALSE(schema_accepts(s, R"( {"a": []})", o));
}

TEST(GrammarJsonSchema, Arrays) {
  const std::string s = R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"integer"},"minItems":2,"maxItems":3})";
  EXPECT_FALSE(schema_accepts(s, R"(["a"])"));
  EXPECT_TRUE(schema_accepts(s, R"(["a",1])"));
  EXPECT_TRUE(schema_accepts(s, R"(["a",1,2])"));
  EXPECT_FALSE(schema_accepts(s, R"(["a",1,2,3])"));
  EXPECT_FALSE(schema_accepts(s, R"([1,1])"));
  const std::string many = R"({"type":"array","items":{"type":"integer"},"minItems":20,"maxItems":30})";
  auto arr = [](int n) {
    std::string t = "[";
    for (int i = 0; i < n; ++i) t += (i ? ",1" : "1");
    return t + "]";
  };
  EXPECT_FALSE(schema_accepts(many, arr(19)));
  EXPECT_TRUE(schema_accepts(many, arr(20)));
  EXPECT_TRUE(schema_accepts(many, arr(30)));
  EXPECT_FALSE(schema_accepts(many, arr(31)));
  EXPECT_TRUE(schema_accepts(R"({"items":false})", "[]"));
  EXPECT_FALSE(schema_accepts(R"({"items":false})", "[1]"));
}

TEST(GrammarJsonSchema, RefsAndRecursion) {
  const std::string tree = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},
      "$ref":"#/$defs/node"})";
  EXPECT_TRUE(schema_accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(schema_accepts(tree, R"({"v":1,"kids":[{"v":2},{"kids":[]}]})"));
  EXPECT_NE(compile_error(R"({"$ref":"#/nope"})").find("#/$ref: '#/nope' does not resolve"), std::string::npos);
  EXPECT_NE(compile_error(R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})").find("left-recursive"), std::string::npos);
}

TEST(GrammarJsonSchema, Combinators) {
  const std::string any = R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})";
  EXPECT_TRUE(schema_accepts(any, "5"));
  EXPECT_TRUE(schema_accepts(any, "\"a\""));
  EXPECT_FALSE(schema_accepts(any, "\"ab\""));
  const std::string all = R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                                     {"properties":{"b":{"type":"string"}},"required":["b"]}]})";
  EXPECT_TRUE(schema_accepts(all, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(schema_accepts(all, R"({"a":1})"));
  const std::string one = R"({"oneOf":[{"type":"object","properties":{"k":{"const":"a"}},"required":["k"]},
                                     {"type":"object","properties":{"k":{"const":"b"},"n":{"type":"integer"}},"required":["k"]}]})";
  EXPECT_TRUE(schema_accepts(one, R"({"k":"b","n":1})"));
  EXPECT_FALSE(schema_accepts(one, R"({"k":"c"})"));
  EXPECT_NE(compile_error(R"({"oneOf":[{"type":"integer"},{"multipleOf":2}]})").find("may overlap"), std::string::npos);
  EXPECT_TRUE(schema_accepts(R"({"enum":[1,"a",{"x":[true]}]})", R"({"x":[true]})"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","enum":[1,"a"]})", "1"));
}

TEST(GrammarJsonSchema, OversizedStringProductsNameTheSubschema) {
  std::string e = compile_error(
      R"({"properties":{"to":{"type":"string","minLength":5,"maxLength":254,)"
      R"("pattern":"^[^@^\\s]+@[^@^\\.^\\s]+(\\.[^@^\\.^\\s]*)*.gov.uk"}}})");
  EXPECT_EQ(e.rfind("grammar: json_schema: #/properties/to: the string's pattern/format/length constraints", 0), 0u) << e;
}

TEST(GrammarJsonSchema, UnknownKeywordsAreErrorsWithPointer) {
  EXPECT_EQ(compile_error(R"({"properties":{"a":{"$dynamicRef":"#x"}}})"),
            "grammar: json_schema: #/properties/a/$dynamicRef: '#x': no schema has the anchor 'x'");
  EXPECT_EQ(compile_error(R"({"properties":{"a":{"$recursiveRef":"#"}}})"),
            "grammar: json_schema: #/properties/a: unsupported keyword '$recursiveRef'");
  EXPECT_EQ(compile_error(R"({"properties":{"a":{"not":{"multipleOf":2}}}})"),
            "grammar: json_schema: #/properties/a/not: unsupported keyword 'not' (only type exclusions, required keys, "
            "property types, string lengths, patterns, formats, number bounds and array sizes)");
  EXPECT_TRUE(schema_accepts(R"({"not":{"type":["string","object"]}})", "[1]"));
  EXPECT_FALSE(schema_accepts(R"({"not":{"type":["string","object"]}})", "{}"));
  EXPECT_EQ(compile_error(R"({"items":{"foo":1}})"), "grammar: json_schema: #/items: unsupported keyword 'foo'");
  JsonSchemaOptions lenient;
  lenient.ignore_keywords = {"foo"};
  EXPECT_EQ(compile_error(R"({"items":{"foo":1}})", lenient), "");
  EXPECT_NE(compile_error(R"({"uniqueItems":true})").find("uniqueItems"), std::string::npos);
}


// A length-bounded string is one prebuilt automaton called from its value, not determinized again
// into every rule that holds it (a 1024-character bound is ~25,000 states); escaped quotes inside
// it stay exact.
TEST(GrammarJsonSchema, LengthBoundedStringsAreSharedRules) {
  for (const char* schema : {R"({"type":"string","maxLength":1024})", R"({"type":["string","null"],"maxLength":1024})",
                             R"({"type":"string","format":"json-pointer"})"}) {
    Grammar g = compile_json_schema_text(schema);
    EXPECT_LT(g.rules[size_t(g.root)].states.size(), 10u) << schema;
  }
  // Properties with the same string keywords share one rule.
  Grammar g = compile_json_schema_text(
      R"({"properties":{"a":{"type":"string","maxLength":1024},"b":{"type":["string","null"],"maxLength":1024},)"
      R"("c":{"type":"string","maxLength":1000}}})");
  size_t big = 0;
  for (const Rule& r : g.rules) big += r.states.size() > 1000;
  EXPECT_EQ(big, 2u);
  const std::string two = R"({"type":"string","maxLength":2})";
  EXPECT_TRUE(schema_accepts(two, R"("\"\"")"));
  EXPECT_FALSE(schema_accepts(two, R"("\"\"\"")"));
  EXPECT_FALSE(schema_accepts(two, R"("\")"));
  EXPECT_FALSE(schema_accepts(two, R"("a"")"));
  EXPECT_TRUE(schema_accepts(R"({"type":"string","format":"json-pointer"})", R"("/a\"b")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","format":"json-pointer"})", R"("a\"b")"));
}

}  // namespace json_schema_test
}  // namespace exl
