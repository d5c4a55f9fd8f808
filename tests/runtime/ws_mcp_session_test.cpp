// MCP servers per WebSocket session (`serve --mcp-session NAME=...`, sessions/create
// "mcpServers"): a session starts its own instance of tests/tools/fake_mcp_server.py, its scripted
// turn (stories260K, mistral format) calls the instance's tool, other sessions do not see it, and
// the process stops when the session is closed or its connection goes.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

#include "runtime/server/server.h"
#include "runtime/server/session_hub.h"
#include "test_server.h"
#include "test_support.h"
#include "ws_test_client.h"

namespace exl {
namespace ws_mcp_session_test {

using json = nlohmann::json;
using test::WsTestClient;
namespace fs = std::filesystem;

constexpr const char* kKey = "ws-mcp-key";

class WsMcpSession : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = test::shared_dir() / "models/stories260K-hf";
    if (!fs::exists(dir / "model.safetensors")) return;
    tmp_ = fs::temp_directory_path() / ("exl-ws-mcp-" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
    ServerOptions o = test::test_server_options(dir, kKey);
    o.page_size = 16;
    o.session_dir = (tmp_ / "sessions").string();
    o.chat_template = "mistral";
    McpServerConfig fake = parse_mcp_server_flag("fake=python3 " + std::string(EXL_SOURCE_DIR) +
                                                 "/tests/tools/fake_mcp_server.py --record " + record().string());
    fake.kill_grace = std::chrono::milliseconds(500);
    o.session_mcp_servers.push_back(fake);
    server_ = std::make_unique<test::TestServer>(o);
    state_ = server_->state;
    state_->sessions().set_turn_constraint(scripted_turns(
        state_->tokenizer(), {"[TOOL_CALLS] [{\"name\": \"fake__add\", \"arguments\": {\"a\": 2, \"b\": 3}}]", "It is 5."}));
  }
  static void TearDownTestSuite() {
    server_.reset();
    state_.reset();
    fs::remove_all(tmp_);
  }
  void SetUp() override {
    if (!server_) GTEST_SKIP() << "shared asset missing: models/stories260K-hf";
    fs::remove(record());
  }
  static fs::path record() { return tmp_ / "record.jsonl"; }
  // The pids of the fake servers started so far.
  static std::vector<pid_t> started() {
    std::vector<pid_t> out;
    std::ifstream in(record());
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("started")) out.push_back(j["started"].get<pid_t>());
    }
    return out;
  }
  static bool gone(pid_t pid) {
    for (int i = 0; i < 300; ++i) {
      if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  static std::string create(WsTestClient& c, json params) {
    json r = c.call("sessions/create", params);
    EXPECT_TRUE(r.contains("result")) << r;
    return r.contains("result") ? r["result"]["sessionId"].get<std::string>() : "";
  }

  static inline std::shared_ptr<ServerState> state_;
  static inline std::unique_ptr<test::TestServer> server_;
  static inline fs::path tmp_;
};

TEST_F(WsMcpSession, ASessionCallsItsOwnServerWhichStopsWithIt) {
  WsTestClient c(server_->port(), kKey);
  EXPECT_EQ(c.call("tools/list")["result"]["mcpSession"], json::array({"fake"}));
  const std::string sid = create(c, {{"tools", {"fake__add"}}, {"mcpServers", {"fake"}}, {"maxTokens", 64}});
  ASSERT_FALSE(sid.empty());
  ASSERT_EQ(started().size(), 1u) << "the session's own server";
  const pid_t pid = started()[0];
  EXPECT_EQ(::kill(pid, 0), 0);
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "add 2 and 3"}}).contains("result"));
  auto result = c.next_of("sessions/event", "tool_result");
  ASSERT_TRUE(result) << json(c.seen()).dump();
  EXPECT_EQ((*result)["params"]["name"], "fake__add");
  EXPECT_EQ((*result)["params"]["content"], "5");
  EXPECT_EQ((*result)["params"]["isError"], false);
  auto done = c.next_of("sessions/event", "done");
  ASSERT_TRUE(done);
  EXPECT_EQ((*done)["params"]["reason"], "final");

  json other = c.call("sessions/create", {{"tools", {"fake__add"}}});
  ASSERT_TRUE(other.contains("error")) << other;
  EXPECT_EQ(other["error"]["code"], -32602);
  EXPECT_NE(other["error"]["message"].get<std::string>().find("unknown tool 'fake__add'"), std::string::npos) << other;

  ASSERT_TRUE(c.call("sessions/close", {{"sessionId", sid}}).contains("result"));
  EXPECT_TRUE(gone(pid)) << "the session's MCP server outlived it";
}

TEST_F(WsMcpSession, EachSessionHasItsOwnProcessAndADroppedConnectionStopsThem) {
  std::vector<pid_t> pids;
  {
    WsTestClient c(server_->port(), kKey);
    create(c, {{"tools", {"fake__echo"}}, {"mcpServers", {"fake"}}});
    create(c, {{"mcpServers", {"fake"}}});
    pids = started();
    ASSERT_EQ(pids.size(), 2u);
    EXPECT_NE(pids[0], pids[1]);
    c.drop();
  }
  for (pid_t p : pids) EXPECT_TRUE(gone(p)) << p;
}

TEST_F(WsMcpSession, UnknownOrRepeatedServersAreInvalidParams) {
  WsTestClient c(server_->port(), kKey);
  for (const json& bad : {json{{"mcpServers", {"nope"}}}, json{{"mcpServers", {"fake", "fake"}}},
                          json{{"mcpServers", "fake"}}}) {
    json r = c.call("sessions/create", bad);
    ASSERT_TRUE(r.contains("error")) << r;
    EXPECT_EQ(r["error"]["code"], -32602) << r;
  }
  json r = c.call("sessions/create", {{"mcpServers", {"nope"}}});
  EXPECT_NE(r["error"]["message"].get<std::string>().find("no MCP server 'nope' for sessions (declared: fake)"),
            std::string::npos)
      << r;
  EXPECT_TRUE(started().empty()) << "nothing started for a refused session";
}

}  // namespace ws_mcp_session_test
}  // namespace exl
