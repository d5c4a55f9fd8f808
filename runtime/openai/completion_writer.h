// Turns the generation events of a request's jobs (one per choice, meta.n of them) into the
// OpenAI wire format: a chat.completion / text_completion body with choices 0..n-1, or the SSE
// stream of chunks ("data: {...}\n\n" ... "data: [DONE]\n\n") with
// stream_options.include_usage's final usage chunk. Each chunk carries one choice (its index);
// each choice ends with its own finish_reason chunk; the usage chunk and [DONE] follow the last.
// Usage counts the prompt once (choice 0's prompt and cached tokens) and the completion tokens
// of every choice. A choice that fails ends the whole response with the error (done()). When tool calls may appear (tools given
// and tool_choice not none) a streamed reply is held back until the end, then sent as a content
// delta and one tool_calls delta per call, so clients never see half a call as text.
// With top_logprobs >= 0 every choice carries logprobs: chat {"content": [{token, logprob, bytes,
// top_logprobs}], "refusal": null}, completions {tokens, token_logprobs, top_logprobs,
// text_offset}; a streamed chunk holds the entries of the tokens since the previous chunk (held
// back text's tokens go with the chunk that sends it, or the last one). The values are the
// generator's TokenLogprobs: log-softmax of the model's raw logits, before logit_bias,
// penalties and temperature; end-of-turn tokens (hidden_tokens) are left out, as OpenAI does.
// With meta.responses the same events become the Responses API (POST /v1/responses, one choice):
// a "response" object whose output holds a "message" item (output_text content) and/or
// "function_call" items (status "incomplete" with incomplete_details max_output_tokens when the
// token limit ended it), or, streamed, the named SSE events "event: TYPE\ndata: {...}\n\n" with
// sequence_number 0, 1, ...: response.created, response.in_progress, then per item
// output_item.added, (message) content_part.added, output_text.delta..., output_text.done,
// content_part.done / (call) function_call_arguments.delta, function_call_arguments.done, then
// output_item.done, and response.completed (or response.incomplete); a failure is an "error"
// event. Text streams as it comes unless tool calls may appear (then held back, as for chat).
// Not thread-safe: used on the strand of the owning HTTP session.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "engine/generate/generator.h"
#include "grammar/token_index.h"
#include "runtime/http_message.h"
#include "sessions/chat_template.h"

namespace exl {

struct CompletionMeta {
  bool chat = true;            // chat.completion(.chunk), else text_completion
  bool stream = false;
  bool include_usage = false;
  bool tools_enabled = false;  // parse tool calls out of the reply (chat only)
  std::string id;              // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::string model;
  std::string echo;            // completions with echo: the prompt, sent first
  int32_t top_logprobs = -1;   // >= 0: write logprobs with this many alternatives
  std::shared_ptr<const TokenIndex> vocab;  // each token's bytes (needed with logprobs)
  std::vector<int32_t> hidden_tokens;       // tokens left out of logprobs (the stop tokens)
  int32_t n = 1;                            // choices
  bool responses = false;                   // the Responses API (chat must be true, n 1)
  nlohmann::json response_echo;             // Responses: the request settings the object repeats
};

// "stop", "length" or "tool_calls".
std::string finish_reason_name(FinishReason r, bool has_tool_calls);

class CompletionWriter {
 public:
  CompletionWriter(CompletionMeta meta, std::shared_ptr<const ChatTemplate> tmpl);

  // Streaming: the SSE events that open the stream (the assistant role chunk, the echo).
  std::string begin();
  // Streaming: SSE events for this event of choice `choice` (possibly none). Non-streaming:
  // always "". Events of a choice that is done are ignored.
  std::string on_event(size_t choice, const GenerationEvent& e);
  std::string on_event(const GenerationEvent& e) { return on_event(0, e); }
  // Every choice is done, or one failed.
  bool done() const { return done_; }
  bool choice_done(size_t choice) const { return choices_.at(choice).done; }
  // Choice 0's finish reason.
  FinishReason reason() const { return choices_[0].reason; }
  // The request's totals: choice 0's prompt, cached tokens and timings, every choice's tokens.
  GenerationStats stats() const;
  // One choice's job as the generator reported it (zero until the choice is done).
  const GenerationStats& choice_stats(size_t choice) const { return choices_.at(choice).stats; }
  size_t n_choices() const { return choices_.size(); }
  // Non-streaming, after done(): the response (an error object with status 500 when the
  // generation failed).
  HttpResponse response() const;

 private:
  struct LogprobEntry {
    int32_t token;
    float logprob;
    std::vector<std::pair<int32_t, float>> top;
  };
  struct Choice {
    std::string text;
    bool done = false;
    FinishReason reason = FinishReason::max_tokens;
    std::string error;
    GenerationStats stats;
    std::optional<ParsedReply> parsed;
    std::vector<LogprobEntry> logprobs;
    size_t lp_sent = 0;  // streaming: entries already sent
  };
  std::string chunk(size_t choice, const nlohmann::json& choice_delta, const nlohmann::json& finish,
                    size_t lp_end = size_t(-1));
  // The logprobs object of a choice's entries [from, to) (null when logprobs are off).
  nlohmann::json logprobs_json(const Choice& c, size_t from, size_t to) const;
  std::string finish_events(size_t choice);
  // Responses API.
  std::string response_event(const std::string& type, nlohmann::json fields);
  nlohmann::json response_object(bool final) const;
  nlohmann::json output_items() const;
  std::string message_item_id() const;
  std::string responses_begin();
  std::string responses_done();
  int64_t sequence_ = 0;
  std::string end_events();
  nlohmann::json usage() const;
  const ParsedReply& parsed(size_t choice) const;

  CompletionMeta meta_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  mutable std::vector<Choice> choices_;
  bool done_ = false;
  std::string error_;  // the first failed choice's message
  mutable std::mt19937_64 rng_;
};

}  // namespace exl
