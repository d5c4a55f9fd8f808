#include "tools/tool_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "kernels/error.h"
#include "tools/function_tool.h"
#include "tool_test_util.h"

namespace exl {
namespace tool_registry_test {

using nlohmann::json;
using test::call_now;
using test::contains;

const json kSchema = {{"type", "object"},
                      {"properties",
                       {{"a", {{"type", "string"}}},
                        {"n", {{"type", "integer"}, {"minimum", 1}}},
                        {"tags", {{"type", "array"}, {"items", {{"type", "string"}}}, {"maxItems", 2}}},
                        {"mode", {{"enum", {"fast", "slow"}}}}}},
                      {"required", {"a"}},
                      {"additionalProperties", false}};

std::shared_ptr<Tool> echo_tool(const std::string& name, json schema = kSchema) {
  return std::make_shared<FunctionTool>(ToolSpec{name, "echoes its arguments", std::move(schema)},
                                        [](const json& args, const CancelToken&) { return ToolResult{args.dump()}; });
}

TEST(ToolRegistry, AddFindListRemove) {
  ToolRegistry reg;
  reg.add(echo_tool("zeta"));
  reg.add(echo_tool("alpha"));
  reg.add(echo_tool("mid-1_x"));
  EXPECT_EQ(reg.size(), 3u);
  ASSERT_NE(reg.find("alpha"), nullptr);
  EXPECT_EQ(reg.find("alpha")->spec().name, "alpha");
  EXPECT_EQ(reg.find("beta"), nullptr);
  auto specs = reg.list();
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "alpha");
  EXPECT_EQ(specs[1].name, "mid-1_x");
  EXPECT_EQ(specs[2].name, "zeta");
  EXPECT_EQ(specs[0].input_schema, kSchema);
  EXPECT_TRUE(reg.remove("alpha"));
  EXPECT_FALSE(reg.remove("alpha"));
  EXPECT_FALSE(reg.contains("alpha"));
  EXPECT_EQ(reg.size(), 2u);
}

TEST(ToolRegistry, RefusesBadNamesDuplicatesAndUnenforceableSchemas) {
  ToolRegistry reg;
  reg.add(echo_tool("t"));
  try {
    reg.add(echo_tool("t"));
    FAIL() << "duplicate accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "tools: registry: a tool named 't' already exists")) << e.what();
  }
  for (const std::string& bad : std::vector<std::string>{"", "has space", "dot.name", std::string(65, 'a'), "é"})
    EXPECT_THROW(reg.add(echo_tool(bad)), Error) << bad;
  EXPECT_NO_THROW(reg.add(echo_tool(std::string(64, 'a'))));
  try {
    reg.add(echo_tool("cond", {{"type", "object"}, {"$recursiveRef", "#node"}}));
    FAIL() << "unsupported schema accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "tools: registry: tool 'cond': tools: arguments: input schema: grammar: json_schema:"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "'$recursiveRef'")) << e.what();
  }
  EXPECT_THROW(reg.add(nullptr), Error);
  EXPECT_EQ(reg.size(), 2u);
}

TEST(ToolRegistry, RemoveOwnerDropsOnlyThatClientsTools) {
  ToolRegistry reg;
  reg.add(echo_tool("builtin"));
  reg.add(echo_tool("r1"), "conn-7");
  reg.add(echo_tool("r2"), "conn-7");
  reg.add(echo_tool("r3"), "conn-8");
  auto gone = reg.remove_owner("conn-7");
  EXPECT_EQ(gone, (std::vector<std::string>{"r1", "r2"}));
  EXPECT_TRUE(reg.contains("builtin"));
  EXPECT_TRUE(reg.contains("r3"));
  EXPECT_FALSE(reg.contains("r1"));
  EXPECT_TRUE(reg.remove_owner("conn-7").empty());
  // The name is free again.
  EXPECT_NO_THROW(reg.add(echo_tool("r1"), "conn-9"));
}

TEST(ToolRegistry, ValidArgumentsReachTheTool) {
  ToolRegistry reg;
  reg.add(echo_tool("t"));
  const json args = {{"a", "x"}, {"n", 2}, {"tags", {"p", "q"}}, {"mode", "slow"}};
  EXPECT_EQ(reg.check("t", args), std::nullopt);
  ToolResult r = call_now(reg, "t", args);
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_EQ(json::parse(r.content), args);
}

struct BadCase {
  json args;
  std::string message;
};

TEST(ToolRegistry, InvalidArgumentsAreErrorsNamingTheProblem) {
  ToolRegistry reg;
  reg.add(echo_tool("t"));
  const std::string prefix = "invalid arguments for tool 't': arguments do not match the input schema: ";
  const std::vector<BadCase> cases = {
      {json::object(), "at top level: missing required property 'a'"},
      {{{"a", 1}}, "at '/a': expected string, got integer"},
      {{{"a", "x"}, {"zz", 1}}, "at top level: unexpected property 'zz'"},
      {{{"a", "x"}, {"n", 0}}, "at '/n': below minimum 1"},
      {{{"a", "x"}, {"n", 1.5}}, "at '/n': expected integer, got number"},
      {{{"a", "x"}, {"tags", {"p", 3}}}, "at '/tags/1': expected string, got integer"},
      {{{"a", "x"}, {"tags", {"p", "q", "r"}}}, "at '/tags': more than maxItems 2 items"},
      {{{"a", "x"}, {"mode", "medium"}}, "at '/mode': must be one of [\"fast\",\"slow\"]"},
      {json::array({1}), "at top level: expected object, got array"},
      {json("text"), "at top level: expected object, got string"},
  };
  for (const BadCase& c : cases) {
    auto bad = reg.check("t", c.args);
    ASSERT_TRUE(bad.has_value()) << c.args.dump();
    EXPECT_TRUE(bad->is_error);
    EXPECT_EQ(bad->content, prefix + c.message) << c.args.dump();
    ToolResult r = call_now(reg, "t", c.args);
    EXPECT_TRUE(r.is_error);
    EXPECT_EQ(r.content, bad->content);
  }
  // 1.0 is an integer (JSON Schema draft-06 on), as the argument grammar allows
  EXPECT_FALSE(reg.check("t", json{{"a", "x"}, {"n", 2.0}}).has_value());
}

TEST(ToolRegistry, MissingSchemaMeansAnyObject) {
  ToolRegistry reg;
  reg.add(echo_tool("free", json()));
  EXPECT_EQ(reg.check("free", {{"anything", {1, "two", nullptr}}}), std::nullopt);
  EXPECT_EQ(reg.check("free", json::object()), std::nullopt);
  auto bad = reg.check("free", json::array());
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(contains(bad->content, "at top level: expected object, got array")) << bad->content;
}

TEST(ToolRegistry, DeeplyNestedArgumentsAreRefusedNotACrash) {
  ToolRegistry reg;
  reg.add(echo_tool("free", json()));
  json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = json::array({std::move(deep)});
  auto bad = reg.check("free", {{"x", deep}});
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->content, "invalid arguments for tool 'free': arguments are nested deeper than 256 levels");
}

TEST(ToolRegistry, InvalidUtf8AndUnknownTool) {
  ToolRegistry reg;
  reg.add(echo_tool("t"));
  auto bad = reg.check("t", {{"a", std::string("\xff\xfe")}});
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(contains(bad->content, "not valid UTF-8")) << bad->content;
  ToolResult r = call_now(reg, "nope", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "unknown tool 'nope'");
}

TEST(ToolRegistry, ValidationWithRefsAndAnyOfStillLocatesTheValue) {
  const json schema = {{"type", "object"},
                       {"$defs", {{"pt", {{"type", "object"}, {"properties", {{"x", {{"type", "number"}}}}},
                                          {"required", {"x"}}, {"additionalProperties", false}}}}},
                       {"properties", {{"p", {{"$ref", "#/$defs/pt"}}}, {"v", {{"anyOf", {{{"type", "string"}}, {{"type", "null"}}}}}}}},
                       {"required", {"p"}},
                       {"additionalProperties", false}};
  ToolRegistry reg;
  reg.add(echo_tool("r", schema));
  EXPECT_EQ(reg.check("r", {{"p", {{"x", 2.5}}}, {"v", nullptr}}), std::nullopt);
  auto bad = reg.check("r", {{"p", {{"x", "no"}}}});
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(contains(bad->content, "at '/p/x': value \"no\" does not match the schema")) << bad->content;
  bad = reg.check("r", {{"p", {{"x", 1}}}, {"v", 3}});
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(contains(bad->content, "at '/v'")) << bad->content;
}

TEST(ToolRegistry, ConcurrentAddRemoveAndCalls) {
  ToolRegistry reg;
  reg.add(echo_tool("stable"));
  std::atomic<int> ok{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        const std::string name = "t" + std::to_string(t) + "_" + std::to_string(i);
        reg.add(echo_tool(name), "owner" + std::to_string(t));
        ToolResult r = call_now(reg, i % 2 ? name : "stable", {{"a", name}});
        (r.is_error ? errors : ok)++;
        if (i % 3 == 0) reg.remove(name);
        (void)reg.list();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 100);
  EXPECT_EQ(errors.load(), 0);
  size_t left = 0;
  for (int t = 0; t < 4; ++t) left += reg.remove_owner("owner" + std::to_string(t)).size();
  EXPECT_EQ(left, 4u * (25 - 9));
  EXPECT_EQ(reg.size(), 1u);
}

}  // namespace tool_registry_test
}  // namespace exl
