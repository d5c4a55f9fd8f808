#include "runtime/workflow_agent.h"

#include <condition_variable>
#include <mutex>

#include <boost/asio/thread_pool.hpp>

#include "kernels/error.h"
#include "sessions/agent_session.h"

namespace exl {

namespace {

// Collects each session's end; wait() returns when all have ended.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = 0;
  std::vector<AgentConversationResult> results;

  AgentSink sink(size_t i) {
    return [this, i](const AgentEvent& e) {
      std::lock_guard lk(mu);
      AgentConversationResult& r = results[i];
      if (e.type == "error" && r.error.empty()) r.error = e.data.value("message", "agent error");
      if (e.type != "done") return;
      const std::string reason = e.data.value("reason", "");
      r.ok = reason == "final";
      r.turns = e.data.value("turns", 0);
      r.usage = nlohmann::ordered_json(e.data.value("usage", nlohmann::json::object()));
      if (r.ok) r.content = e.data.value("content", "");
      else if (r.error.empty()) r.error = "the run ended with reason '" + reason + "'";
      if (--remaining == 0) cv.notify_all();
    };
  }
  void wait() {
    std::unique_lock lk(mu);
    cv.wait(lk, [this] { return remaining == 0; });
  }
};

// Stops the generator's thread however the step ends.
struct GeneratorThread {
  Generator& gen;
  explicit GeneratorThread(Generator& g) : gen(g) { gen.start(); }
  ~GeneratorThread() { gen.stop(); }
};

}  // namespace

std::vector<AgentConversationResult> run_agent_conversations(JobEngine& engine, const ToolRegistry& tools,
                                                             const AgentConfig& config, const std::string& step,
                                                             const std::vector<AgentConversation>& conversations,
                                                             const std::filesystem::path& transcript_dir,
                                                             TurnConstraintFactory constraint) {
  for (const auto& name : config.tools)
    EXL_CHECK(tools.contains(name), "runtime: run: step '", step, "': no built-in tool '", name,
              "' (calculator, regex_extract, json_query, current_time; read_file needs --read-root)");
  Completion done;  // outlives the pool, whose handlers report into it
  done.results.resize(conversations.size());
  done.remaining = conversations.size();
  boost::asio::thread_pool pool(1);
  AgentEnv env;
  env.generator = &engine.generator();
  env.tokenizer = &engine.tokenizer();
  env.chat_template = engine.chat_template();
  env.encode_prompt = [&engine](const RenderedPrompt& p) { return engine.encode_prompt(p); };
  env.find_tool = [&tools](const std::string& name) { return tools.find(name); };
  env.constraint = std::move(constraint);
  env.executor = pool.get_executor();
  env.dir = transcript_dir;
  env.context_length = engine.context_length();

  std::vector<std::shared_ptr<AgentSession>> sessions;
  GeneratorThread running(engine.generator());
  for (size_t i = 0; i < conversations.size(); ++i) {
    const std::string id = cat(step, "-", i);
    save_transcript(transcript_dir, Transcript{id, config, conversations[i].history});
    sessions.push_back(AgentSession::load(env, id, done.sink(i)));
    sessions.back()->send(conversations[i].user);
  }
  if (!conversations.empty()) done.wait();
  for (size_t i = 0; i < sessions.size(); ++i) {
    done.results[i].messages = sessions[i]->messages();
    sessions[i]->close();
  }
  sessions.clear();
  pool.join();
  return std::move(done.results);
}

}  // namespace exl
