// An agent session whose tools come from an MCP server (tests/tools/fake_mcp_server.py through
// tools/mcp/): stories260K on the CPU with scripted turns (ForcedTextHook, the mistral tool format)
// calls `fake__add` and gets the server's answer back as its tool message; a server that crashes
// mid-call gives the session a tool error naming the server, and the run still ends; cancelling
// the session cancels the server's call.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <thread>
#include <mutex>

#include <boost/asio/thread_pool.hpp>

#include "runtime/server/server_state.h"
#include "sessions/agent_session.h"
#include "scripted_agent_fixture.h"
#include "test_support.h"
#include "tools/mcp/mcp_client.h"
#include "tools/tool_registry.h"

namespace exl {
namespace mcp_agent_session_test {

using json = nlohmann::json;

using McpEvents = test::AgentEventLog;

class McpAgentSessionTest : public test::ScriptedAgentTest {
 protected:
  void SetUp() override {
    ScriptedAgentTest::SetUp();
    if (IsSkipped()) return;
    record_ = dir_.string() + "-record.jsonl";
    std::filesystem::remove(record_);
    McpServerConfig c;
    c.name = "fake";
    c.argv = {"python3", std::string(EXL_SOURCE_DIR) + "/tests/tools/fake_mcp_server.py", "--record", record_};
    c.kill_grace = std::chrono::milliseconds(500);
    client_ = McpClient::start(c);
    ASSERT_TRUE(register_mcp_tools(registry_, client_).empty());
  }
  void TearDown() override {
    client_.reset();
    if (!record_.empty()) std::filesystem::remove(record_);
    ScriptedAgentTest::TearDown();
  }
  // The params of the notifications/cancelled the fake server received (waits up to 5 s for one).
  json cancelled() {
    for (int i = 0; i < 500; ++i) {
      std::ifstream in(record_);
      for (std::string line; std::getline(in, line);) {
        const json j = json::parse(line);
        if (j.value("notification", "") == "notifications/cancelled") return j["params"];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return nullptr;
  }
  AgentEnv env(std::vector<std::string> replies) {
    return scripted_env(std::move(replies), [this](const std::string& name) { return registry_.find(name); });
  }
  // A session offered only `tool` whose scripted model calls it with `arguments` (JSON text), then
  // says `final_reply`.
  std::shared_ptr<AgentSession> calling_session(const std::string& tool, const std::string& arguments,
                                                const std::string& final_reply, const std::string& id,
                                                McpEvents& ev) {
    AgentConfig cfg;
    cfg.tools = {tool};
    return AgentSession::create(
        env({"[TOOL_CALLS] [{\"name\": \"" + tool + "\", \"arguments\": " + arguments + "}]", final_reply}), id, cfg,
        ev.sink());
  }

  ToolRegistry registry_;
  std::shared_ptr<McpClient> client_;  // after registry_: stops before it goes
  std::string record_;
};

TEST_F(McpAgentSessionTest, TheSessionCallsAnMcpToolAndGetsItsResult) {
  McpEvents ev;
  auto s = calling_session("fake__add", R"({"a": 2, "b": 3})", "It is 5.", "s-mcp-add", ev);
  ASSERT_TRUE(s->send("add 2 and 3"));
  json done = ev.wait_done();
  EXPECT_EQ(done["reason"], "final") << (ev.of("error").empty() ? json() : ev.of("error")[0].data).dump();
  ASSERT_EQ(ev.of("tool_result").size(), 1u);
  const json r = ev.of("tool_result")[0].data;
  EXPECT_EQ(r["name"], "fake__add");
  EXPECT_EQ(r["content"], "5");
  EXPECT_EQ(r["isError"], false);
  bool tool_message = false;
  for (const auto& m : s->messages()) tool_message |= m.role == "tool" && m.content == "5";
  EXPECT_TRUE(tool_message) << "the result goes back to the model as a tool message";
}

TEST_F(McpAgentSessionTest, AServersProgressBecomesToolProgressEvents) {
  McpEvents ev;
  auto s = calling_session("fake__progress", "{}", "Done.", "s-mcp-progress", ev);
  ASSERT_TRUE(s->send("go"));
  EXPECT_EQ(ev.wait_done()["reason"], "final");
  ASSERT_EQ(ev.of("tool_call").size(), 1u);
  const auto progress = ev.of("tool_progress");
  ASSERT_EQ(progress.size(), 2u) << ev.errors();
  for (int k = 0; k < 2; ++k) {
    const json& p = progress[size_t(k)].data;
    EXPECT_EQ(p["id"], ev.of("tool_call")[0].data["id"]);
    EXPECT_EQ(p["name"], "fake__progress");
    EXPECT_EQ(p["progress"], k + 1);
    EXPECT_EQ(p["total"], 2);
    EXPECT_EQ(p["message"], "step " + std::to_string(k + 1));
  }
  ASSERT_EQ(ev.of("tool_result").size(), 1u);
  EXPECT_FALSE(ev.of("tool_result")[0].data["isError"].get<bool>());
}

TEST_F(McpAgentSessionTest, AServerCrashMidCallIsAToolErrorNotAHang) {
  McpEvents ev;
  auto s = calling_session("fake__crash", "{}", "It failed.", "s-mcp-crash", ev);
  ASSERT_TRUE(s->send("crash it"));
  json done = ev.wait_done();
  EXPECT_EQ(done["reason"], "final");
  ASSERT_EQ(ev.of("tool_result").size(), 1u);
  const json r = ev.of("tool_result")[0].data;
  EXPECT_EQ(r["isError"], true);
  EXPECT_NE(r["content"].get<std::string>().find("MCP server 'fake': tool 'crash' failed: the server exited"),
            std::string::npos)
      << r["content"];
}

// Cancelling the session while the MCP server works on its call tells the server
// (notifications/cancelled), at once rather than at the call's timeout.
TEST_F(McpAgentSessionTest, CancellingTheSessionCancelsTheServersCall) {
  McpEvents ev;
  auto s = calling_session("fake__sleep", R"({"ms": 20000})", "Done.", "s-mcp-cancel", ev);
  ASSERT_TRUE(s->send("sleep"));
  for (int i = 0; i < 6000 && ev.of("tool_call").empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(ev.of("tool_call").size(), 1u) << ev.errors();
  s->cancel();
  EXPECT_EQ(ev.wait_done()["reason"], "cancelled");
  EXPECT_EQ(cancelled(), (json{{"requestId", 4}, {"reason", "cancelled by the caller"}}))
      << "request 4: initialize, two pages of tools/list, the call";
}

}  // namespace mcp_agent_session_test
}  // namespace exl
