// The MCP server side: the protocol state machine (runtime/mcp/mcp_server.h), the stdio loop
// (runtime/mcp/mcp_stdio.h) and exlagent's extract tool on the demo model (mcp_job_tools.h).
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "runtime/job_engine.h"
#include "runtime/mcp/mcp_job_tools.h"
#include "runtime/mcp/mcp_server.h"
#include "runtime/mcp/mcp_stdio.h"
#include "test_support.h"
#include "tools/builtin_tools.h"

namespace exl {
namespace mcp_server_test {

using json = McpJson;
namespace fs = std::filesystem;

std::vector<McpServedTool> echo_tools() {
  McpServedTool echo;
  echo.name = "echo";
  echo.description = "returns its text";
  echo.input_schema = {{"type", "object"}, {"properties", {{"text", {{"type", "string"}}}}}};
  echo.run = [](const json& args, const std::atomic<bool>&) { return mcp_text_result(args.value("text", ""), false); };
  McpServedTool boom;
  boom.name = "boom";
  boom.description = "throws";
  boom.input_schema = {{"type", "object"}};
  boom.run = [](const json&, const std::atomic<bool>&) -> json { throw std::runtime_error("kaboom"); };
  return {echo, boom};
}

json only_reply(const McpStep& s) {
  EXPECT_EQ(s.replies.size(), 1u);
  return s.replies.empty() ? json() : json::parse(s.replies[0]);
}

std::string initialize_line(const std::string& version, int id = 1) {
  return json{{"jsonrpc", "2.0"},
              {"id", id},
              {"method", "initialize"},
              {"params", {{"protocolVersion", version}, {"capabilities", json::object()},
                          {"clientInfo", {{"name", "test"}, {"version", "1"}}}}}}
      .dump();
}

McpServerProtocol initialized_protocol() {
  McpServerProtocol p(echo_tools(), McpServerInfo{});
  p.handle(initialize_line("2025-06-18"));
  p.handle(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  return p;
}

TEST(McpServerProtocol, InitializeNegotiatesTheVersion) {
  for (const std::string v : {"2025-06-18", "2025-03-26", "2024-11-05"}) {
    McpServerProtocol p(echo_tools(), McpServerInfo{});
    const json r = only_reply(p.handle(initialize_line(v, 7)));
    EXPECT_EQ(r["id"], 7);
    EXPECT_EQ(r["result"]["protocolVersion"], v);
    EXPECT_EQ(r["result"]["serverInfo"]["name"], "exlagent");
    EXPECT_TRUE(r["result"]["capabilities"].contains("tools"));
  }
  McpServerProtocol p(echo_tools(), McpServerInfo{});
  EXPECT_EQ(only_reply(p.handle(initialize_line("1999-01-01")))["result"]["protocolVersion"], "2025-06-18");
  EXPECT_EQ(only_reply(p.handle(initialize_line("2025-06-18", 2)))["error"]["code"], -32600);
}

TEST(McpServerProtocol, ToolsNeedInitializeButPingDoesNot) {
  McpServerProtocol p(echo_tools(), McpServerInfo{});
  EXPECT_EQ(only_reply(p.handle(R"({"jsonrpc":"2.0","id":1,"method":"tools/list"})"))["error"]["code"], -32600);
  const json ping = only_reply(p.handle(R"({"jsonrpc":"2.0","id":"p","method":"ping"})"));
  EXPECT_EQ(ping["id"], "p");
  EXPECT_EQ(ping["result"], json::object());
}

TEST(McpServerProtocol, ListsTools) {
  McpServerProtocol p = initialized_protocol();
  const json r = only_reply(p.handle(R"({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}})"));
  ASSERT_EQ(r["result"]["tools"].size(), 2u);
  EXPECT_EQ(r["result"]["tools"][0]["name"], "echo");
  EXPECT_EQ(r["result"]["tools"][0]["inputSchema"]["type"], "object");
}

TEST(McpServerProtocol, CallIsHandedToTheTransport) {
  McpServerProtocol p = initialized_protocol();
  McpStep s = p.handle(R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}})");
  EXPECT_TRUE(s.replies.empty());
  ASSERT_TRUE(s.call);
  EXPECT_EQ(s.call->id, 3);
  EXPECT_EQ(s.call->tool->name, "echo");
  std::atomic<bool> no{false};
  const json reply = json::parse(mcp_call_reply(s.call->id, run_mcp_call(*s.call, no)));
  EXPECT_EQ(reply["result"]["content"][0]["text"], "hi");
  EXPECT_EQ(reply["result"]["isError"], false);

  McpStep b = p.handle(R"({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"boom"}})");
  ASSERT_TRUE(b.call);
  const json err = run_mcp_call(*b.call, no);
  EXPECT_EQ(err["isError"], true);
  EXPECT_NE(err["content"][0]["text"].get<std::string>().find("kaboom"), std::string::npos);
}

TEST(McpServerProtocol, BadMessagesGetTheirJsonRpcErrors) {
  McpServerProtocol p = initialized_protocol();
  struct Case {
    const char* line;
    int code;
    json id;
  };
  const Case cases[] = {
      {"not json", -32700, nullptr},
      {R"({"jsonrpc":"2.0","id":1,"method":)", -32700, nullptr},
      {R"([{"jsonrpc":"2.0","id":1,"method":"ping"}])", -32600, nullptr},
      {R"(42)", -32600, nullptr},
      {R"({"jsonrpc":"1.0","id":1,"method":"ping"})", -32600, 1},
      {R"({"jsonrpc":6,"id":1,"method":"ping"})", -32600, 1},
      {R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})", -32600, nullptr},
      {R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})", -32600, nullptr},
      {R"({"jsonrpc":"2.0","id":1})", -32600, 1},
      {R"({"jsonrpc":"2.0","id":1,"method":5})", -32600, 1},
      {R"({"jsonrpc":"2.0","id":1,"method":"resources/list"})", -32601, 1},
      {R"({"jsonrpc":"2.0","id":1,"method":"tools/list","params":[1]})", -32602, 1},
      {R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}})", -32602, 1},
      {R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}})", -32602, 1},
      {R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope"}})", -32602, 1},
      {R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":[1]}})", -32602, 1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.line);
    const json r = only_reply(p.handle(c.line));
    EXPECT_EQ(r["jsonrpc"], "2.0");
    EXPECT_EQ(r["error"]["code"], c.code);
    EXPECT_EQ(r["id"], c.id);
    EXPECT_FALSE(r["error"]["message"].get<std::string>().empty());
  }
  std::string deep(200, '[');
  deep += std::string(200, ']');
  EXPECT_EQ(only_reply(p.handle(R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":)" + deep + "}}"))["error"]["code"],
            -32600);
  EXPECT_EQ(only_reply(p.handle("\xff\xfe"))["error"]["code"], -32700);
}

TEST(McpServerProtocol, NotificationsAndResponsesAreNeverAnswered) {
  McpServerProtocol p = initialized_protocol();
  EXPECT_TRUE(p.handle(R"({"jsonrpc":"2.0","method":"notifications/whatever"})").replies.empty());
  EXPECT_TRUE(p.handle(R"({"jsonrpc":"2.0","method":"tools/list"})").replies.empty());
  EXPECT_TRUE(p.handle(R"({"jsonrpc":"2.0","id":9,"result":{}})").replies.empty());
  const McpStep c = p.handle(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r1","reason":"x"}})");
  EXPECT_TRUE(c.replies.empty());
  ASSERT_TRUE(c.cancel);
  EXPECT_EQ(*c.cancel, "r1");
}

std::vector<json> run_stdio(McpServerProtocol& p, const std::string& input, McpStdioOptions o = {}) {
  std::istringstream in(input);
  std::ostringstream out;
  serve_mcp_stdio(p, in, out, o);
  std::vector<json> replies;
  std::istringstream lines(out.str());
  for (std::string l; std::getline(lines, l);) replies.push_back(json::parse(l));
  return replies;
}

TEST(McpStdio, AnswersEveryLineAndRunsCallsInOrder) {
  McpServerProtocol p(echo_tools(), McpServerInfo{});
  const std::string input = initialize_line("2025-06-18") + "\n" +
                            R"({"jsonrpc":"2.0","method":"notifications/initialized"})" "\n\n" +
                            R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a"}}})" "\r\n" +
                            "oops\n" + std::string(300, 'x') + "\n" +
                            R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"b"}}})";
  McpStdioOptions o;
  o.max_line_bytes = 299;
  const auto r = run_stdio(p, input, o);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0]["id"], 1);
  std::vector<json> errors, results;
  for (const auto& j : r) (j.contains("error") ? errors : results).push_back(j);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0]["error"]["code"], -32700);
  EXPECT_EQ(errors[1]["error"]["code"], -32600);
  EXPECT_NE(errors[1]["error"]["message"].get<std::string>().find("longer than 299 bytes"), std::string::npos);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[1]["id"], 2);
  EXPECT_EQ(results[1]["result"]["content"][0]["text"], "a");
  EXPECT_EQ(results[2]["id"], 3);
  EXPECT_EQ(results[2]["result"]["content"][0]["text"], "b");
}

TEST(McpStdio, CancelledCallIsNotAnswered) {
  std::atomic<bool> saw_cancel{false}, ran{false};
  McpServedTool wait;
  wait.name = "wait";
  wait.input_schema = {{"type", "object"}};
  wait.run = [&](const json&, const std::atomic<bool>& cancelled) {
    ran = true;
    for (int i = 0; i < 2000 && !cancelled; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    saw_cancel = bool(cancelled);
    return mcp_text_result("done", false);
  };
  auto tools = echo_tools();
  tools.push_back(wait);
  McpServerProtocol p(tools, McpServerInfo{});
  const std::string input =
      initialize_line("2025-06-18") + "\n" +
      R"({"jsonrpc":"2.0","id":"w","method":"tools/call","params":{"name":"wait"}})" "\n" +
      R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"w"}})" "\n" +
      R"({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}})" "\n";
  const auto r = run_stdio(p, input);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["id"], 1);
  EXPECT_EQ(r[1]["id"], 5);
  EXPECT_EQ(r[1]["result"]["content"][0]["text"], "after");
  if (ran) {
    EXPECT_TRUE(saw_cancel);  // cancelled while running, or dropped from the queue before it
  }
}

struct McpJobToolsFixture : ::testing::Test {
  void SetUp() override {
    const fs::path demo = test::source_dir() / "examples" / "demo-model" / "model";
    if (!fs::exists(demo / "config.json")) GTEST_SKIP() << "examples/demo-model/model is absent";
    JobEngineOptions o;
    o.model_dir = demo.string();
    o.cpu_threads = 1;
    o.max_batch_seqs = 1;
    engine = std::make_unique<JobEngine>(o);
    for (auto& t : make_builtin_tools({})) registry.add(std::move(t));
    McpJobToolsOptions to;
    to.transcript_dir = fs::temp_directory_path() / "exl_mcp_server_test";
    fs::create_directories(to.transcript_dir);
    tools = mcp_job_tools(*engine, registry, to);
  }
  json call(const std::string& name, const json& args, bool cancel = false) {
    for (const auto& t : tools)
      if (t.name == name) {
        std::atomic<bool> c{cancel};
        return run_mcp_call(McpCall{1, &t, args}, c);
      }
    ADD_FAILURE() << "no tool " << name;
    return {};
  }
  std::unique_ptr<JobEngine> engine;
  ToolRegistry registry;
  std::vector<McpServedTool> tools;
};

TEST_F(McpJobToolsFixture, ExtractReturnsTheSchemasObject) {
  const json schema = json::parse(test::read_file(test::source_dir() / "examples/extraction/schema.json"));
  const json r = call("extract", {{"document", test::read_file(test::source_dir() / "examples/extraction/input.txt")},
                                  {"schema", schema}});
  ASSERT_EQ(r["isError"], false) << r.dump();
  const json obj = r["structuredContent"];
  EXPECT_EQ(obj["invoice_number"], "INV-20417");
  EXPECT_EQ(obj["customer"], "Maria Rossi");
  EXPECT_TRUE(obj["amount"].is_number());
  EXPECT_EQ(json::parse(r["content"][0]["text"].get<std::string>()), obj);
  // Properties in the schema's order, as `exlagent extract` writes them.
  EXPECT_EQ(r["content"][0]["text"].get<std::string>().rfind("{\"invoice_number\"", 0), 0u);
}

TEST_F(McpJobToolsFixture, ExtractReportsBadArgumentsAndCancellation) {
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}};
  auto text = [](const json& r) { return r["content"][0]["text"].get<std::string>(); };
  json r = call("extract", {{"schema", schema}});
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("'document'"), std::string::npos);
  r = call("extract", {{"document", "x"}, {"schema", "nope"}});
  EXPECT_NE(text(r).find("argument 'schema' must be an object"), std::string::npos);
  r = call("extract", {{"document", "x"}, {"schema", {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"pattern", "("}}}}}}}});
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("argument 'schema'"), std::string::npos);
  r = call("extract", {{"document", "x"}, {"schema", schema}, {"extra", 1}});
  EXPECT_NE(text(r).find("unknown argument 'extra'"), std::string::npos);
  r = call("extract", {{"document", "x"}, {"schema", schema}}, true);
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(text(r).find("cancelled"), std::string::npos) << r.dump();
  EXPECT_EQ(engine->in_flight(), 0);
  r = call("agent", {{"message", "hi"}, {"tools", {"no_such_tool"}}});
  EXPECT_NE(text(r).find("no tool 'no_such_tool'"), std::string::npos);
}

}  // namespace mcp_server_test
}  // namespace exl
