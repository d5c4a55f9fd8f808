// An agent session's settings and transcript as JSON, and how they are stored: one file
// <dir>/<session id>.json, replaced atomically (written to a temporary file, then renamed), so a
// crash leaves the previous or the new transcript, never a torn one.
//
// File shape: {"version":1, "id", "config":{...}, "messages":[OpenAI-shaped messages]}.
// Pure functions; any thread (two writers of one session must be serialized by the caller).
#pragma once
#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "sessions/chat_template.h"

namespace exl {

struct AgentConfig {
  std::string system;                  // system prompt; empty = none
  std::vector<std::string> tools;      // tool names offered to the model, in this order
  nlohmann::ordered_json final_answer_schema;  // null = free-text final answer; properties in the client's order
  int max_turns = 10;                  // model generations per user message
  int max_new_tokens = 256;            // per generation
  SamplerSettings sampling;            // temperature, top_p, top_k, seed are settable
  std::chrono::milliseconds tool_timeout{30000};
};

// Accepts {system?, tools?, finalAnswerSchema?, maxTurns?, maxTokens?, toolTimeoutMs?,
// sampling?:{temperature, top_p, top_k, seed}}; throws exl::Error ("sessions: agent config: ...")
// naming the bad field. Ordered JSON throughout: the final-answer schema's property order is the
// order the grammar makes the model write them in.
AgentConfig agent_config_from_json(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const AgentConfig& c);

nlohmann::ordered_json messages_to_json(const std::vector<ChatMessage>& messages);
// Throws exl::Error ("sessions: transcript: ...") for a malformed message.
std::vector<ChatMessage> messages_from_json(const nlohmann::ordered_json& j);

// True for ids usable as file names: [A-Za-z0-9_-]{1,64}.
bool valid_session_id(std::string_view id);

struct Transcript {
  std::string id;
  AgentConfig config;
  std::vector<ChatMessage> messages;
};

std::filesystem::path transcript_path(const std::filesystem::path& dir, std::string_view id);
// Creates dir when missing. Throws exl::Error naming the file on I/O failure.
void save_transcript(const std::filesystem::path& dir, const Transcript& t);
// Throws exl::Error naming the file when it is missing or malformed, or the id is invalid.
Transcript load_transcript(const std::filesystem::path& dir, std::string_view id);

}  // namespace exl
