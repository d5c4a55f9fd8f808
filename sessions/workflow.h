// Scripted multi-turn workflows (`exlagent run`): a file of steps, each a chat turn whose prompt
// is templated from the workflow's inputs and earlier steps' outputs. The format is documented in
// docs/workflow-format.md and its JSON Schema is docs/workflow.schema.json (workflow_schema.h).
//
// Templates: "{{ PATH }}" is replaced by the value at PATH in the context
// {"inputs": {...}, "steps": {NAME: output, ...}, "item": ..., "index": N} — strings as they
// are, other values as compact JSON. A step's output is its parsed JSON reply when it has a
// schema, else the reply text; a for_each step's output is the array of its iterations' outputs;
// a skipped step's output is null.
// Pure data and functions; any thread.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/mcp/mcp_client.h"

namespace exl {

struct WorkflowCondition {
  std::string path;
  std::optional<nlohmann::ordered_json> equals;      // holds when the value equals this
  std::optional<nlohmann::ordered_json> not_equals;  // holds when it differs
  // Neither: holds when the value is truthy (not null, false, 0, "", [] or {}; a missing value is falsy).
};

struct WorkflowStep {
  std::string name;
  std::string prompt;                       // template
  std::string system;                       // template; empty = none
  std::optional<nlohmann::ordered_json> schema;
  std::string continue_from;                // earlier step whose conversation this continues
  std::string for_each;                     // path of an array; empty = run once
  std::optional<WorkflowCondition> condition;
  std::vector<std::string> tools;           // built-in tool names; non-empty = an agent loop
  int max_turns = 10;                       // generations per conversation when tools are offered
  std::optional<int64_t> max_tokens;
  double temperature = 0;
  std::optional<uint64_t> seed;
};

struct Workflow {
  std::string name;
  std::string model;                        // resolved against the file's directory; may be empty
  nlohmann::ordered_json inputs = nlohmann::ordered_json::object();  // file inputs read
  std::vector<McpServerConfig> mcp;         // the file's "mcp" servers (tools/mcp/mcp_client.h)
  std::vector<WorkflowStep> steps;
};

// Validates `doc` against the workflow schema, then checks what a schema cannot: unique step
// names, template and path references to known inputs and to earlier steps only, item/index only
// in for_each steps, continue only from an earlier single (not for_each) step, "mcp" entries that
// parse as the --mcp flag's NAME=VALUE (the servers are not started here). Reads
// {"file": PATH} inputs relative to base_dir. `overrides` replace inputs (as strings).
// Throws exl::Error "sessions: workflow: 'WHERE': ..." listing the problems.
Workflow parse_workflow(const nlohmann::ordered_json& doc, const std::filesystem::path& base_dir,
                        const std::map<std::string, std::string>& overrides = {}, std::string_view where = "workflow");
// Reads and parses a workflow file.
Workflow load_workflow(const std::filesystem::path& file, const std::map<std::string, std::string>& overrides = {});

// The value at a dotted path ("steps.a.items.0.name"); nullptr when absent.
const nlohmann::ordered_json* resolve_path(const nlohmann::ordered_json& context, std::string_view path);
// The paths of every "{{ PATH }}" in a template. Throws exl::Error for an unclosed "{{".
std::vector<std::string> template_paths(std::string_view text);
// Fills a template. Throws exl::Error naming `where` and the path when a value is missing.
std::string render_template(std::string_view text, const nlohmann::ordered_json& context, std::string_view where);
bool is_truthy(const nlohmann::ordered_json* value);
bool condition_holds(const WorkflowCondition& c, const nlohmann::ordered_json& context);

}  // namespace exl
