#include "runtime/mcp/mcp_job_tools.h"

#include <optional>

#include "kernels/error.h"
#include "runtime/workflow_agent.h"
#include "sessions/extraction_prompt.h"

namespace exl {

namespace {


McpJson mcp_extract_input_schema() {
  return McpJson::parse(R"js({
    "type": "object",
    "properties": {
      "document": {"type": "string", "description": "the text to extract from"},
      "schema": {"type": "object", "description": "JSON Schema of the object to extract"},
      "instructions": {"type": "string", "description": "instructions for the model (default: a generic extraction instruction)"},
      "max_tokens": {"type": "integer", "minimum": 1, "description": "tokens for the object (default: the rest of the context)"}
    },
    "required": ["document", "schema"],
    "additionalProperties": false
  })js");
}

McpJson mcp_agent_input_schema() {
  return McpJson::parse(R"js({
    "type": "object",
    "properties": {
      "message": {"type": "string", "description": "the user message"},
      "system": {"type": "string", "description": "system prompt"},
      "tools": {"type": "array", "items": {"type": "string"}, "description": "built-in tools to offer (default: all)"},
      "max_turns": {"type": "integer", "minimum": 1, "maximum": 32, "description": "model generations (default 10)"}
    },
    "required": ["message"],
    "additionalProperties": false
  })js");
}

// The argument `key` when it has the JSON type `is`; nullopt when absent; throws when mistyped.
template <typename Pred>
std::optional<McpJson> mcp_job_argument(const McpJson& args, const char* tool, const char* key, Pred is, const char* type) {
  const auto it = args.find(key);
  if (it == args.end()) return std::nullopt;
  EXL_CHECK(is(*it), "runtime: mcp: ", tool, ": argument '", key, "' must be ", type);
  return *it;
}

McpJson run_mcp_extract(JobEngine& engine, const McpJson& args, const std::atomic<bool>& cancelled) {
  for (const auto& [k, v] : args.items())
    EXL_CHECK(k == "document" || k == "schema" || k == "instructions" || k == "max_tokens",
              "runtime: mcp: extract: unknown argument '", k, "'");
  const auto is_string = [](const McpJson& j) { return j.is_string(); };
  const auto document = mcp_job_argument(args, "extract", "document", is_string, "a string");
  const auto schema_arg = mcp_job_argument(args, "extract", "schema", [](const McpJson& j) { return j.is_object(); }, "an object");
  EXL_CHECK(document && schema_arg, "runtime: mcp: extract: arguments 'document' and 'schema' are required");
  const auto instructions = mcp_job_argument(args, "extract", "instructions", is_string, "a string");
  const auto max_tokens = mcp_job_argument(args, "extract", "max_tokens",
                                           [](const McpJson& j) { return j.is_number_integer() && j.get<int64_t>() > 0; },
                                           "a positive integer");
  const McpJson schema = *schema_arg;
  try {
    engine.check_schema(schema);
  } catch (const Error& e) {
    return mcp_text_result(cat("runtime: mcp: extract: argument 'schema': ", e.what()), true);
  }
  std::string text = document->get<std::string>();
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  ChatJobSpec js;
  js.messages = extraction_messages(instructions ? instructions->get<std::string>() : "", schema, text);
  js.schema = schema;
  if (max_tokens) js.max_tokens = max_tokens->get<int64_t>();
  std::optional<JobOutcome> outcome;
  engine.submit(std::move(js), [&outcome](JobOutcome o) { outcome = std::move(o); });
  bool cancel_sent = false;
  while (!outcome) {
    if (cancelled && !cancel_sent) {
      engine.cancel_all();
      cancel_sent = true;
    }
    EXL_CHECK(engine.step() || outcome, "runtime: mcp: extract: internal: the job is in flight but the generator is idle");
  }
  if (!outcome->ok) return mcp_text_result(cat("runtime: mcp: extract: ", outcome->error), true);
  McpJson out = outcome->json;
  McpJson result = mcp_text_result(outcome->json.dump(), false);
  if (out.is_object()) result["structuredContent"] = std::move(out);
  return result;
}

McpJson run_mcp_agent(JobEngine& engine, const ToolRegistry& tools, const McpJobToolsOptions& opts, const McpJson& args) {
  for (const auto& [k, v] : args.items())
    EXL_CHECK(k == "message" || k == "system" || k == "tools" || k == "max_turns",
              "runtime: mcp: agent: unknown argument '", k, "'");
  const auto is_string = [](const McpJson& j) { return j.is_string(); };
  const auto message = mcp_job_argument(args, "agent", "message", is_string, "a string");
  EXL_CHECK(message, "runtime: mcp: agent: argument 'message' is required");
  const auto system = mcp_job_argument(args, "agent", "system", is_string, "a string");
  const auto names = mcp_job_argument(
      args, "agent", "tools",
      [](const McpJson& j) { return j.is_array() && std::all_of(j.begin(), j.end(), [](const McpJson& e) { return e.is_string(); }); },
      "an array of strings");
  const auto max_turns = mcp_job_argument(
      args, "agent", "max_turns",
      [](const McpJson& j) { return j.is_number_integer() && j.get<int64_t>() >= 1 && j.get<int64_t>() <= 32; },
      "an integer from 1 to 32");
  AgentConfig config;
  if (names) {
    for (const auto& n : *names) {
      EXL_CHECK(tools.contains(n.get<std::string>()), "runtime: mcp: agent: argument 'tools': no tool '",
                n.get<std::string>(), "'");
      config.tools.push_back(n.get<std::string>());
    }
  } else {
    for (const auto& spec : tools.list()) config.tools.push_back(spec.name);
  }
  if (max_turns) config.max_turns = int(max_turns->get<int64_t>());
  config.max_new_tokens = int(opts.agent_max_tokens);
  AgentConversation conv;
  if (system) conv.history.push_back({"system", system->get<std::string>(), {}, {}});
  conv.user = message->get<std::string>();
  auto done = run_agent_conversations(engine, tools, config, "mcp", {conv}, opts.transcript_dir);
  const AgentConversationResult& r = done.at(0);
  if (!r.ok) return mcp_text_result(cat("runtime: mcp: agent: ", r.error), true);
  McpJson result = mcp_text_result(r.content, false);
  result["structuredContent"] = {{"answer", r.content}, {"turns", r.turns}};
  return result;
}

}  // namespace

std::vector<McpServedTool> mcp_job_tools(JobEngine& engine, const ToolRegistry& tools, McpJobToolsOptions options) {
  std::vector<McpServedTool> out;
  out.push_back({"extract",
                 "Extract one JSON object from a document under a JSON Schema. The object is generated under the "
                 "schema's grammar, so it is valid under the schema by construction.",
                 mcp_extract_input_schema(), std::nullopt,
                 [&engine](const McpJson& args, const std::atomic<bool>& cancelled) {
                   return run_mcp_extract(engine, args, cancelled);
                 }});
  std::string names;
  for (const auto& spec : tools.list()) names += (names.empty() ? "" : ", ") + spec.name;
  out.push_back({"agent",
                 cat("Run one agent turn on a user message: the model may call the built-in tools (", names,
                     ") and returns its final answer."),
                 mcp_agent_input_schema(),
                 McpJson::parse(R"({"type":"object","properties":{"answer":{"type":"string"},"turns":{"type":"integer"}},"required":["answer","turns"]})"),
                 [&engine, &tools, options](const McpJson& args, const std::atomic<bool>&) {
                   return run_mcp_agent(engine, tools, options, args);
                 }});
  return out;
}

}  // namespace exl
