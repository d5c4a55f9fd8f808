#include "sessions/agent_session.h"

#include <atomic>
#include <future>
#include <random>

#include <boost/asio/post.hpp>

#include "kernels/error.h"

namespace exl {

namespace net = boost::asio;
using json = nlohmann::json;

struct AgentSession::ToolSlot {
  std::shared_ptr<CancelToken> cancel = std::make_shared<CancelToken>();
  std::unique_ptr<net::steady_timer> timer;
  bool done = false;
  ToolResult result;
};

namespace {

std::atomic<uint64_t> g_next_pin{1};
constexpr std::chrono::milliseconds kToolTimeoutGrace{100};

json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string timeout_text(const std::string& name, std::chrono::milliseconds t) {
  return cat("Tool '", name, "' timed out after ", double(t.count()) / 1000.0, " s");
}

// Cuts an over-long tool result at a character boundary and says so, so one tool cannot flood the
// conversation (and every later prompt) with its output.
void cap_tool_result(std::string& content, size_t limit) {
  if (limit == 0 || content.size() <= limit) return;
  size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(content[cut]) & 0xC0) == 0x80) --cut;
  const size_t total = content.size();
  content.resize(cut);
  content += cat("\n[exlagent: tool output truncated: ", cut, " of ", total, " bytes shown]");
}

}  // namespace

AgentSession::AgentSession(const AgentEnv& env, std::string id, AgentConfig config, AgentSink sink, uint64_t pin)
    : env_(env), id_(std::move(id)), config_(std::move(config)), sink_(std::move(sink)), pin_(pin),
      strand_(net::make_strand(env.executor)) {
  run_usage_ = usage_json(0, 0, 0);
}

AgentSession::~AgentSession() {
  if (env_.generator) env_.generator->unpin(pin_);
}

std::shared_ptr<AgentSession> AgentSession::create(const AgentEnv& env, std::string id, AgentConfig config,
                                                   AgentSink sink) {
  EXL_CHECK(valid_session_id(id), "sessions: agent: invalid session id '", id, "'");
  auto s = std::make_shared<AgentSession>(env, std::move(id), std::move(config), std::move(sink), g_next_pin++);
  if (!s->config_.system.empty()) s->messages_.push_back({"system", s->config_.system, {}, {}});
  s->save();
  return s;
}

std::shared_ptr<AgentSession> AgentSession::load(const AgentEnv& env, std::string id, AgentSink sink) {
  EXL_CHECK(!env.dir.empty(), "sessions: agent: no session directory to load '", id, "' from");
  Transcript t = load_transcript(env.dir, id);
  auto s = std::make_shared<AgentSession>(env, std::move(id), std::move(t.config), std::move(sink), g_next_pin++);
  s->messages_ = std::move(t.messages);
  // A run cut off while tools were running: give each unanswered call an error result.
  for (size_t i = s->messages_.size(); i-- > 0;) {
    if (s->messages_[i].role != "assistant") continue;
    std::vector<ChatMessage> missing;
    for (const auto& c : s->messages_[i].tool_calls) {
      bool answered = false;
      for (size_t k = i + 1; k < s->messages_.size(); ++k)
        answered |= s->messages_[k].role == "tool" && s->messages_[k].tool_call_id == c.id;
      if (!answered) missing.push_back({"tool", "Error: the tool call was interrupted by a restart", {}, c.id});
    }
    s->messages_.insert(s->messages_.end(), missing.begin(), missing.end());
    break;
  }
  return s;
}

bool AgentSession::send(std::string user_message) {
  if (closed_) return false;
  bool expected = false;
  if (!running_.compare_exchange_strong(expected, true)) return false;
  net::post(strand_, [self = shared_from_this(), m = std::move(user_message)]() mutable { self->start_run(std::move(m)); });
  return true;
}

void AgentSession::cancel() {
  net::post(strand_, [self = shared_from_this()] { self->do_cancel(); });
}

void AgentSession::close() {
  closed_ = true;
  net::post(strand_, [self = shared_from_this()] {
    self->do_cancel();
    self->sink_ = nullptr;
    if (self->env_.generator) self->env_.generator->unpin(self->pin_);
  });
}

std::vector<ChatMessage> AgentSession::messages() {
  std::promise<std::vector<ChatMessage>> p;
  auto f = p.get_future();
  net::post(strand_, [self = shared_from_this(), &p] { p.set_value(self->messages_); });
  return f.get();
}

void AgentSession::emit(std::string type, json data) {
  if (sink_) sink_(AgentEvent{std::move(type), std::move(data)});
}

void AgentSession::save() {
  if (env_.dir.empty()) return;
  try {
    save_transcript(env_.dir, Transcript{id_, config_, messages_});
  } catch (const Error& e) {
    emit("error", {{"message", e.what()}});
  }
}

void AgentSession::start_run(std::string user_message) {
  messages_.push_back({"user", std::move(user_message), {}, {}});
  save();
  turn_ = 0;
  cancel_requested_ = false;
  run_usage_ = usage_json(0, 0, 0);
  next_turn();
}


nlohmann::ordered_json AgentSession::offered_tools() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  if (!env_.find_tool) return out;
  for (const auto& name : config_.tools)
    if (auto t = env_.find_tool(name)) {
      const ToolSpec& s = t->spec();
      nlohmann::ordered_json fn;
      fn["name"] = s.name;
      fn["description"] = s.description;
      fn["parameters"] = nlohmann::ordered_json::parse(s.input_schema.dump());
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
  return out;
}

std::vector<int32_t> AgentSession::build_prompt(const RenderedPrompt& prompt) const {
  const std::string& text = prompt.text;
  for (const auto& c : contexts_)
    if (!c.tokens.empty() && text.size() >= c.text.size() && text.compare(0, c.text.size(), c.text) == 0)
      return tokenize_prompt_after(*env_.tokenizer, c.tokens, c.text.size(), prompt);
  return env_.encode_prompt(prompt);
}

void AgentSession::next_turn() {
  if (cancel_requested_) return finish_run("cancelled");
  if (turn_ >= config_.max_turns) return finish_run("max_turns");
  ++turn_;
  const nlohmann::ordered_json tools = offered_tools();
  RenderedPrompt rendered;
  try {
    rendered = env_.chat_template->render(messages_, tools, true);
  } catch (const Error& e) {
    emit("error", {{"message", e.what()}});
    return finish_run("error");
  }
  if (env_.max_prompt_bytes > 0 && rendered.text.size() > env_.max_prompt_bytes) {
    emit("error", {{"message", cat("sessions: agent: the conversation has ", rendered.text.size(),
                                   " bytes of text; the server accepts at most ", env_.max_prompt_bytes,
                                   " (--max-prompt-bytes)")}});
    return finish_run("error");
  }
  prompt_ = build_prompt(rendered);
  prompt_text_ = std::move(rendered.text);
  generated_.clear();
  generated_text_.clear();
  const int64_t room = env_.context_length - int64_t(prompt_.size());
  if (room <= 0) {
    emit("error", {{"message", cat("sessions: agent: the conversation has ", prompt_.size(),
                                   " tokens; the context holds ", env_.context_length)}});
    return finish_run("error");
  }
  if (env_.max_prompt_tokens > 0 && int64_t(prompt_.size()) > env_.max_prompt_tokens) {
    emit("error", {{"message", cat("sessions: agent: the conversation has ", prompt_.size(),
                                   " tokens; the server accepts at most ", env_.max_prompt_tokens,
                                   " prompt tokens (--max-prompt-tokens)")}});
    return finish_run("error");
  }
  GenerationJob job;
  job.prompt = prompt_;
  job.sampling = config_.sampling;
  job.max_new_tokens = int32_t(std::min<int64_t>(config_.max_new_tokens, room));
  job.stop_tokens.assign(env_.tokenizer->eos_ids().begin(), env_.tokenizer->eos_ids().end());
  for (const auto& s : env_.chat_template->stop_strings())
    if (!s.empty()) job.stop_strings.push_back(s);
  AgentTurnContext ctx{turn_, messages_, &tools, &config_.final_answer_schema, env_.chat_template->tool_format()};
  try {
    job.mask = env_.constraint ? env_.constraint(ctx) : make_agent_turn_constraint(ctx, *env_.tokenizer);
  } catch (const std::exception& e) {
    emit("error", {{"message", cat("sessions: agent: the turn's output constraint: ", e.what())}});
    return finish_run("error");
  }
  job.pin = pin_;
  // Only a weak reference: the generator may destroy the job after the sessions' executor (a
  // copy of the strand here outlived its service when a server went with a turn still queued).
  std::weak_ptr<AgentSession> weak = weak_from_this();
  job.on_event = [weak](const GenerationEvent& e) {
    if (auto self = weak.lock()) net::post(self->strand_, [self, e] { self->on_generation(e); });
  };
  job_ = env_.generator->submit(std::move(job));
}

void AgentSession::on_generation(const GenerationEvent& e) {
  if (e.job != job_) return;
  if (e.type == GenerationEvent::Type::token) {
    generated_.push_back(e.token);
    generated_text_ += e.text;
    if (!e.text.empty()) emit("token", {{"text", e.text}, {"turn", turn_}});
    return;
  }
  job_ = 0;
  finish_generation(e);
}

void AgentSession::finish_generation(const GenerationEvent& e) {
  const GenerationStats& s = e.stats;
  json usage = usage_json(s.n_prompt_tokens, s.n_generated, s.n_cached_tokens);
  run_usage_["prompt_tokens"] = run_usage_["prompt_tokens"].get<int64_t>() + s.n_prompt_tokens;
  run_usage_["completion_tokens"] = run_usage_["completion_tokens"].get<int64_t>() + s.n_generated;
  run_usage_["total_tokens"] = run_usage_["total_tokens"].get<int64_t>() + s.n_prompt_tokens + s.n_generated;
  run_usage_["prompt_tokens_details"]["cached_tokens"] =
      run_usage_["prompt_tokens_details"]["cached_tokens"].get<int64_t>() + s.n_cached_tokens;
  if (e.reason == FinishReason::error) {
    emit("error", {{"message", e.error}});
    return finish_run("error");
  }
  // Candidate prefixes for the next prompt: the exact tokens so far when their text is known.
  contexts_.clear();
  std::vector<int32_t> gen = generated_;
  if (e.reason == FinishReason::stop_token && !gen.empty()) gen.pop_back();
  if (e.reason != FinishReason::stop_string && e.reason != FinishReason::cancelled) {
    Context full{prompt_, prompt_text_ + generated_text_};
    full.tokens.insert(full.tokens.end(), gen.begin(), gen.end());
    contexts_.push_back(std::move(full));
  }
  contexts_.push_back({prompt_, prompt_text_});

  const bool tools_on = !config_.tools.empty();
  ParsedReply reply = env_.chat_template->parse_reply(generated_text_, tools_on);
  static thread_local std::mt19937_64 rng(std::random_device{}());
  for (auto& c : reply.tool_calls)
    if (c.id.empty()) c.id = env_.chat_template->make_tool_call_id(rng());
  messages_.push_back({"assistant", reply.content, reply.tool_calls, {}});
  save();
  emit("turn_end", {{"turn", turn_}, {"finishReason", to_string(e.reason)}, {"usage", usage},
                    {"toolCalls", reply.tool_calls.size()}});
  if (e.reason == FinishReason::cancelled || cancel_requested_) return finish_run("cancelled");
  if (reply.tool_calls.empty()) return finish_run("final", reply.content);
  dispatch_tools(reply.tool_calls);
}

void AgentSession::dispatch_tools(const std::vector<ToolCall>& calls) {
  calls_ = calls;
  slots_.clear();
  n_results_ = 0;
  for (size_t i = 0; i < calls.size(); ++i) slots_.push_back(std::make_unique<ToolSlot>());
  const uint64_t epoch = epoch_;
  for (size_t i = 0; i < calls.size(); ++i) {
    const ToolCall& c = calls[i];
    json args = json::parse(c.arguments, nullptr, false);
    emit("tool_call", {{"id", c.id}, {"name", c.name}, {"arguments", args.is_discarded() ? json(c.arguments) : args}});
    const bool offered = std::find(config_.tools.begin(), config_.tools.end(), c.name) != config_.tools.end();
    std::shared_ptr<Tool> tool = offered && env_.find_tool ? env_.find_tool(c.name) : nullptr;
    if (!tool) {
      deliver(epoch, i, {cat("Error: unknown tool '", c.name, "'"), true});
      continue;
    }
    if (args.is_discarded() || !args.is_object()) {
      deliver(epoch, i, {cat("Error: the arguments of '", c.name, "' are not a JSON object"), true});
      continue;
    }
    ToolSlot& slot = *slots_[i];
    // A safety net for tools that ignore their deadline; those that honour it report first.
    slot.timer = std::make_unique<net::steady_timer>(strand_, config_.tool_timeout + kToolTimeoutGrace);
    std::weak_ptr<AgentSession> weak = weak_from_this();
    const std::string name = c.name;
    const auto timeout = config_.tool_timeout;
    slot.timer->async_wait([weak, epoch, i, name, timeout](boost::system::error_code ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->deliver(epoch, i, {"Error: " + timeout_text(name, timeout), true});
    });
    auto strand = strand_;
    slot.cancel->set_progress_sink([weak, strand, epoch, i](const ToolProgress& p) {
      if (auto self = weak.lock())
        net::post(strand, [self, epoch, i, p] {
          if (epoch != self->epoch_ || i >= self->slots_.size() || self->slots_[i]->done) return;
          json ev = {{"id", self->calls_[i].id}, {"name", self->calls_[i].name}, {"progress", p.progress}};
          if (p.total) ev["total"] = *p.total;
          if (!p.message.empty()) ev["message"] = p.message;
          self->emit("tool_progress", std::move(ev));
        });
    });
    try {
      tool->invoke(args, ToolClock::now() + config_.tool_timeout, slot.cancel,
                   [weak, strand, epoch, i](ToolResult r) {
                     if (auto self = weak.lock())
                       net::post(strand, [self, epoch, i, r = std::move(r)]() mutable {
                         self->deliver(epoch, i, std::move(r));
                       });
                   });
    } catch (const std::exception& ex) {
      deliver(epoch, i, {cat("Error: tool '", name, "' failed: ", ex.what()), true});
    }
  }
}

void AgentSession::deliver(uint64_t epoch, size_t index, ToolResult result) {
  if (epoch != epoch_ || index >= slots_.size() || slots_[index]->done) return;
  ToolSlot& slot = *slots_[index];
  slot.done = true;
  slot.cancel->cancel();
  if (slot.timer) slot.timer->cancel();
  slot.result = std::move(result);
  cap_tool_result(slot.result.content, env_.max_tool_result_bytes);
  emit("tool_result", {{"id", calls_[index].id}, {"name", calls_[index].name}, {"content", slot.result.content},
                       {"isError", slot.result.is_error}});
  if (++n_results_ < slots_.size()) return;
  for (size_t i = 0; i < slots_.size(); ++i) messages_.push_back({"tool", slots_[i]->result.content, {}, calls_[i].id});
  slots_.clear();
  save();
  next_turn();
}

void AgentSession::do_cancel() {
  if (!running_) return;
  cancel_requested_ = true;
  if (job_) return env_.generator->cancel(job_);  // the done event ends the run
  if (slots_.empty()) return;
  for (size_t i = 0; i < slots_.size(); ++i) {
    ToolSlot& s = *slots_[i];
    s.cancel->cancel();
    if (s.timer) s.timer->cancel();
    messages_.push_back({"tool", s.done ? s.result.content : "Error: cancelled", {}, calls_[i].id});
  }
  slots_.clear();
  save();
  finish_run("cancelled");
}

void AgentSession::finish_run(const std::string& reason, const std::string& content) {
  ++epoch_;
  job_ = 0;
  slots_.clear();
  json data = {{"reason", reason}, {"turns", turn_}, {"usage", run_usage_}};
  if (reason == "final") data["content"] = content;
  running_ = false;
  emit("done", std::move(data));
}

}  // namespace exl
