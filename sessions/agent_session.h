// One tool-calling agent conversation. Each user message starts a run: render the conversation →
// generate (under the turn's constraint, see agent_constraint.h) → parse tool calls → call every
// tool with a deadline (errors and timeouts go back to the model as tool results) → append →
// repeat, until a reply without tool calls (the final answer), max_turns generations, or cancel().
//
// Events (AgentEvent.type): "token" {text}, "tool_call" {id, name, arguments}, "tool_progress"
// {id, name, progress, total?, message?} (a running call's, CancelToken::report_progress), "tool_result"
// {id, name, content, isError} (content cut to env.max_tool_result_bytes, with a note), "turn_end"
// {turn, finishReason, usage}, "done" {reason: "final"|"max_turns"|"cancelled"|"error", content?,
// turns, usage}, "error" {message}. Every run
// ends with exactly one "done" (an "error" event precedes done{reason:"error"}).
//
// Prefix caching: each turn's prompt continues the exact tokens of the previous turn (prompt +
// generated) when the re-rendered conversation extends their text, and the generation pins its KV
// pages (GenerationJob::pin) until the next turn or close(), so turn k+1 reuses turn k's pages.
//
// The transcript is saved (agent_transcript.h) after every change when env.dir is set; load()
// continues a saved session after a restart (a run cut off mid-tools gets error results).
//
// Threads: never blocks. All state lives on a strand of env.executor; generator events and tool
// completions are posted to it; the sink is called on that strand and must not block. send(),
// cancel() and close() may be called from any thread.
#pragma once
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>

#include "engine/generate/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "sessions/agent_constraint.h"
#include "sessions/agent_transcript.h"
#include "sessions/chat_template.h"
#include "tools/tool.h"

namespace exl {

struct AgentEvent {
  std::string type;
  nlohmann::json data;  // an object; fields as listed above
};

using AgentSink = std::function<void(const AgentEvent&)>;

// What a session runs on; shared by every session of a server.
struct AgentEnv {
  Generator* generator = nullptr;
  const Tokenizer* tokenizer = nullptr;
  std::shared_ptr<const ChatTemplate> chat_template;
  std::function<std::vector<int32_t>(const RenderedPrompt&)> encode_prompt;  // tokenize_prompt, usually
  std::function<std::shared_ptr<Tool>(const std::string&)> find_tool;     // nullptr when unknown
  TurnConstraintFactory constraint;  // empty = make_agent_turn_constraint (the grammar seam)
  boost::asio::any_io_executor executor;
  std::filesystem::path dir;     // transcripts; empty = not saved
  int64_t context_length = 0;    // tokens a sequence may hold
  int64_t max_prompt_tokens = 0; // tokens a turn's prompt may have; 0 = context_length
  size_t max_prompt_bytes = 0;   // bytes of a turn's rendered conversation, checked before tokenizing; 0 = no limit
  size_t max_tool_result_bytes = 64u << 10;  // longer tool results are cut, ending with a note; 0 = no limit
};

class AgentSession : public std::enable_shared_from_this<AgentSession> {
 public:
  static std::shared_ptr<AgentSession> create(const AgentEnv& env, std::string id, AgentConfig config, AgentSink sink);
  // Throws exl::Error when the transcript is missing or malformed.
  static std::shared_ptr<AgentSession> load(const AgentEnv& env, std::string id, AgentSink sink);
  ~AgentSession();

  const std::string& id() const { return id_; }
  const AgentConfig& config() const { return config_; }
  // Starts a run with this user message; false when a run is already going.
  bool send(std::string user_message);
  bool running() const { return running_; }
  // Ends the current run (done{reason:"cancelled"}): stops generation, cancels tool calls.
  void cancel();
  // cancel(), then drops the sink and the pinned pages. The object may outlive it.
  void close();
  // A copy of the conversation, taken on the strand (blocks the caller until then; never call
  // from the strand).
  std::vector<ChatMessage> messages();

  AgentSession(const AgentEnv& env, std::string id, AgentConfig config, AgentSink sink, uint64_t pin);

 private:
  struct ToolSlot;
  void start_run(std::string user_message);
  void next_turn();
  void on_generation(const GenerationEvent& e);
  void finish_generation(const GenerationEvent& e);
  void dispatch_tools(const std::vector<ToolCall>& calls);
  void deliver(uint64_t epoch, size_t index, ToolResult result);
  void finish_run(const std::string& reason, const std::string& content = {});
  void do_cancel();
  void emit(std::string type, nlohmann::json data);
  void save();
  nlohmann::ordered_json offered_tools() const;
  std::vector<int32_t> build_prompt(const RenderedPrompt& prompt) const;

  AgentEnv env_;
  std::string id_;
  AgentConfig config_;
  AgentSink sink_;
  uint64_t pin_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  std::atomic<bool> running_{false};
  std::atomic<bool> closed_{false};

  // Strand only.
  std::vector<ChatMessage> messages_;
  int turn_ = 0;                 // generations in this run
  uint64_t epoch_ = 0;           // bumps when a run ends; late callbacks of an old run are ignored
  uint64_t job_ = 0;             // generator job in flight, 0 when none
  bool cancel_requested_ = false;
  std::vector<int32_t> prompt_, generated_;
  std::string prompt_text_, generated_text_;
  struct Context {
    std::vector<int32_t> tokens;
    std::string text;
  };
  std::vector<Context> contexts_;  // candidate token prefixes for the next prompt, longest first
  std::vector<ToolCall> calls_;
  std::vector<std::unique_ptr<ToolSlot>> slots_;
  size_t n_results_ = 0;
  nlohmann::json run_usage_;
};

}  // namespace exl
