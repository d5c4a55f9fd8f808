// Turns one job's generation events into the OpenAI wire format: a chat.completion /
// text_completion body, or the SSE stream of chunks ("data: {...}\n\n" ... "data: [DONE]\n\n")
// with stream_options.include_usage's final usage chunk. When tool calls may appear (tools given
// and tool_choice not none) a streamed reply is held back until the end, then sent as a content
// delta and one tool_calls delta per call, so clients never see half a call as text.
// With top_logprobs >= 0 every choice carries logprobs: chat {"content": [{token, logprob, bytes,
// top_logprobs}], "refusal": null}, completions {tokens, token_logprobs, top_logprobs,
// text_offset}; a streamed chunk holds the entries of the tokens since the previous chunk (held
// back text's tokens go with the chunk that sends it, or the last one). The values are the
// generator's TokenLogprobs: log-softmax of the model's raw logits, before logit_bias,
// penalties and temperature; end-of-turn tokens (hidden_tokens) are left out, as OpenAI does.
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
};

// "stop", "length" or "tool_calls".
std::string finish_reason_name(FinishReason r, bool has_tool_calls);

class CompletionWriter {
 public:
  CompletionWriter(CompletionMeta meta, std::shared_ptr<const ChatTemplate> tmpl);

  // Streaming: the SSE events that open the stream (the assistant role chunk, the echo).
  std::string begin();
  // Streaming: SSE events for this event (possibly none). Non-streaming: always "".
  std::string on_event(const GenerationEvent& e);
  bool done() const { return done_; }
  FinishReason reason() const { return reason_; }
  const GenerationStats& stats() const { return stats_; }
  // Non-streaming, after done(): the response (an error object with status 500 when the
  // generation failed).
  HttpResponse response() const;

 private:
  struct LogprobEntry {
    int32_t token;
    float logprob;
    std::vector<std::pair<int32_t, float>> top;
  };
  std::string chunk(const nlohmann::json& choice_delta, const nlohmann::json& finish,
                    size_t lp_end = size_t(-1));
  // The logprobs object of entries [from, to) (null when logprobs are off).
  nlohmann::json logprobs_json(size_t from, size_t to) const;
  std::string finish_events();
  nlohmann::json usage() const;
  ParsedReply parsed() const;

  CompletionMeta meta_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  std::string text_;
  bool done_ = false;
  FinishReason reason_ = FinishReason::max_tokens;
  std::string error_;
  GenerationStats stats_;
  mutable std::mt19937_64 rng_;
  mutable std::optional<ParsedReply> parsed_;
  std::vector<LogprobEntry> logprobs_;
  size_t lp_sent_ = 0;  // streaming: entries already sent
};

}  // namespace exl
