// An agent session whose tools come from an MCP server (tests/tools/fake_mcp_server.py through
// tools/mcp/): stories260K on the CPU with scripted turns (ForcedTextHook, the mistral tool format)
// calls `fake__add` and gets the server's answer back as its tool message; a server that crashes
// mid-call gives the session a tool error naming the server, and the run still ends.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>

#include <boost/asio/thread_pool.hpp>

#include "runtime/server/server_state.h"
#include "sessions/agent_session.h"
#include "test_support.h"
#include "tools/mcp/mcp_client.h"
#include "tools/tool_registry.h"

namespace exl {
namespace mcp_agent_session_test {

using json = nlohmann::json;

struct McpEvents {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<AgentEvent> all;
  AgentSink sink() {
    return [this](const AgentEvent& e) {
      std::lock_guard lk(mu);
      all.push_back(e);
      cv.notify_all();
    };
  }
  json wait_done() {
    std::unique_lock lk(mu);
    json out;
    cv.wait_for(lk, std::chrono::seconds(60), [&] {
      for (const auto& e : all)
        if (e.type == "done") {
          out = e.data;
          return true;
        }
      return false;
    });
    return out;
  }
  std::vector<AgentEvent> of(const std::string& type) {
    std::lock_guard lk(mu);
    std::vector<AgentEvent> v;
    for (const auto& e : all)
      if (e.type == type) v.push_back(e);
    return v;
  }
};

class McpAgentSessionTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = test::shared_dir() / "models/stories260K-hf";
    if (!std::filesystem::exists(dir / "model.safetensors")) return;
    ServerOptions o;
    o.model_dir = dir.string();
    o.page_size = 16;
    o.cache_pages = 128;
    o.cpu_threads = 1;
    o.chat_template = "mistral";  // compact tool format: stories260K's context is 512 tokens
    state_ = std::make_unique<ServerState>(o);
    state_->generator().start();
  }
  static void TearDownTestSuite() { state_.reset(); }
  void SetUp() override {
    if (!state_) GTEST_SKIP() << "shared asset missing: models/stories260K-hf";
    dir_ = std::filesystem::temp_directory_path() /
           ("exl-mcp-agent-" + std::to_string(::getpid()) + "-" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    McpServerConfig c;
    c.name = "fake";
    c.argv = {"python3", std::string(EXL_SOURCE_DIR) + "/tests/tools/fake_mcp_server.py"};
    c.kill_grace = std::chrono::milliseconds(500);
    client_ = McpClient::start(c);
    ASSERT_TRUE(register_mcp_tools(registry_, client_).empty());
  }
  void TearDown() override {
    client_.reset();
    std::filesystem::remove_all(dir_);
  }

  AgentEnv env(std::vector<std::string> replies) {
    AgentEnv e;
    e.generator = &state_->generator();
    e.tokenizer = &state_->tokenizer();
    e.chat_template = state_->chat_template();
    e.encode_prompt = [](const RenderedPrompt& p) { return state_->encode_prompt(p); };
    e.find_tool = [this](const std::string& name) { return registry_.find(name); };
    const Tokenizer* tok = e.tokenizer;
    e.constraint = [tok, replies](const AgentTurnContext& c) -> std::shared_ptr<LogitsMaskHook> {
      return ForcedTextHook::for_text(*tok, replies[std::min<size_t>(size_t(c.turn), replies.size()) - 1]);
    };
    e.executor = pool_.get_executor();
    e.dir = dir_;
    e.context_length = state_->context_length();
    return e;
  }

  static std::unique_ptr<ServerState> state_;
  boost::asio::thread_pool pool_{1};
  std::filesystem::path dir_;
  ToolRegistry registry_;
  std::shared_ptr<McpClient> client_;  // after registry_: stops before it goes
};
std::unique_ptr<ServerState> McpAgentSessionTest::state_;

TEST_F(McpAgentSessionTest, TheSessionCallsAnMcpToolAndGetsItsResult) {
  AgentConfig cfg;
  cfg.tools = {"fake__add"};
  McpEvents ev;
  auto s = AgentSession::create(env({"[TOOL_CALLS] [{\"name\": \"fake__add\", \"arguments\": {\"a\": 2, \"b\": 3}}]",
                                     "It is 5."}),
                                "s-mcp-add", cfg, ev.sink());
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

TEST_F(McpAgentSessionTest, AServerCrashMidCallIsAToolErrorNotAHang) {
  AgentConfig cfg;
  cfg.tools = {"fake__crash"};
  McpEvents ev;
  auto s = AgentSession::create(env({"[TOOL_CALLS] [{\"name\": \"fake__crash\", \"arguments\": {}}]", "It failed."}),
                                "s-mcp-crash", cfg, ev.sink());
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

}  // namespace mcp_agent_session_test
}  // namespace exl
