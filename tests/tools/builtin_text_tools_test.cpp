// regex_extract, json_query and current_time.
#include <gtest/gtest.h>

#include "tools/builtin_tools.h"
#include "tool_test_util.h"

namespace exl {
namespace builtin_text_tools_test {

using nlohmann::json;
using test::contains;

class TextTools : public ::testing::Test {
 protected:
  TextTools() {
    opts.clock = [this] { return now; };
    for (auto& t : make_builtin_tools(opts)) reg.add(t);
  }
  ToolResult call(const std::string& name, const json& args) { return test::call_now(reg, name, args); }
  json ok_json(const std::string& name, const json& args) {
    ToolResult r = call(name, args);
    EXPECT_FALSE(r.is_error) << args.dump() << " -> " << r.content;
    return r.is_error ? json() : json::parse(r.content);
  }
  BuiltinToolOptions opts;
  std::chrono::system_clock::time_point now{std::chrono::seconds(1709251170)};  // 2024-02-29T23:59:30Z
  ToolRegistry reg;
};

TEST_F(TextTools, BuiltinSetWithoutReadRoot) {
  std::vector<std::string> names;
  for (const ToolSpec& s : reg.list()) {
    names.push_back(s.name);
    EXPECT_EQ(s.input_schema.at("additionalProperties"), false) << s.name;
    EXPECT_FALSE(s.description.empty());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"calculator", "current_time", "json_query", "regex_extract"}));
}

TEST_F(TextTools, RegexAllMatchesWithGroups) {
  json out = ok_json("regex_extract", {{"text", "a1b22c333"}, {"pattern", "([a-z])(\\d+)"}});
  EXPECT_EQ(out["count"], 3);
  EXPECT_EQ(out["truncated"], false);
  EXPECT_EQ(out["matches"][0], json({{"match", "a1"}, {"start", 0}, {"end", 2}, {"groups", {"a", "1"}}}));
  EXPECT_EQ(out["matches"][1], json({{"match", "b22"}, {"start", 2}, {"end", 5}, {"groups", {"b", "22"}}}));
  EXPECT_EQ(out["matches"][2], json({{"match", "c333"}, {"start", 5}, {"end", 9}, {"groups", {"c", "333"}}}));
}

TEST_F(TextTools, RegexNamedAndUnmatchedGroups) {
  json out = ok_json("regex_extract", {{"text", "x=1, yy=22"}, {"pattern", "(?P<key>\\w+)=(?P<val>\\d+)"}});
  ASSERT_EQ(out["count"], 2);
  EXPECT_EQ(out["matches"][1]["named"], json({{"key", "yy"}, {"val", "22"}}));
  out = ok_json("regex_extract", {{"text", "b"}, {"pattern", "(a)|(b)"}});
  EXPECT_EQ(out["matches"][0]["groups"], json::parse("[null, \"b\"]"));
  EXPECT_FALSE(out["matches"][0].contains("named"));
}

TEST_F(TextTools, RegexEmptyMatchesAdvanceByCodePoint) {
  json out = ok_json("regex_extract", {{"text", "\xc3\xa9z"}, {"pattern", "x*"}});  // "éz"
  ASSERT_EQ(out["count"], 3);
  EXPECT_EQ(out["matches"][0]["start"], 0);
  EXPECT_EQ(out["matches"][1]["start"], 2);
  EXPECT_EQ(out["matches"][2]["start"], 3);
}

TEST_F(TextTools, RegexFlagsAndLimits) {
  EXPECT_EQ(ok_json("regex_extract", {{"text", "ABC abc"}, {"pattern", "abc"}})["count"], 1);
  EXPECT_EQ(ok_json("regex_extract", {{"text", "ABC abc"}, {"pattern", "abc"}, {"flags", "i"}})["count"], 2);
  EXPECT_EQ(ok_json("regex_extract", {{"text", "a\nb"}, {"pattern", "^\\w"}})["count"], 1);
  EXPECT_EQ(ok_json("regex_extract", {{"text", "a\nb"}, {"pattern", "^\\w"}, {"flags", "m"}})["count"], 2);
  EXPECT_EQ(ok_json("regex_extract", {{"text", "a\nb"}, {"pattern", "a.b"}})["count"], 0);
  EXPECT_EQ(ok_json("regex_extract", {{"text", "a\nb"}, {"pattern", "a.b"}, {"flags", "s"}})["count"], 1);
  json out = ok_json("regex_extract", {{"text", "1 2 3 4"}, {"pattern", "\\d"}, {"max_matches", 2}});
  EXPECT_EQ(out["count"], 2);
  EXPECT_EQ(out["truncated"], true);
}

TEST_F(TextTools, RegexErrors) {
  ToolResult r = call("regex_extract", {{"text", "x"}, {"pattern", "(abc"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "regex_extract: invalid pattern: missing ): (abc");
  r = call("regex_extract", {{"text", "x"}, {"pattern", "a(?=b)"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(r.content.starts_with("regex_extract: invalid pattern: ")) << r.content;
  r = call("regex_extract", {{"text", "x"}, {"pattern", "x"}, {"flags", "g"}});
  EXPECT_TRUE(r.content.starts_with("invalid arguments for tool 'regex_extract': ")) << r.content;
  r = call("regex_extract", {{"pattern", "x"}});
  EXPECT_TRUE(contains(r.content, "missing required property 'text'")) << r.content;
  // Called directly (no schema check), the tool still refuses an unknown flag.
  r = test::invoke_now(*reg.find("regex_extract"), {{"text", "x"}, {"pattern", "x"}, {"flags", "g"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "regex_extract: unknown flag 'g' (use i, m, s)");
}

const json kDoc = json::parse(R"({"a": {"b": [{"c": 1}, {"c": "two"}]}, "k.dots": true, "x/y": null, "t~": 5})");

TEST_F(TextTools, JsonQueryDottedPaths) {
  auto q = [&](const json& doc, const std::string& path) {
    ToolResult r = call("json_query", {{"json", doc}, {"path", path}});
    EXPECT_FALSE(r.is_error) << path << " -> " << r.content;
    return r.content;
  };
  EXPECT_EQ(q(kDoc, "a.b[1].c"), "\"two\"");
  EXPECT_EQ(q(kDoc, "$.a.b[0]"), "{\"c\":1}");
  EXPECT_EQ(q(kDoc, "$"), kDoc.dump());
  EXPECT_EQ(q(kDoc, "['k.dots']"), "true");
  EXPECT_EQ(q(kDoc, "$[\"x/y\"]"), "null");
  EXPECT_EQ(q(json("[1, [2, 3]]"), "[1][0]"), "2");  // a string is parsed as JSON text
  EXPECT_EQ(q(json::array({10, 20}), "[1]"), "20");
}

TEST_F(TextTools, JsonQueryPointers) {
  auto q = [&](const std::string& path) { return call("json_query", {{"json", kDoc}, {"path", path}}); };
  EXPECT_EQ(q("/a/b/0/c").content, "1");
  EXPECT_EQ(q("").content, kDoc.dump());
  EXPECT_EQ(q("/x~1y").content, "null");
  EXPECT_EQ(q("/t~0").content, "5");
  ToolResult r = q("/a/zz");
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(r.content.starts_with("json_query: JSON Pointer '/a/zz': ")) << r.content;
  EXPECT_TRUE(q("/a/b/5").is_error);
  EXPECT_TRUE(q("/a/b/~2").is_error);
}

TEST_F(TextTools, JsonQueryErrors) {
  auto q = [&](const json& doc, const std::string& path) { return call("json_query", {{"json", doc}, {"path", path}}); };
  EXPECT_EQ(q(kDoc, "a.zz").content, "json_query: path 'a.zz': $.a has no key 'zz'");
  EXPECT_EQ(q(kDoc, "a.b[2]").content, "json_query: path 'a.b[2]': index 2 out of range: $.a.b has 2 items");
  EXPECT_EQ(q(kDoc, "a[0]").content, "json_query: path 'a[0]': $.a is object, not an array");
  EXPECT_EQ(q(kDoc, "a.b.c").content, "json_query: path 'a.b.c': $.a.b is array, not an object");
  EXPECT_EQ(q(kDoc, "a..b").content, "json_query: path 'a..b' at position 3: empty key");
  EXPECT_EQ(q(kDoc, "a[x]").content, "json_query: path 'a[x]' at position 3: expected an array index or a quoted key");
  EXPECT_EQ(q(kDoc, "a[0").content, "json_query: path 'a[0' at position 4: expected ']'");
  EXPECT_EQ(q(kDoc, "['a").content, "json_query: path '['a' at position 4: unterminated quoted key");
  ToolResult r = q(json("{not json"), "a");
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(r.content.starts_with("json_query: 'json' is a string but not a JSON text: ")) << r.content;
  r = call("json_query", {{"path", "a"}});
  EXPECT_TRUE(contains(r.content, "missing required property 'json'")) << r.content;
}

TEST_F(TextTools, CurrentTimeFromInjectedClock) {
  EXPECT_EQ(call("current_time", json::object()).content, "2024-02-29T23:59:30Z");
  EXPECT_EQ(call("current_time", {{"timezone", "UTC"}}).content, "2024-02-29T23:59:30Z");
  EXPECT_EQ(call("current_time", {{"timezone", "Z"}}).content, "2024-02-29T23:59:30Z");
  EXPECT_EQ(call("current_time", {{"timezone", "+05:30"}}).content, "2024-03-01T05:29:30+05:30");
  EXPECT_EQ(call("current_time", {{"timezone", "-08:00"}}).content, "2024-02-29T15:59:30-08:00");
  EXPECT_EQ(call("current_time", {{"timezone", "+14:00"}}).content, "2024-03-01T13:59:30+14:00");
  now = std::chrono::system_clock::time_point{};
  EXPECT_EQ(call("current_time", json::object()).content, "1970-01-01T00:00:00Z");
  EXPECT_EQ(call("current_time", {{"timezone", "-00:30"}}).content, "1969-12-31T23:30:00-00:30");
  now = std::chrono::system_clock::time_point{std::chrono::seconds(4107542399)};  // 2100 is no leap year
  EXPECT_EQ(call("current_time", json::object()).content, "2100-02-28T23:59:59Z");
  EXPECT_EQ(call("current_time", {{"timezone", "+01:00"}}).content, "2100-03-01T00:59:59+01:00");
}

TEST_F(TextTools, CurrentTimeRejectsBadZones) {
  ToolResult r = call("current_time", {{"timezone", "+15:00"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "current_time: timezone '+15:00' is outside -12:00..+14:00");
  for (const char* tz : {"EST", "+5:30", "05:30", "+05:60", ""}) {
    r = call("current_time", {{"timezone", tz}});
    EXPECT_TRUE(r.is_error) << tz;
    EXPECT_TRUE(r.content.starts_with("invalid arguments for tool 'current_time'")) << r.content;
  }
  r = test::invoke_now(*reg.find("current_time"), {{"timezone", "EST"}});
  EXPECT_EQ(r.content, "current_time: timezone 'EST' is not UTC, Z or an offset like +05:30");
}

TEST_F(TextTools, RealClockIsNearNow) {
  BuiltinToolOptions real;
  ToolResult r = test::invoke_now(*make_current_time_tool(real), json::object());
  EXPECT_FALSE(r.is_error);
  EXPECT_EQ(r.content.size(), 20u) << r.content;
  EXPECT_EQ(r.content.back(), 'Z');
}

}  // namespace builtin_text_tools_test
}  // namespace exl
