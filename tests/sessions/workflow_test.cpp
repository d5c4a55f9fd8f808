#include "sessions/workflow.h"

#include <gtest/gtest.h>

#include "kernels/error.h"
#include "sessions/workflow_schema.h"
#include "test_support.h"

namespace exl {
namespace workflow_test {

using ojson = nlohmann::ordered_json;

std::string error_of(const ojson& doc, const std::filesystem::path& base = ".") {
  try {
    parse_workflow(doc, base);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WorkflowSchema, CompiledInSchemaIsTheDocumentedOne) {
  const auto docs = ojson::parse(test::read_file(test::source_dir() / "docs" / "workflow.schema.json"));
  EXPECT_EQ(ojson::parse(workflow_schema_text()), docs);
}

TEST(WorkflowSchema, ValidatorReportsPointersForEachKeyword) {
  const ojson schema = ojson::parse(R"({"type":"object","required":["a"],"additionalProperties":false,
    "properties":{"a":{"type":"array","minItems":2,"items":{"$ref":"#/$defs/n"}},"b":{"type":"string","pattern":"^x+$","minLength":2},
    "c":{"enum":[1,2]},"d":{"anyOf":[{"type":"string"},{"type":"integer","minimum":3}]}},
    "$defs":{"n":{"type":"integer","minimum":0}}})");
  EXPECT_TRUE(schema_violations(schema, ojson::parse(R"({"a":[0,1],"b":"xx","c":2,"d":5})")).empty());
  const auto errs = schema_violations(schema, ojson::parse(R"({"a":[-1],"b":"xy","c":3,"d":1.5,"e":0})"));
  const std::vector<std::string> want = {
      "/a: must have at least 2 items", "/a/0: must be at least 0", "/b: 'xy' does not match ^x+$",
      "/c: must be one of [1,2]", "/d: matches none of the allowed forms (first form: /d: must be string, not a number)",
      "(root): unknown property 'e'"};
  EXPECT_EQ(errs, want);
  EXPECT_EQ(schema_violations(schema, ojson::parse("[]")), std::vector<std::string>{"(root): must be object, not an array"});
  EXPECT_EQ(schema_violations(schema, ojson::object()), std::vector<std::string>{"(root): missing required property 'a'"});
  EXPECT_THROW(schema_violations(ojson::parse(R"({"not":{}})"), ojson::object()), Error);
}

TEST(Workflow, ParsesStepsDefaultsAndFileInputs) {
  const auto dir = test::temp_dir("Workflow_parse");
  test::write_file(dir / "doc.txt", "Alice, 31");
  const ojson doc = ojson::parse(R"({"name":"w","model":"m","inputs":{"doc":{"file":"doc.txt"},"n":3},
    "defaults":{"system":"Be brief.","max_tokens":50},
    "steps":[{"name":"a","prompt":"Read {{inputs.doc}}","schema":{"type":"object"}},
             {"name":"b","prompt":"Item {{item}} of {{ steps.a.people }}","for_each":"steps.a.people","temperature":0.5,"max_tokens":9,
              "if":{"path":"steps.a.ok","equals":true}},
             {"name":"c","prompt":"More","continue":"a","if":"steps.b"}]})");
  const Workflow wf = parse_workflow(doc, dir, {{"n", "7"}});
  EXPECT_EQ(wf.model, (dir / "m").lexically_normal().string());
  EXPECT_EQ(wf.inputs["doc"], "Alice, 31");
  EXPECT_EQ(wf.inputs["n"], "7");
  ASSERT_EQ(wf.steps.size(), 3u);
  EXPECT_EQ(wf.steps[0].system, "Be brief.");
  EXPECT_EQ(wf.steps[0].max_tokens, 50);
  EXPECT_TRUE(wf.steps[0].schema.has_value());
  EXPECT_EQ(wf.steps[1].for_each, "steps.a.people");
  EXPECT_EQ(wf.steps[1].max_tokens, 9);
  EXPECT_DOUBLE_EQ(wf.steps[1].temperature, 0.5);
  ASSERT_TRUE(wf.steps[1].condition.has_value());
  EXPECT_EQ(*wf.steps[1].condition->equals, true);
  EXPECT_EQ(wf.steps[2].continue_from, "a");
  EXPECT_EQ(wf.steps[2].condition->path, "steps.b");
}

TEST(Workflow, SchemaErrorsNamePointers) {
  const std::string e = error_of(ojson::parse(R"({"steps":[{"name":"a"},{"name":"1x","prompt":"p","bogus":1}],"extra":0})"));
  EXPECT_NE(e.find("sessions: workflow: 'workflow': 4 problems:"), std::string::npos) << e;
  EXPECT_NE(e.find("/steps/0: missing required property 'prompt'"), std::string::npos) << e;
  EXPECT_NE(e.find("/steps/1/name: '1x' does not match"), std::string::npos) << e;
  EXPECT_NE(e.find("/steps/1: unknown property 'bogus'"), std::string::npos) << e;
  EXPECT_NE(e.find("(root): unknown property 'extra'"), std::string::npos) << e;
  EXPECT_NE(error_of(ojson::parse(R"({"steps":[]})")).find("/steps: must have at least 1 items"), std::string::npos);
}

TEST(Workflow, McpServersParseAsTheFlagDoes) {
  const Workflow wf = parse_workflow(ojson::parse(R"({"mcp":{"fs":"npx -y 'server fs' /data","docs":"http://127.0.0.1:3001/mcp"},
    "steps":[{"name":"a","prompt":"p","tools":["fs__read_file"]}]})"), ".");
  ASSERT_EQ(wf.mcp.size(), 2u);
  EXPECT_EQ(wf.mcp[0].name, "fs");
  EXPECT_EQ(wf.mcp[0].argv, (std::vector<std::string>{"npx", "-y", "server fs", "/data"}));
  EXPECT_EQ(wf.mcp[1].name, "docs");
  EXPECT_EQ(wf.mcp[1].url, "http://127.0.0.1:3001/mcp");
  const std::string e = error_of(ojson::parse(R"({"mcp":{"a_b":"x","c=d":"y","e":"https://h/mcp","f":"","g":3},
    "steps":[{"name":"a","prompt":"p"}]})"));
  EXPECT_NE(e.find("/mcp/f: must have at least 1 characters"), std::string::npos) << e;
  EXPECT_NE(e.find("/mcp/g: must be string"), std::string::npos) << e;
  const std::string names = error_of(ojson::parse(R"({"mcp":{"a_b":"x","c=d":"y","e":"https://h/mcp"},"steps":[{"name":"a","prompt":"p"}]})"));
  EXPECT_NE(names.find("3 problems"), std::string::npos) << names;
  EXPECT_NE(names.find("/mcp/a_b: --mcp: the server name 'a_b' must be"), std::string::npos) << names;
  EXPECT_NE(names.find("/mcp/c=d: --mcp: the server name 'c=d' must be"), std::string::npos) << names;
  EXPECT_NE(names.find("/mcp/e: --mcp e: 'https://h/mcp': only http://"), std::string::npos) << names;
}

// The same malformed files tests/node/workflow_schema.test.mjs shows ajv refusing.
TEST(Workflow, RefusesWhatAnIndependentValidatorRefuses) {
  for (const char* bad : {R"({})", R"({"steps":[]})", R"({"steps":[{"name":"a"}]})", R"({"steps":[{"name":"1x","prompt":"p"}]})",
                          R"({"steps":[{"name":"a","prompt":"p","bogus":1}]})", R"({"steps":[{"name":"a","prompt":"p"}],"extra":0})",
                          R"({"steps":[{"name":"a","prompt":"p","for_each":"outputs.x"}]})",
                          R"({"steps":[{"name":"a","prompt":"p","if":{"equals":1}}]})",
                          R"({"steps":[{"name":"a","prompt":"p","max_tokens":0}]})",
                          R"({"steps":[{"name":"a","prompt":"p","schema":3}]})",
                          R"({"defaults":{"top_k":3},"steps":[{"name":"a","prompt":"p"}]})"})
    EXPECT_NE(error_of(ojson::parse(bad)), "") << bad;
  EXPECT_EQ(error_of(ojson::parse(R"({"steps":[{"name":"a","prompt":"p"},{"name":"b","prompt":"p","if":{"path":"steps.a.y","not_equals":null}}]})")), "");
}

// Found with fuzz_workflow: the schema accepts any integer-valued number (1e300, 3e9), which was
// then converted unchecked to max_tokens (undefined for 1e300), seed or max_turns (3e9 wrapped to
// a negative int).
TEST(Workflow, CountsBeyondTheirTypeAreRefused) {
  for (const char* bad : {R"({"steps":[{"name":"a","prompt":"p","max_tokens":1e300}]})",
                          R"({"steps":[{"name":"a","prompt":"p","max_tokens":9223372036854775808}]})",
                          R"({"defaults":{"seed":1e20},"steps":[{"name":"a","prompt":"p"}]})",
                          R"({"steps":[{"name":"a","prompt":"p","max_turns":3000000000}]})",
                          R"({"steps":[{"name":"a","prompt":"p","max_turns":3e9}]})"}) {
    const std::string e = error_of(ojson::parse(bad));
    EXPECT_NE(e.find("sessions: workflow: 'workflow': step 'a': '"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("' must be at most "), std::string::npos) << bad << ": " << e;
  }
  const Workflow wf = parse_workflow(ojson::parse(R"({"steps":[{"name":"a","prompt":"p","max_tokens":1e3,
    "seed":18446744073709551615,"max_turns":2147483647}]})"), ".");
  EXPECT_EQ(wf.steps[0].max_tokens, 1000);
  EXPECT_EQ(wf.steps[0].seed, 18446744073709551615ull);
  EXPECT_EQ(wf.steps[0].max_turns, 2147483647);
}

TEST(Workflow, ReferenceErrorsAreCaughtBeforeRunning) {
  const std::string e = error_of(ojson::parse(R"({"inputs":{"x":1},"steps":[
    {"name":"a","prompt":"{{inputs.y}} {{steps.b.z}} {{item}}"},
    {"name":"b","prompt":"ok","for_each":"steps.b.list"},
    {"name":"a","prompt":"{{steps.a}}","continue":"b"},
    {"name":"d","prompt":"{{nope.x}} {{inputs.x","if":"steps.zz"}]})"));
  for (const char* want : {"/steps/0 ('a')/prompt: 'inputs.y': there is no input 'y'",
                           "/steps/0 ('a')/prompt: 'steps.b.z': there is no earlier step 'b'",
                           "/steps/0 ('a')/prompt: 'item': item and index exist only inside a for_each step",
                           "/steps/1 ('b')/for_each: 'steps.b.list': there is no earlier step 'b'",
                           "/steps/2 ('a'): the step name 'a' is used twice",
                           "/steps/2 ('a')/continue: step 'b' is a for_each step",
                           "/steps/3 ('d')/prompt: an unclosed '{{'", "/steps/3 ('d')/if: 'steps.zz': there is no earlier step"})
    EXPECT_NE(e.find(want), std::string::npos) << "missing: " << want << "\nin: " << e;
  EXPECT_NE(error_of(ojson::parse(R"({"inputs":{"d":{"file":"absent.txt"}},"steps":[{"name":"a","prompt":"p"}]})"))
                .find("cannot read input 'd' file"),
            std::string::npos);
}

TEST(Workflow, TemplatesAndConditions) {
  const ojson ctx = ojson::parse(R"({"inputs":{"doc":"text","n":2},"steps":{"a":{"people":[{"name":"Ann"}],"ok":true,"z":0,"s":""}},
    "item":{"name":"Bo"},"index":1})");
  EXPECT_EQ(render_template("{{inputs.doc}}/{{ inputs.n }}/{{steps.a.people.0.name}}/{{item.name}}#{{index}}", ctx, "t"),
            "text/2/Ann/Bo#1");
  EXPECT_EQ(render_template("{{steps.a.people}}", ctx, "t"), R"([{"name":"Ann"}])");
  EXPECT_EQ(render_template("no braces", ctx, "t"), "no braces");
  try {
    render_template("x {{steps.a.missing}}", ctx, "step 'b': prompt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "sessions: workflow: step 'b': prompt: '{{steps.a.missing}}' has no value");
  }
  EXPECT_EQ(resolve_path(ctx, "steps.a.people.1"), nullptr);
  EXPECT_TRUE(condition_holds({"steps.a.ok", {}, {}}, ctx));
  EXPECT_FALSE(condition_holds({"steps.a.z", {}, {}}, ctx));
  EXPECT_FALSE(condition_holds({"steps.a.s", {}, {}}, ctx));
  EXPECT_FALSE(condition_holds({"steps.a.gone", {}, {}}, ctx));
  EXPECT_TRUE(condition_holds({"inputs.n", ojson(2), {}}, ctx));
  EXPECT_FALSE(condition_holds({"inputs.n", ojson("2"), {}}, ctx));
  EXPECT_TRUE(condition_holds({"inputs.doc", {}, ojson("other")}, ctx));
  EXPECT_EQ(template_paths("{{a}} and {{ b.c }}"), (std::vector<std::string>{"a", "b.c"}));
}

}  // namespace workflow_test
}  // namespace exl
