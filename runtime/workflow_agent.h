// Workflow steps with tools: each of the step's conversations runs the agent loop
// (sessions/agent_session.h) on the JobEngine's model — generate under the turn grammar (a call of
// an offered built-in tool with valid arguments, or the final answer: schema-valid JSON when the
// step has a schema), run the tools, feed the results back — until a final answer or max_turns.
// Conversations of one step run together (continuous batching). Each conversation's transcript
// is kept as <transcript_dir>/<step>-<index>.json.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job_engine.h"
#include "sessions/agent_constraint.h"
#include "sessions/agent_transcript.h"
#include "tools/tool_registry.h"

namespace exl {

struct AgentConversation {
  std::vector<ChatMessage> history;  // system message and earlier turns
  std::string user;                  // the new user message
};

struct AgentConversationResult {
  bool ok = false;
  std::string error;                  // when !ok: the run's error or why it ended (max_turns)
  std::string content;                // the final answer's text
  std::vector<ChatMessage> messages;  // the whole conversation, tool calls and results included
  int turns = 0;
  nlohmann::ordered_json usage;       // OpenAI-shaped, summed over the run's generations
};

// `config.tools` must name tools in `tools`. Blocks until every conversation has ended; throws
// exl::Error only for setup failures (transcript directory, unknown tool). `constraint` replaces
// the turn grammar (tests script the model's turns with it; see sessions/agent_constraint.h).
std::vector<AgentConversationResult> run_agent_conversations(JobEngine& engine, const ToolRegistry& tools,
                                                             const AgentConfig& config, const std::string& step,
                                                             const std::vector<AgentConversation>& conversations,
                                                             const std::filesystem::path& transcript_dir,
                                                             TurnConstraintFactory constraint = {});

}  // namespace exl
