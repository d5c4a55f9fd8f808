// McpClient against tests/tools/fake_mcp_server.py (deterministic: paginated tools/list, content
// blocks, a crash mid-call, a call past its timeout, garbage, a wrong id, an oversized line,
// list_changed) and against the real @modelcontextprotocol/server-everything from tests/node
// (skipped when `npm ci` has not been run there).
#include <gtest/gtest.h>

#include <mutex>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "kernels/error.h"
#include "test_support.h"
#include "tools/mcp/child_process.h"
#include "tools/mcp/mcp_client.h"
#include "tools/tool_registry.h"
#include "tools/fake_mcp_fixture.h"
#include "tools/tool_test_util.h"

namespace exl {
namespace mcp_client_test {

using json = nlohmann::json;
using test::contains;

std::string fake_server() { return std::string(EXL_SOURCE_DIR) + "/tests/tools/fake_mcp_server.py"; }

class McpClientTest : public test::FakeMcpRecordTest {
 protected:
  McpClientTest() : FakeMcpRecordTest("exl-mcp-") {}

  McpServerConfig config(std::vector<std::string> extra = {}) {
    McpServerConfig c;
    c.name = "fake";
    c.argv = {"python3", fake_server(), "--record", record_.string()};
    c.argv.insert(c.argv.end(), extra.begin(), extra.end());
    c.kill_grace = std::chrono::milliseconds(500);
    return c;
  }
  int starts() {
    int n = 0;
    for (const auto& j : recorded()) n += j.contains("started");
    return n;
  }
};

TEST(McpCommandLine, SplitsOnSpacesWithSimpleQuoting) {
  EXPECT_EQ(split_command_line("  npx -y  @mcp/server  "), (std::vector<std::string>{"npx", "-y", "@mcp/server"}));
  EXPECT_EQ(split_command_line(R"(run 'a b' "c \"d\" \\e" f\ g h'i'j)"),
            (std::vector<std::string>{"run", "a b", "c \"d\" \\e", "f g", "hij"}));
  EXPECT_EQ(split_command_line("x ''"), (std::vector<std::string>{"x", ""}));
  EXPECT_THROW(split_command_line("a 'b"), Error);
  EXPECT_THROW(split_command_line("a \"b"), Error);
  EXPECT_THROW(split_command_line("a b\\"), Error);
}

TEST(McpCommandLine, ParsesTheFlag) {
  McpServerConfig c = parse_mcp_server_flag("fs=node 'my server.js' /tmp");
  EXPECT_EQ(c.name, "fs");
  EXPECT_EQ(c.argv, (std::vector<std::string>{"node", "my server.js", "/tmp"}));
  for (const char* bad : {"node server.js", "=node", "a_b=node", "fs=", "fs=   "}) {
    try {
      parse_mcp_server_flag(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "--mcp")) << e.what();
    }
  }
}

TEST(McpResult, ContentBlocksBecomeText) {
  ToolResult r = mcp_tool_result({{"content", {{{"type", "text"}, {"text", "a"}},
                                               {{"type", "audio"}, {"mimeType", "audio/wav"}, {"data", ""}},
                                               {{"type", "resource_link"}, {"uri", "file:///x"}},
                                               {{"type", "resource"}, {"resource", {{"uri", "file:///b"}}}}}},
                                  {"isError", true}});
  EXPECT_EQ(r.content, "a\n[audio: audio/wav]\n[resource link: file:///x]\n[resource: file:///b]");
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(mcp_tool_result(json::array()).is_error);
}

// A descriptor opened without O_CLOEXEC (as Asio opens sockets) must not reach the server: an
// inherited WebSocket connection stayed open while the child ran, so closing it never ended it.
TEST(McpChildProcess, TheChildInheritsOnlyItsThreePipes) {
  int leak[2];
  ASSERT_EQ(::pipe(leak), 0);
  auto p = ChildProcess::spawn({"sh", "-c", "ls /proc/$$/fd"});
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(p->stdout_fd(), buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  EXPECT_EQ(p->stop(std::chrono::milliseconds(1000)), "exit status 0");
  ::close(leak[0]);
  ::close(leak[1]);
  std::istringstream fds(out);
  std::vector<int> seen;
  for (int fd; fds >> fd;) seen.push_back(fd);
  EXPECT_FALSE(seen.empty()) << out;
  for (int fd : seen) EXPECT_TRUE(fd <= 2 || (fd != leak[0] && fd != leak[1])) << "inherited fd " << fd << ": " << out;
}

TEST_F(McpClientTest, ListsEveryPageAndCallsThroughTheRegistry) {
  auto c = McpClient::start(config());
  EXPECT_EQ(c->protocol_version(), "2025-06-18");
  EXPECT_EQ(c->server_info()["name"], "fake-mcp");
  EXPECT_EQ(c->remote_tools().size(), 13u) << "both pages of tools/list";
  ToolRegistry reg;
  EXPECT_TRUE(register_mcp_tools(reg, c).empty());
  ASSERT_TRUE(reg.contains("fake__add"));
  ASSERT_TRUE(reg.contains("fake__sleep"));
  ToolResult r = test::call_now(reg, "fake__add", {{"a", 2}, {"b", 40}});
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_EQ(r.content, "42");
  r = test::call_now(reg, "fake__add", {{"a", "two"}, {"b", 40}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "invalid arguments for tool 'fake__add'")) << r.content;
  const auto notes = recorded();
  ASSERT_GE(notes.size(), 2u);
  EXPECT_EQ(notes[1]["notification"], "notifications/initialized");
}

TEST_F(McpClientTest, AcceptsAnOlderProtocolAndRefusesAnUnknownOne) {
  EXPECT_EQ(McpClient::start(config({"--protocol", "2024-11-05"}))->protocol_version(), "2024-11-05");
  try {
    McpClient::start(config({"--protocol", "1999-01-01"}));
    ADD_FAILURE() << "started";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "server 'fake'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "protocol version '1999-01-01'")) << e.what();
  }
}

TEST_F(McpClientTest, AProgramThatCannotStartIsAClearError) {
  McpServerConfig c = config();
  c.argv = {"/nonexistent/mcp-server"};
  try {
    McpClient::start(c);
    ADD_FAILURE() << "started";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cannot start '/nonexistent/mcp-server': No such file")) << e.what();
  }
}

TEST_F(McpClientTest, ResultsErrorsAndStructuredContent) {
  auto c = McpClient::start(config());
  ToolResult r = test::call_mcp(*c, "image", json::object());
  EXPECT_EQ(r.content, "a picture:\n[image: image/png]\nresource text");
  EXPECT_FALSE(r.is_error);
  r = test::call_mcp(*c, "structured", json::object());
  EXPECT_EQ(json::parse(r.content), (json{{"n", 1}, {"ok", true}}));
  r = test::call_mcp(*c, "fail", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "it went wrong");
  r = test::call_mcp(*c, "rpc_error", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "MCP server 'fake': tool 'rpc_error' failed: bad params here (code -32602)");
}

TEST_F(McpClientTest, ATimeoutSendsCancelledAndTheServerStaysUsable) {
  McpServerConfig cfg = config();
  cfg.call_timeout = std::chrono::milliseconds(300);
  auto c = McpClient::start(cfg);
  ToolResult r = test::call_mcp(*c, "sleep", {{"ms", 1500}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "MCP server 'fake': tool 'sleep' timed out after")) << r.content;
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "hi"}}).content, "echo: hi");
  bool cancelled = false;
  for (const auto& j : recorded())
    if (j.value("notification", "") == "notifications/cancelled") cancelled = j["params"]["requestId"] == 4;
  EXPECT_TRUE(cancelled) << "notifications/cancelled for request 4 (initialize, 2 pages, the call)";
}

TEST_F(McpClientTest, ACancelledCallSendsCancelled) {
  auto c = McpClient::start(config());
  auto cancel = std::make_shared<CancelToken>();
  std::promise<ToolResult> p;
  auto f = p.get_future();
  c->call("sleep", {{"ms", 3000}}, ToolClock::now() + std::chrono::seconds(30),
          [&p](ToolResult r) { p.set_value(std::move(r)); }, cancel);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  cancel->cancel();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(2)), std::future_status::ready) << "the cancel is not seen";
  const ToolResult r = f.get();
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "MCP server 'fake': tool 'sleep' was cancelled (notifications/cancelled sent)");
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "after"}}).content, "echo: after");
  json cancelled;
  for (const auto& j : recorded())
    if (j.value("notification", "") == "notifications/cancelled") cancelled = j["params"];
  EXPECT_EQ(cancelled, (json{{"requestId", 4}, {"reason", "cancelled by the caller"}}));
}

TEST_F(McpClientTest, ACrashMidCallIsAToolErrorThenOneRestart) {
  auto c = McpClient::start(config());
  ToolResult r = test::call_mcp(*c, "crash", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "MCP server 'fake': tool 'crash' failed: the server exited (exit status 3)"))
      << r.content;
  EXPECT_TRUE(contains(r.content, "crashing on purpose")) << "its stderr: " << r.content;
  EXPECT_TRUE(contains(c->log(), "crashing on purpose"));
  r = test::call_mcp(*c, "echo", {{"text", "again"}});
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_EQ(r.content, "echo: again");
  EXPECT_EQ(starts(), 2);
  EXPECT_TRUE(test::call_mcp(*c, "crash", json::object()).is_error);
  r = test::call_mcp(*c, "echo", {{"text", "third"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "MCP server 'fake' is not running")) << r.content;
  EXPECT_TRUE(contains(r.content, "already restarted 1 time")) << r.content;
  EXPECT_EQ(starts(), 2);
}

TEST_F(McpClientTest, MalformedLinesAreClearErrors) {
  McpServerConfig cfg = config();
  cfg.max_line_bytes = 4096;
  auto c = McpClient::start(cfg);
  ToolResult r = test::call_mcp(*c, "garbage", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "sent a line that is not JSON: 'this is not json'")) << r.content;
  r = test::call_mcp(*c, "wrong_id", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "answered request id 1005, which was never sent")) << r.content;
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "still here"}}).content, "echo: still here");
  r = test::call_mcp(*c, "huge", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "sent a line longer than 4096 bytes")) << r.content;
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "restarted"}}).content, "echo: restarted");
  EXPECT_EQ(starts(), 2);
}

// A caller that wants progress (a sink on its CancelToken) sends a progressToken in _meta; the
// server's notifications/progress for it reach the sink. Without a sink no token is sent.
TEST_F(McpClientTest, ProgressReachesTheCallersTokenOnlyWhenItAsks) {
  auto c = McpClient::start(config());
  std::mutex mu;
  std::vector<ToolProgress> seen;
  auto token = std::make_shared<CancelToken>();
  token->set_progress_sink([&](const ToolProgress& p) {
    std::lock_guard lk(mu);
    seen.push_back(p);
  });
  std::promise<ToolResult> p;
  auto f = p.get_future();
  c->call("progress", json::object(), ToolClock::now() + std::chrono::seconds(30),
          [&p](ToolResult r) { p.set_value(std::move(r)); }, token);
  const ToolResult r = f.get();
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_TRUE(contains(r.content, "token \"exl-")) << r.content;
  {
    std::lock_guard lk(mu);
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0].progress, 1);
    EXPECT_EQ(seen[1].progress, 2);
    EXPECT_EQ(seen[1].total, 2);
    EXPECT_EQ(seen[1].message, "step 2");
  }
  EXPECT_EQ(test::call_mcp(*c, "progress", json::object()).content, "token null");
}

TEST_F(McpClientTest, ListChangedReRegistersTheTools) {
  test::expect_list_changed_reregisters(McpClient::start(config()), "fake", "add");
}

TEST_F(McpClientTest, DestroyingTheClientEndsTheServer) {
  auto c = McpClient::start(config());
  const auto notes = recorded();
  ASSERT_FALSE(notes.empty());
  const pid_t pid = notes[0]["started"].get<int>();
  EXPECT_EQ(::kill(pid, 0), 0);
  c.reset();
  EXPECT_EQ(::kill(pid, 0), -1) << "the server is still running";
  EXPECT_EQ(errno, ESRCH);
}

TEST(McpRealServer, ServerEverythingListsAndCalls) {
  const auto bin = std::filesystem::path(EXL_SOURCE_DIR) / "tests/node/node_modules/.bin/mcp-server-everything";
  if (!std::filesystem::exists(bin))
    GTEST_SKIP() << "tests/node/node_modules absent: run `npm ci` in tests/node for @modelcontextprotocol/server-everything";
  McpServerConfig cfg;
  cfg.name = "everything";
  cfg.argv = {bin.string()};
  auto c = McpClient::start(cfg);
  ToolRegistry reg;
  test::expect_server_everything_echoes_and_sums(c, reg, "hello from exlagent");
  ASSERT_TRUE(reg.contains("everything__get-sum"));
  ToolResult r = test::call_now(reg, "everything__echo", {{"message", 7}});
  EXPECT_TRUE(r.is_error) << "the registry checks the server's input schema";
}

}  // namespace mcp_client_test
}  // namespace exl
