// Workflow steps with tools (runtime/workflow_agent.h) on the demo model with the real built-in
// tools; the model's turns are scripted (a ForcedTextHook per turn) because the demo model never
// saw the calculator in training: conversations call the calculator and finish with a JSON
// answer; one that keeps calling ends at max_turns with an error naming it.
#include <gtest/gtest.h>

#include <filesystem>

#include "kernels/error.h"
#include "runtime/workflow_agent.h"
#include "test_support.h"
#include "tools/builtin_tools.h"

namespace exl {
namespace workflow_agent_test {

namespace fs = std::filesystem;

std::string calculator_call(const std::string& expression) {
  return "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"" + expression + "\"}}\n</tool_call>";
}

class WorkflowAgent : public testing::Test {
 protected:
  void SetUp() override {
    const fs::path demo = test::source_dir() / "examples" / "demo-model" / "model";
    if (!fs::exists(demo / "config.json")) GTEST_SKIP() << "examples/demo-model/model is absent";
    JobEngineOptions o;
    o.model_dir = demo.string();
    o.cpu_threads = 1;
    engine_ = std::make_unique<JobEngine>(o);
    for (auto& t : make_builtin_tools(BuiltinToolOptions{})) tools_.add(std::move(t));
  }
  // Conversation c's turn n emits script[c][min(n, size) - 1]; conversations are told apart by
  // their user message.
  TurnConstraintFactory script(std::map<std::string, std::vector<std::string>> replies) {
    const Tokenizer* tok = &engine_->tokenizer();
    return [tok, replies](const AgentTurnContext& c) -> std::shared_ptr<LogitsMaskHook> {
      std::string user;
      for (const auto& m : c.messages)
        if (m.role == "user") user = m.content;
      const auto& r = replies.at(user);
      return ForcedTextHook::for_text(*tok, r[std::min<size_t>(size_t(c.turn), r.size()) - 1]);
    };
  }
  std::unique_ptr<JobEngine> engine_;
  ToolRegistry tools_;
};

TEST_F(WorkflowAgent, ConversationsCallToolsAndFinish) {
  AgentConfig config;
  config.tools = {"calculator"};
  config.final_answer_schema = nlohmann::ordered_json::parse(R"({"type":"object","properties":{"total":{"type":"number"}}})");
  config.max_turns = 3;
  const std::vector<AgentConversation> convs = {
      {{{"system", "You are a helpful assistant.", {}, {}}}, "What is 3 * 120.50?"},
      {{}, "And 0.1 + 0.2?"}};
  auto f = script({{"What is 3 * 120.50?", {calculator_call("3 * 120.50"), "{\"total\": 361.5}"}},
                   {"And 0.1 + 0.2?", {calculator_call("0.1 + 0.2"), "{\"total\": 0.3}"}}});
  const auto dir = test::temp_dir("WorkflowAgent_ok");
  auto results = run_agent_conversations(*engine_, tools_, config, "calc", convs, dir, f);
  ASSERT_EQ(results.size(), 2u);
  const std::vector<std::string> expected_tool = {"361.5", "0.3"};
  const std::vector<std::string> expected_answer = {"{\"total\": 361.5}", "{\"total\": 0.3}"};
  for (size_t i = 0; i < 2; ++i) {
    const auto& r = results[i];
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.turns, 2);
    EXPECT_EQ(r.content, expected_answer[i]);
    // [system], user, assistant (call), tool, assistant (answer)
    ASSERT_GE(r.messages.size(), 4u);
    const auto& tool = r.messages[r.messages.size() - 2];
    EXPECT_EQ(tool.role, "tool");
    EXPECT_EQ(tool.content, expected_tool[i]) << "the calculator's exact result";
    const auto& call = r.messages[r.messages.size() - 3];
    ASSERT_EQ(call.tool_calls.size(), 1u);
    EXPECT_EQ(call.tool_calls[0].name, "calculator");
    EXPECT_EQ(tool.tool_call_id, call.tool_calls[0].id);
    EXPECT_GT(r.usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0) << "turn 2 reuses turn 1's prefix";
    EXPECT_TRUE(fs::exists(dir / ("calc-" + std::to_string(i) + ".json")));
  }
  EXPECT_EQ(results[0].messages.front().role, "system");
}

TEST_F(WorkflowAgent, MaxTurnsAndUnknownToolsAreErrors) {
  AgentConfig config;
  config.tools = {"calculator"};
  config.max_turns = 2;
  auto f = script({{"loop", {calculator_call("1 + 1")}}});
  auto results = run_agent_conversations(*engine_, tools_, config, "loop", {{{}, "loop"}}, test::temp_dir("WorkflowAgent_max"), f);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results[0].ok);
  EXPECT_NE(results[0].error.find("max_turns"), std::string::npos) << results[0].error;
  EXPECT_EQ(results[0].turns, 2);

  config.tools = {"teleport"};
  EXPECT_THROW(run_agent_conversations(*engine_, tools_, config, "x", {{{}, "hi"}}, test::temp_dir("WorkflowAgent_bad")),
               Error);
}

}  // namespace workflow_agent_test
}  // namespace exl
