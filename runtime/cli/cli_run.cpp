#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/job_engine.h"
#include "runtime/workflow_agent.h"
#include "sessions/workflow.h"
#include "tools/builtin_tools.h"
#include "tools/mcp/mcp_client.h"

namespace exl {

namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const CommandSpec& run_spec() {
  static const CommandSpec s{
      "run",
      "Run a scripted workflow (format: docs/workflow-format.md): its steps in order, each a chat\n"
      "turn templated from the inputs and earlier steps' outputs; for_each iterations run together.\n"
      "Writes OUT/steps/NAME.json per step, OUT/outputs.json and OUT/trace.jsonl, and prints\n"
      "outputs.json.",
      {"WORKFLOW"},
      with_job_engine_flags(
          {{"--model", "DIR", "model directory (default: the workflow's \"model\")"},
           {"--out", "DIR", "output directory (default: workflow-out)"},
           {"--input", "KEY=VALUE", "set an input (a string), overriding the file's", false, true},
           {"--concurrency", "N", "generations at once within a for_each step (default 16)"}},
          {{"--read-root", "DIR", "offer the read_file tool to steps with tools, reading only under DIR"},
           {"--mcp", k_mcp_flag, k_mcp_help, false, true}}),
      1};
  return s;
}

// One conversation's outcome in a step.
struct StepResult {
  bool ok = false;
  std::string error;
  ojson output;                        // the parsed JSON (with a schema) or the reply text
  std::vector<ChatMessage> messages;   // the conversation including the reply
  ojson trace = ojson::object();       // generation facts for the trace line
};

struct Runner {
  const Workflow& wf;
  JobEngine& engine;
  const ToolRegistry& tools;
  fs::path out;
  std::ofstream trace;
  ojson ctx;
  std::map<std::string, std::vector<ChatMessage>> conversations;

  void trace_line(const ojson& j) {
    trace << j.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
    trace.flush();
  }

  std::vector<ChatMessage> conversation(const WorkflowStep& st, const ojson& c, const std::string& where) {
    std::vector<ChatMessage> ms;
    if (!st.continue_from.empty()) {
      auto it = conversations.find(st.continue_from);
      EXL_CHECK(it != conversations.end(), "runtime: run: ", where, ": step '", st.continue_from,
                "' was skipped, so there is no conversation to continue");
      ms = it->second;
    } else if (!st.system.empty()) {
      ms.push_back({"system", render_template(st.system, c, where + ": system"), {}, {}});
    }
    ms.push_back({"user", render_template(st.prompt, c, where + ": prompt"), {}, {}});
    return ms;
  }

  void run_step(const WorkflowStep& st) {
    const std::string where = cat("step '", st.name, "'");
    if (st.condition && !condition_holds(*st.condition, ctx)) {
      ctx["steps"][st.name] = nullptr;
      trace_line({{"step", st.name}, {"skipped", true}, {"if", st.condition->path}});
      std::cerr << "run: " << where << ": skipped (condition false)\n";
      return;
    }
    std::vector<ojson> contexts;
    if (st.for_each.empty()) {
      contexts.push_back(ctx);
    } else {
      const ojson* list = resolve_path(ctx, st.for_each);
      EXL_CHECK(list && list->is_array(), "runtime: run: ", where, ": for_each '", st.for_each, "' is ",
                list ? "not an array" : "missing", list ? cat(": ", list->dump().substr(0, 200)) : std::string());
      for (size_t i = 0; i < list->size(); ++i) {
        ojson c = ctx;
        c["item"] = (*list)[i];
        c["index"] = i;
        contexts.push_back(std::move(c));
      }
    }
    std::vector<std::vector<ChatMessage>> convs;
    for (size_t i = 0; i < contexts.size(); ++i)
      convs.push_back(conversation(st, contexts[i], st.for_each.empty() ? where : cat(where, " item ", i)));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<StepResult> results = st.tools.empty() ? generate(st, convs) : run_agents(st, convs);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ojson outputs = ojson::array();
    std::string first_error;
    for (size_t i = 0; i < results.size(); ++i) {
      StepResult& r = results[i];
      ojson line = {{"step", st.name}};
      if (!st.for_each.empty()) line["index"] = i;
      line["messages"] = messages_to_json(r.messages);
      line["output"] = r.ok ? r.output : ojson(nullptr);
      if (!r.ok) line["error"] = r.error;
      line.update(r.trace);
      line["step_seconds"] = secs;
      trace_line(line);
      if (!r.ok && first_error.empty())
        first_error = cat(st.for_each.empty() ? where : cat(where, " item ", i), ": ", r.error);
      outputs.push_back(r.ok ? std::move(r.output) : ojson(nullptr));
    }
    EXL_CHECK(first_error.empty(), "runtime: run: ", first_error);
    ojson result = st.for_each.empty() ? outputs[0] : outputs;
    if (st.for_each.empty()) conversations[st.name] = std::move(results[0].messages);
    std::ofstream(out / "steps" / (st.name + ".json")) << result.dump(2) << "\n";
    ctx["steps"][st.name] = std::move(result);
    std::cerr << "run: " << where << ": " << results.size() << " conversation" << (results.size() == 1 ? "" : "s")
              << " in " << secs << " s\n";
  }

  std::vector<StepResult> generate(const WorkflowStep& st, const std::vector<std::vector<ChatMessage>>& convs) {
    std::vector<JobOutcome> outcomes(convs.size());
    for (size_t i = 0; i < convs.size(); ++i) {
      ChatJobSpec js;
      js.messages = convs[i];
      js.schema = st.schema;
      js.max_tokens = st.max_tokens;
      js.sampling.temperature = float(st.temperature);
      js.sampling.seed = st.seed;
      engine.submit(std::move(js), [&outcomes, i](JobOutcome o) { outcomes[i] = std::move(o); });
    }
    engine.run_until_idle();
    std::vector<StepResult> out(convs.size());
    for (size_t i = 0; i < convs.size(); ++i) {
      const JobOutcome& o = outcomes[i];
      StepResult& r = out[i];
      r.ok = o.ok;
      r.error = o.error;
      if (o.ok) r.output = st.schema ? o.json : ojson(o.text);
      r.messages = convs[i];
      r.messages.push_back({"assistant", o.text, {}, {}});
      r.trace = {{"finish_reason", to_string(o.reason)},
                 {"prompt_tokens", o.stats.n_prompt_tokens},
                 {"cached_tokens", o.stats.n_cached_tokens},
                 {"completion_tokens", o.stats.n_generated}};
    }
    return out;
  }

  std::vector<StepResult> run_agents(const WorkflowStep& st, const std::vector<std::vector<ChatMessage>>& convs) {
    AgentConfig config;
    config.tools = st.tools;
    if (st.schema) config.final_answer_schema = *st.schema;
    config.max_turns = st.max_turns;
    config.max_new_tokens = int(st.max_tokens.value_or(512));
    config.sampling.temperature = float(st.temperature);
    config.sampling.seed = st.seed;
    std::vector<AgentConversation> agents;
    for (const auto& c : convs) agents.push_back({{c.begin(), c.end() - 1}, c.back().content});
    auto done = run_agent_conversations(engine, tools, config, st.name, agents, out / "agents");
    std::vector<StepResult> results(done.size());
    for (size_t i = 0; i < done.size(); ++i) {
      StepResult& r = results[i];
      r.messages = std::move(done[i].messages);
      r.trace = {{"turns", done[i].turns}, {"usage", done[i].usage}};
      r.ok = done[i].ok;
      r.error = done[i].error;
      if (!r.ok) continue;
      if (!st.schema) {
        r.output = done[i].content;
        continue;
      }
      try {
        r.output = ojson::parse(done[i].content);
      } catch (const nlohmann::json::exception&) {
        r.ok = false;
        r.error = cat("the final answer is not valid JSON: '", done[i].content.substr(0, 200), "'");
      }
    }
    return results;
  }
};

}  // namespace

int cli_run(std::span<const std::string> args) {
  return run_command(run_spec(), args, [](const ParsedArgs& a) {
    std::map<std::string, std::string> overrides;
    if (a.has("--input"))
      for (const auto& kv : a.values.at("--input")) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) throw UsageError(cat("--input wants KEY=VALUE, got '", kv, "'"));
        overrides[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    const long long conc = a.get_int("--concurrency", 16);
    if (conc <= 0) throw UsageError("--concurrency must be positive");
    const Workflow wf = load_workflow(a.positionals[0], overrides);
    BuiltinToolOptions tool_opts;
    tool_opts.read_root = a.get_or("--read-root", "");
    ToolRegistry tools;
    for (auto& t : make_builtin_tools(tool_opts)) tools.add(std::move(t));
    std::vector<std::shared_ptr<McpClient>> mcp_servers;  // after `tools`: stopped before it goes
    std::vector<McpServerConfig> mcp = wf.mcp;
    std::set<std::string> mcp_names;
    for (const auto& m : wf.mcp) mcp_names.insert(m.name);
    for (auto& m : mcp_server_flags(a)) {
      if (!mcp_names.insert(m.name).second)
        throw UsageError(cat("--mcp ", m.name, ": the workflow's \"mcp\" already names a server '", m.name, "'"));
      mcp.push_back(std::move(m));
    }
    for (const auto& m : mcp) {
      mcp_servers.push_back(McpClient::start(m));
      for (const auto& note : register_mcp_tools(tools, mcp_servers.back()))
        std::cerr << "exlagent: warning: " << note << "\n";
    }
    for (const auto& st : wf.steps)
      for (const auto& name : st.tools)
        EXL_CHECK(tools.contains(name), "runtime: run: step '", st.name, "': no tool '", name,
                  "' (built-ins: calculator, regex_extract, json_query, current_time; read_file needs --read-root;"
                  " MCP tools are NAME__tool of an --mcp server)");
    const std::string model = a.get_or("--model", wf.model);
    if (model.empty()) throw UsageError("no model: give --model or set \"model\" in the workflow");

    JobEngine engine(job_engine_options(a, model, int(conc)));
    for (const auto& st : wf.steps)
      if (st.schema) {
        try {
          engine.check_schema(*st.schema);
        } catch (const Error& e) {
          fail("runtime: run: step '", st.name, "': ", e.what());
        }
      }

    const fs::path out = a.get_or("--out", "workflow-out");
    std::error_code ec;
    fs::create_directories(out / "steps", ec);
    EXL_CHECK(!ec, "runtime: run: cannot create the output directory '", out.string(), "': ", ec.message());
    Runner r{wf, engine, tools, out, std::ofstream(out / "trace.jsonl", std::ios::trunc), {}, {}};
    EXL_CHECK(r.trace, "runtime: run: cannot write '", (out / "trace.jsonl").string(), "'");
    r.ctx = {{"inputs", wf.inputs}, {"steps", ojson::object()}};
    for (const auto& st : wf.steps) r.run_step(st);
    const std::string outputs = r.ctx["steps"].dump(2);
    std::ofstream(out / "outputs.json") << outputs << "\n";
    std::cout << outputs << "\n";
    return 0;
  });
}

}  // namespace exl
