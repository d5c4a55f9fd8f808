// AgentSession without sockets: stories260K on the CPU with scripted turns (ForcedTextHook, since
// the tiny model cannot call tools and the tool-call grammar is not wired in yet) and in-process
// tools. Covers max_turns, tool errors and unknown tools going back to the model, cancellation
// during a tool call, and the transcript: atomic save, load and continue after a "restart".
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <boost/asio/thread_pool.hpp>

#include "kernels/error.h"
#include "runtime/server/server_state.h"
#include "sessions/agent_session.h"
#include "scripted_agent_fixture.h"
#include "test_support.h"

namespace exl {
namespace agent_session_test {

using json = nlohmann::json;
constexpr const char* kCall = "[TOOL_CALLS] [{\"name\": \"echo\", \"arguments\": {\"x\": 1}}]";

using Events = test::AgentEventLog;

// A tool that answers with its arguments, or never (to be cancelled or time out).
class EchoTool : public Tool {
 public:
  explicit EchoTool(bool hang) : hang_(hang) { spec_ = {"echo", "echoes", {{"type", "object"}}}; }
  const ToolSpec& spec() const override { return spec_; }
  void invoke(const json& args, ToolClock::time_point, std::shared_ptr<CancelToken>, ToolDone done) override {
    if (!hang_) done({"echo " + args.dump(), false});
    else held = std::move(done);
    ++calls;
  }
  std::atomic<int> calls{0};
  ToolDone held;

 private:
  ToolSpec spec_;
  bool hang_;
};

class AgentSessionTest : public test::ScriptedAgentTest {
 protected:
  AgentEnv env(std::vector<std::string> replies, std::shared_ptr<Tool> tool) {
    return scripted_env(std::move(replies),
                        [tool](const std::string& name) { return tool && tool->spec().name == name ? tool : nullptr; });
  }
};

TEST_F(AgentSessionTest, StopsAtMaxTurns) {
  auto tool = std::make_shared<EchoTool>(false);
  AgentConfig cfg;
  cfg.tools = {"echo"};
  cfg.max_turns = 3;
  Events ev;
  auto s = AgentSession::create(env({kCall}, tool), "s-max", cfg, ev.sink());
  ASSERT_TRUE(s->send("go"));
  EXPECT_FALSE(s->send("again")) << "a second run while one is going";
  json done = ev.wait_done();
  EXPECT_EQ(done["reason"], "max_turns") << ev.errors();
  EXPECT_EQ(done["turns"], 3);
  EXPECT_EQ(tool->calls, 3);
  ASSERT_EQ(ev.of("tool_result").size(), 3u);
  EXPECT_EQ(ev.of("tool_result")[0].data["content"], "echo {\"x\":1}");
  EXPECT_EQ(ev.of("turn_end").size(), 3u);
  EXPECT_EQ(done["usage"]["completion_tokens"].get<int64_t>(), [&] {
    int64_t n = 0;
    for (const auto& e : ev.of("turn_end")) n += e.data["usage"]["completion_tokens"].get<int64_t>();
    return n;
  }());
}

TEST_F(AgentSessionTest, UnknownToolAndBadArgumentsGoBackToTheModel) {
  const char* bad = "[TOOL_CALLS] [{\"name\": \"nope\", \"arguments\": {}}]";
  AgentConfig cfg;
  cfg.tools = {"echo"};
  Events ev;
  auto s = AgentSession::create(env({bad, "Sorry."}, std::make_shared<EchoTool>(false)), "s-unknown", cfg, ev.sink());
  ASSERT_TRUE(s->send("go"));
  json done = ev.wait_done();
  EXPECT_EQ(done["reason"], "final") << ev.errors();
  ASSERT_EQ(ev.of("tool_result").size(), 1u);
  EXPECT_EQ(ev.of("tool_result")[0].data["isError"], true);
  EXPECT_NE(ev.of("tool_result")[0].data["content"].get<std::string>().find("unknown tool 'nope'"), std::string::npos);
}

TEST_F(AgentSessionTest, CancelDuringToolCallAndResumeFromDisk) {
  auto tool = std::make_shared<EchoTool>(true);
  AgentConfig cfg;
  cfg.system = "sys";
  cfg.tools = {"echo"};
  Events ev;
  auto s = AgentSession::create(env({kCall, "Done."}, tool), "s-cancel", cfg, ev.sink());
  ASSERT_TRUE(s->send("go"));
  for (int i = 0; i < 1000 && tool->calls == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(tool->calls, 1);
  s->cancel();
  json done = ev.wait_done();
  EXPECT_EQ(done["reason"], "cancelled");
  tool->held({"late", false});  // a late result is ignored
  const auto msgs = s->messages();
  ASSERT_EQ(msgs.size(), 4u);
  EXPECT_EQ(msgs[3].role, "tool");
  EXPECT_EQ(msgs[3].content, "Error: cancelled");
  s->close();
  s.reset();

  // The transcript on disk matches and continues after a "restart".
  EXPECT_FALSE(std::filesystem::exists(dir_ / "s-cancel.json.tmp"));
  Transcript t = load_transcript(dir_, "s-cancel");
  EXPECT_EQ(t.messages.size(), 4u);
  EXPECT_EQ(t.config.tools, cfg.tools);
  Events ev2;
  auto r = AgentSession::load(env({"Resumed answer."}, std::make_shared<EchoTool>(false)), "s-cancel", ev2.sink());
  ASSERT_TRUE(r->send("continue"));
  json done2 = ev2.wait_done();
  ASSERT_EQ(done2["reason"], "final") << ev2.errors();
  EXPECT_NE(done2["content"].get<std::string>().find("Resumed answer."), std::string::npos);
  EXPECT_EQ(load_transcript(dir_, "s-cancel").messages.size(), 6u);
  r->close();
}

TEST_F(AgentSessionTest, TranscriptErrorsAreClear) {
  EXPECT_THROW(load_transcript(dir_, "../x"), Error);
  EXPECT_THROW(load_transcript(dir_, "s-missing"), Error);
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "s-bad.json") << "{\"version\":1,\"messages\":[{\"content\":1}]}";
  try {
    load_transcript(dir_, "s-bad");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s-bad.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(agent_config_from_json({{"maxTurns", "ten"}}), Error);
  EXPECT_THROW(agent_config_from_json({{"tools", "echo"}}), Error);
  AgentConfig c = agent_config_from_json({{"maxTurns", 3}, {"sampling", {{"temperature", 0}, {"seed", 7}}}});
  EXPECT_EQ(agent_config_from_json(to_json(c)).max_turns, 3);
  EXPECT_EQ(*agent_config_from_json(to_json(c)).sampling.seed, 7u);
}

}  // namespace agent_session_test
}  // namespace exl
