// McpClient over Streamable HTTP (--mcp NAME=http://...) against tests/tools/fake_mcp_http_server.py
// (JSON and event-stream answers, Mcp-Session-Id, the server's ping, progress and list_changed on
// a call's stream, list_changed on the GET stream, a call past its timeout, a cancelled call, a
// session the server forgot, HTTP 500, a body that is not JSON, a server that exits mid-call, the
// DELETE at the end) and the real @modelcontextprotocol/server-everything in streamableHttp mode
// (skipped when `npm ci` has not been run in tests/node).
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "kernels/error.h"
#include "test_support.h"
#include "tools/mcp/child_process.h"
#include "tools/mcp/mcp_client.h"
#include "tools/tool_registry.h"
#include "tools/fake_mcp_fixture.h"
#include "tools/tool_test_util.h"

namespace exl {
namespace mcp_http_client_test {

using json = nlohmann::json;
using test::contains;

// Reads the port the fake server prints first.
int read_port(ChildProcess& p) {
  std::string line;
  for (;;) {
    pollfd pf{p.stdout_fd(), POLLIN, 0};
    if (::poll(&pf, 1, 10000) <= 0) return -1;
    char ch;
    if (::read(p.stdout_fd(), &ch, 1) != 1) return -1;
    if (ch == '\n') return std::stoi(line);
    line += ch;
  }
}

class McpHttpClientTest : public test::FakeMcpRecordTest {
 protected:
  McpHttpClientTest() : FakeMcpRecordTest("exl-mcp-http-") {}
  void SetUp() override {
    FakeMcpRecordTest::SetUp();
    server_ = ChildProcess::spawn({"python3", std::string(EXL_SOURCE_DIR) + "/tests/tools/fake_mcp_http_server.py",
                                   "--record", record_.string()});
    port_ = read_port(*server_);
    ASSERT_GT(port_, 0) << "the fake server did not print its port";
  }
  void TearDown() override {
    if (server_) server_->stop(std::chrono::milliseconds(200));
    FakeMcpRecordTest::TearDown();
  }
  McpServerConfig config() {
    McpServerConfig c = parse_mcp_server_flag("web=http://127.0.0.1:" + std::to_string(port_) + "/mcp");
    c.kill_grace = std::chrono::milliseconds(1000);
    return c;
  }
  std::unique_ptr<ChildProcess> server_;
  int port_ = -1;
};

TEST(McpHttpFlag, ParsesUrlsAndRefusesWhatItCannotReach) {
  McpServerConfig c = parse_mcp_server_flag("docs= http://127.0.0.1:3001/mcp?x=1 ");
  EXPECT_EQ(c.name, "docs");
  EXPECT_EQ(c.url, "http://127.0.0.1:3001/mcp?x=1");
  EXPECT_TRUE(c.argv.empty());
  const std::pair<const char*, const char*> bad[] = {{"docs=https://example.com/mcp", "no TLS"},
                                                     {"docs=http://", "names no host"},
                                                     {"docs=http://a b/mcp", "is not a URL"},
                                                     {"docs=http://u:p@host/mcp", "user information"}};
  for (const auto& [flag, why] : bad) {
    try {
      parse_mcp_server_flag(flag);
      ADD_FAILURE() << flag;
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "--mcp docs: ")) << e.what();
      EXPECT_TRUE(contains(e.what(), why)) << e.what();
    }
  }
}

TEST_F(McpHttpClientTest, ListsAndCallsOverJsonAndEventStreams) {
  auto c = McpClient::start(config());
  EXPECT_EQ(c->protocol_version(), "2025-06-18");
  EXPECT_EQ(c->server_info()["name"], "fake-http");
  ToolRegistry reg;
  EXPECT_TRUE(register_mcp_tools(reg, c).empty());
  ASSERT_TRUE(reg.contains("web__add"));
  ToolResult r = test::call_now(reg, "web__add", {{"a", 2}, {"b", 40}});
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_EQ(r.content, "42") << "the result after a progress event and a ping on the call's event stream";
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "hi"}}).content, "echo: hi");
  bool initialized = false, pong = false;
  for (const auto& n : recorded_with("notification")) {
    EXPECT_EQ(n["session"], "sess-1") << n;
    initialized |= n["notification"] == "notifications/initialized";
    pong |= n["reply"] == true && n["id"] == "srv-ping" && n["result"] == json::object();
  }
  EXPECT_TRUE(initialized);
  EXPECT_TRUE(pong) << "the server's ping is answered with a POST";
  const auto calls = recorded_with("call");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["version"], "2025-06-18") << "MCP-Protocol-Version once agreed";
  EXPECT_TRUE(contains(c->log(), "[progress]")) << c->log();
}

TEST_F(McpHttpClientTest, ATimeoutAndACancelSendCancelledAndTheSessionStaysUsable) {
  McpServerConfig cfg = config();
  cfg.call_timeout = std::chrono::milliseconds(300);
  auto c = McpClient::start(cfg);
  ToolResult r = test::call_mcp(*c, "sleep", {{"ms", 1500}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "MCP server 'web': tool 'sleep' timed out after ")) << r.content;
  auto cancel = std::make_shared<CancelToken>();
  std::thread t([cancel] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel->cancel();
  });
  r = test::call_mcp(*c, "sleep", {{"ms", 1500}}, cancel);
  t.join();
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "MCP server 'web': tool 'sleep' was cancelled")) << r.content;
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "still"}}).content, "echo: still");
  std::vector<std::string> reasons;
  for (const auto& n : recorded_with("notification"))
    if (n["notification"] == "notifications/cancelled") reasons.push_back(n["params"]["reason"]);
  EXPECT_EQ(reasons, (std::vector<std::string>{"timed out", "cancelled by the caller"}));
}

TEST_F(McpHttpClientTest, ASessionTheServerEndedIsReinitializedOnce) {
  auto c = McpClient::start(config());
  EXPECT_EQ(test::call_mcp(*c, "forget", json::object()).content, "forgotten");
  ToolResult r = test::call_mcp(*c, "echo", {{"text", "a"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "failed: the server ended the session (HTTP 404")) << r.content;
  r = test::call_mcp(*c, "echo", {{"text", "b"}});
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_EQ(r.content, "echo: b");
  EXPECT_EQ(recorded_with("initialize").size(), 2u);
  EXPECT_EQ(recorded_with("call").back()["session"], "sess-2");
}

TEST_F(McpHttpClientTest, HttpErrorsAndBadBodiesAreToolErrors) {
  auto c = McpClient::start(config());
  ToolResult r = test::call_mcp(*c, "http500", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "failed: the server answered HTTP 500 Internal Server Error: 'server exploded'"))
      << r.content;
  r = test::call_mcp(*c, "garbage", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "sent a body that is not JSON: 'this is not json'")) << r.content;
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "fine"}}).content, "echo: fine");
}

TEST_F(McpHttpClientTest, AServerThatGoesAwayGivesToolErrorsNotHangs) {
  auto c = McpClient::start(config());
  ToolResult r = test::call_mcp(*c, "exit", json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "closed its event stream without answering")) << r.content;
  EXPECT_EQ(server_->stop(std::chrono::milliseconds(2000)), "exit status 3");
  r = test::call_mcp(*c, "echo", {{"text", "anyone?"}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(contains(r.content, "could not be reached at http://127.0.0.1:")) << r.content;
  EXPECT_TRUE(contains(r.content, "connect: Connection refused")) << r.content;
}

TEST_F(McpHttpClientTest, ListChangedOnACallsStreamReRegistersTheTools) {
  test::expect_list_changed_reregisters(McpClient::start(config()), "web", "echo");
}

TEST_F(McpHttpClientTest, ListChangedOnTheGetStreamReRegistersTheTools) {
  auto c = McpClient::start(config());
  ToolRegistry reg;
  register_mcp_tools(reg, c);
  test::poll_until([&] { return !recorded_with("get").empty(); }, 500);
  const auto gets = recorded_with("get");
  ASSERT_EQ(gets.size(), 1u) << "the GET stream is opened once initialized";
  EXPECT_EQ(gets[0]["get"], "sess-1");
  EXPECT_FALSE(reg.contains("web__extra2"));
  EXPECT_EQ(test::call_now(reg, "web__change_later", json::object()).content, "notified 1");
  test::poll_until([&] { return reg.contains("web__extra2"); }, 1000);
  EXPECT_TRUE(reg.contains("web__extra2"));
}

TEST_F(McpHttpClientTest, DestroyingTheClientDeletesTheSession) {
  auto c = McpClient::start(config());
  EXPECT_EQ(test::call_mcp(*c, "echo", {{"text", "x"}}).content, "echo: x");
  c.reset();
  const auto deleted = recorded_with("deleted");
  ASSERT_EQ(deleted.size(), 1u);
  EXPECT_EQ(deleted[0]["deleted"], "sess-1");
}

TEST_F(McpHttpClientTest, AnUnreachableServerFailsTheStart) {
  McpServerConfig cfg = config();
  server_->stop(std::chrono::milliseconds(200));
  cfg.start_timeout = std::chrono::milliseconds(3000);
  try {
    McpClient::start(cfg);
    ADD_FAILURE() << "started";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "tools: mcp: server 'web' (http://127.0.0.1:")) << e.what();
    EXPECT_TRUE(contains(e.what(), "initialize: could not be reached")) << e.what();
  }
}

// A free TCP port on loopback (bound and released; the server binds it right after).
int free_port() {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor a(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

bool wait_listening(int port) {
  for (int i = 0; i < 200; ++i) {
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::socket s(ioc);
    boost::system::error_code ec;
    s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
    if (!ec) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(McpRealHttpServer, ServerEverythingOverStreamableHttp) {
  const auto bin = std::filesystem::path(EXL_SOURCE_DIR) / "tests/node/node_modules/.bin/mcp-server-everything";
  if (!std::filesystem::exists(bin))
    GTEST_SKIP() << "tests/node/node_modules absent: run `npm ci` in tests/node for @modelcontextprotocol/server-everything";
  const int port = free_port();
  auto server = ChildProcess::spawn({"sh", "-c", "PORT=" + std::to_string(port) + " exec \"$0\" streamableHttp >/dev/null 2>&1",
                                     bin.string()});
  ASSERT_TRUE(wait_listening(port)) << "server-everything streamableHttp did not listen on " << port;
  {
    McpServerConfig cfg = parse_mcp_server_flag("everything=http://127.0.0.1:" + std::to_string(port) + "/mcp");
    ToolRegistry reg;
    test::expect_server_everything_echoes_and_sums(McpClient::start(cfg), reg, "over http");
  }
  server->stop(std::chrono::milliseconds(500));
}

}  // namespace mcp_http_client_test
}  // namespace exl
