// OpenAI request bodies (/v1/chat/completions, /v1/completions) parsed and range-checked into
// plain structs. Every bad field is an ApiError 400 naming the field; unknown fields are ignored, as
// OpenAI-compatible local servers do. Pure functions; any thread.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/generate/sampler.h"
#include "engine/generate/speculation.h"
#include "sessions/chat_template.h"

namespace exl {

// The fields both endpoints share.
struct GenerationRequest {
  std::string model;
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  std::optional<int64_t> max_tokens;      // max_completion_tokens, else max_tokens
  std::vector<std::string> stop;          // at most 4, non-empty
  SamplerSettings sampling;               // temperature, top_p, seed, logit_bias, penalties, top_k, min_p
  // -1: no logprobs; else each token's log-probability and this many top alternatives (chat:
  // logprobs true with top_logprobs 0..kMaxTopLogprobs; completions: logprobs 0..kMaxCompletionLogprobs).
  int32_t top_logprobs = -1;
  // Choices to generate (1..kMaxChoices), each its own job on the generator; choice i > 0 samples
  // with choice_seed(sampling.seed, i).
  int32_t n = 1;
  // exlagent's extension "speculate": "none" | "ngram" | "draft" | "auto"; unset: the server's
  // --speculate ("draft" needs the server's --draft-model).
  std::optional<Speculation> speculate;
};

inline constexpr int64_t kMaxTopLogprobs = 20;        // OpenAI's limits
inline constexpr int64_t kMaxChoices = 16;            // this server's limit on n

// The seed of choice `index` of a request seeded with `seed`: the seed itself for choice 0, a
// distinct mix of it for the others, so the choices differ and the whole response is reproducible.
// No seed (or 0, which the sampler treats as "draw one") stays unseeded.
std::optional<uint64_t> choice_seed(std::optional<uint64_t> seed, int32_t index);
inline constexpr int64_t kMaxCompletionLogprobs = 5;

enum class ToolChoice : uint8_t { none, auto_, required, named };

struct ChatRequest {
  GenerationRequest gen;
  std::vector<ChatMessage> messages;        // developer is mapped to system
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI tool objects, validated
  ToolChoice tool_choice = ToolChoice::none;  // default: auto when tools are given
  std::string tool_choice_name;               // named
  bool parallel_tool_calls = true;
  std::string response_format = "text";       // text, json_object, json_schema
  nlohmann::ordered_json json_schema;         // response_format.json_schema.schema
};

struct CompletionRequest {
  GenerationRequest gen;
  std::string prompt;
  bool echo = false;
};

// A request body as a JSON object (key order kept); ApiError 400 invalid_json when it is not JSON,
// not an object, or nests deeper than kMaxJsonDepth.
nlohmann::ordered_json parse_request_body(std::string_view body);

// vocab_size bounds logit_bias token ids. Throws ApiError.
ChatRequest parse_chat_request(std::string_view body, int64_t vocab_size);
CompletionRequest parse_completion_request(std::string_view body, int64_t vocab_size);

}  // namespace exl
