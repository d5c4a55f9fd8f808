// References beyond JSON pointers into the document: base URIs ($id, RFC 3986 resolution),
// anchors in embedded resources, the schema store, $dynamicRef; and the keywords added beside
// them (maxContains, numbers in negated enums, merged multipleOf, numeric const equality).
// Every check is an instance the JSON Schema spec accepts or rejects.
#include <gtest/gtest.h>

#include "grammar/grammar_error.h"
#include "grammar_test_util.h"

namespace exl {
namespace json_schema_ref_test {

using test::any_order;
using test::schema_accepts;

bool accepts(const std::string& schema, const std::string& text, JsonSchemaOptions opts = any_order()) {
  return schema_accepts(schema, text, opts);
}

std::string error_of(const std::string& schema, JsonSchemaOptions opts = any_order()) {
  try {
    compile_json_schema_text(schema, opts);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarJsonSchemaRef, RelativeRefsResolveAgainstTheNearestId) {
  // "#/$defs/x" inside the embedded resource names that resource's $defs, not the root's
  const std::string s = R"({"$id":"http://e.com/root.json","$defs":{"x":{"type":"string"}},
    "properties":{"a":{"$id":"sub/a.json","$defs":{"x":{"type":"integer"}},"allOf":[{"$ref":"#/$defs/x"}]},
                  "b":{"$ref":"sub/a.json"},
                  "c":{"$ref":"/other.json"}},
    "$comment":"",
    "allOf":[{"$defs":{"o":{"$id":"http://e.com/other.json","type":"boolean"}}}]})";
  EXPECT_TRUE(accepts(s, R"({"a":1})"));
  EXPECT_FALSE(accepts(s, R"({"a":"x"})"));
  EXPECT_TRUE(accepts(s, R"({"b":2})"));
  EXPECT_FALSE(accepts(s, R"({"b":"x"})"));
  EXPECT_TRUE(accepts(s, R"({"c":true})"));
  EXPECT_FALSE(accepts(s, R"({"c":1})"));
}

TEST(GrammarJsonSchemaRef, DotSegmentsAndAnchorsOfEmbeddedResources) {
  const std::string s = R"({"$id":"http://e.com/a/b/root.json",
    "$defs":{"n":{"$id":"../c/n.json","$defs":{"i":{"$anchor":"int","type":"integer"}}}},
    "$ref":"http://e.com/a/c/n.json#int"})";
  EXPECT_TRUE(accepts(s, "3"));
  EXPECT_FALSE(accepts(s, R"("3")"));
}

TEST(GrammarJsonSchemaRef, TheSchemaStoreServesRemoteDocumentsAndUnknownOnesAreNamed) {
  JsonSchemaOptions o = any_order();
  o.schema_store["http://store.test/int.json"] = nlohmann::ordered_json::parse(
      R"({"$defs":{"pos":{"type":"integer","minimum":1},"ref":{"$ref":"#/$defs/pos"}}})");
  const std::string s = R"({"type":"array","items":{"$ref":"http://store.test/int.json#/$defs/ref"}})";
  EXPECT_TRUE(accepts(s, "[1,2]", o));
  EXPECT_FALSE(accepts(s, "[0]", o));
  EXPECT_EQ(error_of(s),
            "grammar: json_schema: #/items/$ref: 'http://store.test/int.json#/$defs/ref' names "
            "'http://store.test/int.json', which is neither a resource of this schema nor in the schema store");
  // the store is part of the options' cache key
  EXPECT_NE(json_schema_options_key(o), json_schema_options_key(any_order()));
}

TEST(GrammarJsonSchemaRef, RefsUnderUnknownKeywordsResolveAgainstTheirBase) {
  JsonSchemaOptions o = any_order();
  o.ignore_unknown_keywords = true;
  const std::string s = R"({"$id":"http://e.com/r/","components":{"A":{"$ref":"b.json"},"bad":{"$ref":"nowhere.json"}},
    "$defs":{"b":{"$id":"b.json","type":"integer"}},"properties":{"x":{"$ref":"#/components/A"}}})";
  EXPECT_TRUE(accepts(s, R"({"x":1})", o));
  EXPECT_FALSE(accepts(s, R"({"x":"a"})", o));
  // one that resolves nowhere fails only where it is used
  std::string bad = s;
  bad.replace(bad.find("#/components/A"), 14, "#/components/bad");
  EXPECT_NE(error_of(bad, o).find("'exl:unresolved:nowhere.json' does not resolve"), std::string::npos) << error_of(bad, o);
}

TEST(GrammarJsonSchemaRef, IdBesideRefIsRefusedWhenTheDraftIsUnsaid) {
  const std::string s = R"({"$id":"http://e.com/","allOf":[{"$id":"http://e.com/x/","$ref":"a.json"}],
    "$defs":{"a":{"$id":"a.json","type":"string"}}})";
  EXPECT_EQ(error_of(s),
            "grammar: json_schema: #/allOf/0/$id: $id beside $ref: draft 7 ignores it, 2019-09 on do not, and the "
            "$ref resolves apart; say which with $schema");
  // draft 7 ignores it: a.json is http://e.com/a.json
  const std::string d7 = R"({"$schema":"http://json-schema.org/draft-07/schema#","$id":"http://e.com/",
    "allOf":[{"$id":"http://e.com/x/","$ref":"a.json"}],"definitions":{"a":{"$id":"a.json","type":"string"}}})";
  EXPECT_TRUE(accepts(d7, R"("s")"));
  EXPECT_FALSE(accepts(d7, "1"));
}

TEST(GrammarJsonSchemaRef, DynamicRefBindsToTheOutermostDynamicAnchor) {
  // the outer resource binds "item" to itself (strings): a list of strings, not of anything
  const std::string top = R"({"$id":"http://e.com/top","$ref":"list","$defs":{
    "item":{"$dynamicAnchor":"item","type":"string"},
    "list":{"$id":"list","type":"array","items":{"$dynamicRef":"#item"},"$defs":{"i":{"$dynamicAnchor":"item"}}}}})";
  EXPECT_TRUE(accepts(top, R"(["a","b"])"));
  EXPECT_FALSE(accepts(top, "[1]"));
  // reached on its own, the list's own anchor (anything) applies
  const std::string alone = R"({"$id":"http://e.com/top2","$ref":"list","$defs":{
    "list":{"$id":"list","type":"array","items":{"$dynamicRef":"#item"},"$defs":{"i":{"$dynamicAnchor":"item"}}}}})";
  EXPECT_TRUE(accepts(alone, "[1,\"a\"]"));
}

TEST(GrammarJsonSchemaRef, MaxContainsCountsTheMatchingItems) {
  const std::string s = R"({"contains":{"const":1},"minContains":1,"maxContains":2})";
  EXPECT_TRUE(accepts(s, "[1]"));
  EXPECT_TRUE(accepts(s, "[1,2,1.0]"));
  EXPECT_FALSE(accepts(s, "[1,1,1]"));
  EXPECT_FALSE(accepts(s, "[2]"));
  const std::string none = R"({"contains":{"const":1},"minContains":0,"maxContains":0})";
  EXPECT_TRUE(accepts(none, "[]"));
  EXPECT_TRUE(accepts(none, "[2,3]"));
  EXPECT_FALSE(accepts(none, "[2,1]"));
  EXPECT_FALSE(accepts(R"({"contains":{"const":1},"minContains":3,"maxContains":1})", "[1,1,1]"));
  EXPECT_NE(error_of(R"({"contains":{"multipleOf":2},"maxContains":1})"), "");
}

TEST(GrammarJsonSchemaRef, NotIntegerKeepsTheFractionalNumbers) {
  const std::string s = R"({"not":{"type":"integer"}})";
  EXPECT_TRUE(accepts(s, "1.5"));
  EXPECT_TRUE(accepts(s, R"("a")"));
  EXPECT_FALSE(accepts(s, "1"));
  EXPECT_FALSE(accepts(s, "1.0"));
}

TEST(GrammarJsonSchemaRef, MultipleOfFromSeveralSubschemasAllApply) {
  const std::string s = R"({"allOf":[{"multipleOf":2}],"anyOf":[{"multipleOf":3}]})";
  EXPECT_TRUE(accepts(s, "12"));
  EXPECT_FALSE(accepts(s, "4"));
  EXPECT_FALSE(accepts(s, "9"));
}

TEST(GrammarJsonSchemaRef, ConstNumbersAndObjectsCompareAsValues) {
  EXPECT_TRUE(accepts(R"({"const":-2.0})", "-2"));
  EXPECT_TRUE(accepts(R"({"const":-2.0})", "-2.0"));
  EXPECT_TRUE(accepts(R"({"const":[1]})", "[1.0]"));
  EXPECT_FALSE(accepts(R"({"const":[1]})", "[true]"));
  EXPECT_TRUE(accepts(R"({"const":{"a":1,"b":[2]}})", R"({"b":[2],"a":1})"));
  EXPECT_FALSE(accepts(R"({"const":{"a":1,"b":[2]}})", R"({"b":[2]})"));
  EXPECT_FALSE(accepts(R"({"const":{"a":1,"b":[2]}})", R"({"a":1,"b":[2],"c":0})"));
  // generation keeps integers canonical
  EXPECT_FALSE(accepts(R"({"const":-2.0})", "-2.0", JsonSchemaOptions{}));
}

TEST(GrammarJsonSchemaRef, IfWithoutThenOrElseConstrainsNothing) {
  EXPECT_TRUE(accepts(R"({"if":{"const":0}})", R"("x")"));
  const std::string s = R"({"if":{"const":1},"then":false})";
  EXPECT_TRUE(accepts(s, "2"));
  EXPECT_FALSE(accepts(s, "1"));
}

TEST(GrammarJsonSchemaRef, NotOfOverlappingOneOfIsNoneOrTwoAtOnce) {
  const std::string s = R"({"not":{"oneOf":[{"type":"integer"},{"minimum":2}]}})";
  EXPECT_TRUE(accepts(s, "1.5"));   // neither
  EXPECT_TRUE(accepts(s, "3"));     // both
  EXPECT_FALSE(accepts(s, "1"));    // only the first
  EXPECT_FALSE(accepts(s, "2.5"));  // only the second
  EXPECT_FALSE(accepts(s, R"("a")"));
  // two branches at once evaluate nothing: 'a' stays unevaluated; non-objects match both branches
  const std::string u = R"({"not":{"oneOf":[{"properties":{"a":{"type":"string"}}},{"required":["a"]}]},)"
                        R"("unevaluatedProperties":false})";
  EXPECT_TRUE(accepts(u, "1"));
  EXPECT_FALSE(accepts(u, R"({"a":"x"})"));
  EXPECT_FALSE(accepts(u, R"({"a":1})"));
  EXPECT_FALSE(accepts(u, "{}"));
  // nested anyOf/oneOf branches of a pair evaluate nothing either
  const std::string nested = R"({"not":{"oneOf":[{"anyOf":[{"properties":{"a":true}}]},{"required":["a"]}]},)"
                             R"("unevaluatedProperties":false})";
  EXPECT_TRUE(accepts(nested, "1"));
  EXPECT_FALSE(accepts(nested, "{}"));
  EXPECT_FALSE(accepts(nested, R"({"a":1})"));
  // a pair that evaluates otherwise (a closed object's properties) is refused beside unevaluated*
  std::string e = error_of(R"({"not":{"oneOf":[{"properties":{"a":{"type":"string"}},"additionalProperties":false},)"
                           R"({"required":["a"]}]},"unevaluatedProperties":false})");
  EXPECT_NE(e.find("beside the negation of a oneOf whose branches evaluate properties or items"), std::string::npos) << e;
}

TEST(GrammarJsonSchemaRef, UniqueItemsOverFewIntegersOrAtMostOneItem) {
  const std::string s = R"({"type":"array","uniqueItems":true,"items":{"type":"integer","minimum":1,"exclusiveMaximum":4}})";
  EXPECT_TRUE(accepts(s, "[3,1,2]"));
  EXPECT_FALSE(accepts(s, "[1,1]"));
  EXPECT_FALSE(accepts(s, "[4]"));
  EXPECT_TRUE(accepts(R"({"uniqueItems":true,"maxItems":1})", R"([{"a":[1]}])"));
  EXPECT_FALSE(accepts(R"({"uniqueItems":true,"maxItems":1})", "[1,2]"));
  EXPECT_NE(error_of(R"({"uniqueItems":true,"items":{"type":"integer","minimum":0,"maximum":12}})")
                .find("no grammar tells unbounded values apart"),
            std::string::npos);
}

TEST(GrammarJsonSchemaRef, IfAloneStillEvaluatesForUnevaluatedProperties) {
  const std::string s = R"({"if":{"properties":{"foo":{"const":"a"}}},"unevaluatedProperties":false})";
  EXPECT_TRUE(accepts(s, R"({"foo":"a"})"));
  EXPECT_FALSE(accepts(s, R"({"foo":"b"})"));
  EXPECT_TRUE(accepts(s, "{}"));
}

TEST(GrammarJsonSchemaRef, NotOfPrefixItemsConstrainsWithoutEvaluating) {
  const std::string s = R"({"not":{"prefixItems":[{"type":"string"}]}})";
  EXPECT_TRUE(accepts(s, "[1]"));
  EXPECT_TRUE(accepts(s, "[1,\"a\"]"));
  EXPECT_FALSE(accepts(s, "[\"a\",1]"));
  EXPECT_FALSE(accepts(s, "[]"));
  EXPECT_FALSE(accepts(s, R"("x")"));
  const std::string closed = R"({"not":{"prefixItems":[true],"items":false}})";
  EXPECT_TRUE(accepts(closed, "[1,2]"));
  EXPECT_FALSE(accepts(closed, "[1]"));
  // the failed 'if' evaluates no item: 'else' and the base must cover them all
  const std::string ite = R"({"prefixItems":[{"const":"foo"}],"if":{"prefixItems":[true,{"const":"bar"}]},)"
                          R"("then":{"prefixItems":[true,true,{"const":"then"}]},)"
                          R"("else":{"prefixItems":[true,true,true,{"const":"else"}]},"unevaluatedItems":false})";
  EXPECT_TRUE(accepts(ite, R"(["foo","bar","then"])"));
  EXPECT_TRUE(accepts(ite, R"(["foo","baz","x","else"])"));
  EXPECT_FALSE(accepts(ite, R"(["foo","baz","x","else","y"])"));
  EXPECT_FALSE(accepts(ite, R"(["foo","bar","then","z"])"));
  EXPECT_TRUE(accepts(ite, R"(["foo","baz"])"));  // else's prefixItems evaluates item 1
}

}  // namespace json_schema_ref_test
}  // namespace exl
