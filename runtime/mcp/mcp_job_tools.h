// exlagent's work as MCP tools (what `exlagent mcp-serve` offers), on one JobEngine:
//  - `extract`: {document, schema, instructions?, max_tokens?} -> the object extracted from the
//    document under the JSON Schema, as `exlagent extract` makes it (sessions/extraction_prompt.h,
//    generated under the schema's grammar, greedy): JSON text in a text block and, when it is an
//    object, structuredContent. A schema the grammar engine cannot compile, or a reply cut off at
//    max_tokens, is an isError result saying so. Cancelling stops the generation.
//  - `agent`: {message, system?, tools?, max_turns?} -> one agent session turn (the agent loop of
//    runtime/workflow_agent.h) with the built-in tools (all of them unless `tools` names some):
//    the final answer as text, structuredContent {answer, turns}. Cancelling drops the reply but
//    lets the turn end (at most max_turns generations).
// The tools run on one thread at a time (the stdio worker); the engine and registry must outlive
// them. Bad arguments (a missing document, a schema that is not an object, an unknown tool name)
// are isError results naming the argument.
#pragma once
#include <filesystem>
#include <vector>

#include "runtime/job_engine.h"
#include "runtime/mcp/mcp_server.h"
#include "tools/tool_registry.h"

namespace exl {

struct McpJobToolsOptions {
  std::filesystem::path transcript_dir;  // agent transcripts (runtime/workflow_agent.h)
  int64_t agent_max_tokens = 512;        // per agent generation
};

std::vector<McpServedTool> mcp_job_tools(JobEngine& engine, const ToolRegistry& tools, McpJobToolsOptions options);

}  // namespace exl
