#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "runtime/cli_args.h"
#include "runtime/cli_commands.h"
#include "runtime/job_engine.h"
#include "sessions/workflow.h"

namespace exl {

namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const CommandSpec& spec() {
  static const CommandSpec s{
      "run",
      "Run a scripted workflow (format: docs/workflow-format.md): its steps in order, each a chat\n"
      "turn templated from the inputs and earlier steps' outputs; for_each iterations run together.\n"
      "Writes OUT/steps/NAME.json per step, OUT/outputs.json and OUT/trace.jsonl, and prints\n"
      "outputs.json.",
      {"WORKFLOW"},
      {{"--model", "DIR", "model directory (default: the workflow's \"model\")"},
       {"--out", "DIR", "output directory (default: workflow-out)"},
       {"--input", "KEY=VALUE", "set an input (a string), overriding the file's", false, true},
       {"--concurrency", "N", "generations at once within a for_each step (default 16)"},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--threads", "N", "CPU threads (default: all)"},
       {"--chat-template", "NAME", "override the detected chat template (llama3, chatml, mistral, llama2)"}},
      1};
  return s;
}

ojson messages_json(const std::vector<ChatMessage>& ms) {
  ojson a = ojson::array();
  for (const auto& m : ms) a.push_back({{"role", m.role}, {"content", m.content}});
  return a;
}

struct Runner {
  const Workflow& wf;
  JobEngine& engine;
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
    std::vector<JobOutcome> results(contexts.size());
    std::vector<double> started(contexts.size());
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < contexts.size(); ++i) {
      const std::string at = st.for_each.empty() ? where : cat(where, " item ", i);
      convs.push_back(conversation(st, contexts[i], at));
      ChatJobSpec js;
      js.messages = convs.back();
      js.schema = st.schema;
      js.max_tokens = st.max_tokens;
      js.sampling.temperature = float(st.temperature);
      js.sampling.seed = st.seed;
      engine.submit(std::move(js), [&results, i](JobOutcome o) { results[i] = std::move(o); });
    }
    engine.run_until_idle();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ojson outputs = ojson::array();
    std::string first_error;
    for (size_t i = 0; i < results.size(); ++i) {
      const JobOutcome& o = results[i];
      ojson output = o.ok ? (st.schema ? o.json : ojson(o.text)) : ojson(nullptr);
      ojson line = {{"step", st.name}};
      if (!st.for_each.empty()) line["index"] = i;
      line["messages"] = messages_json(convs[i]);
      line["output"] = output;
      if (!o.ok) line["error"] = o.error;
      line["finish_reason"] = to_string(o.reason);
      line["prompt_tokens"] = o.stats.n_prompt_tokens;
      line["cached_tokens"] = o.stats.n_cached_tokens;
      line["completion_tokens"] = o.stats.n_generated;
      line["step_seconds"] = secs;
      trace_line(line);
      if (!o.ok && first_error.empty())
        first_error = cat(st.for_each.empty() ? where : cat(where, " item ", i), ": ", o.error);
      outputs.push_back(std::move(output));
    }
    EXL_CHECK(first_error.empty(), "runtime: run: ", first_error);
    ojson result = st.for_each.empty() ? outputs[0] : outputs;
    if (st.for_each.empty()) {
      convs[0].push_back({"assistant", results[0].text, {}, {}});
      conversations[st.name] = std::move(convs[0]);
    }
    std::ofstream(out / "steps" / (st.name + ".json")) << result.dump(2) << "\n";
    ctx["steps"][st.name] = std::move(result);
    std::cerr << "run: " << where << ": " << results.size() << " generation" << (results.size() == 1 ? "" : "s")
              << " in " << secs << " s\n";
  }
};

}  // namespace

int cli_run(std::span<const std::string> args) {
  return run_command(spec(), args, [](const ParsedArgs& a) {
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
    for (const auto& st : wf.steps)
      EXL_CHECK(st.tools.empty(), "runtime: run: step '", st.name,
                "' uses tools, which need the agent loop (sessions/agent_session); this build does not have it yet");
    const std::string model = a.get_or("--model", wf.model);
    if (model.empty()) throw UsageError("no model: give --model or set \"model\" in the workflow");

    JobEngineOptions eo;
    eo.model_dir = model;
    eo.backend = a.get_or("--backend", "cpu");
    eo.cpu_threads = int(a.get_int("--threads", 0));
    eo.max_batch_seqs = int(conc);
    eo.chat_template = a.get_or("--chat-template", "");
    JobEngine engine(eo);
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
    Runner r{wf, engine, out, std::ofstream(out / "trace.jsonl", std::ios::trunc), {}, {}};
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
