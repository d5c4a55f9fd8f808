// An agent session's settings and transcript as JSON, and how they are stored: one file
// <dir>/<session id>.json, replaced atomically (written to a temporary file, then renamed), so a
// crash leaves the previous or the new transcript, never a torn one. Transcripts hold users'
// conversations: every file is 0600, a directory made here is 0700, the server's directory is
// checked private (prepare_private_dir), and prune_transcripts keeps it within a count and byte
// budget.
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

#include "engine/generate/sampler.h"
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
// Makes dir usable for transcripts: creates it with mode 0700 when missing (its parents as
// usual), and throws exl::Error naming it when it is a symlink, not a directory, owned by another
// user, or open to group or others (mode & 077).
void prepare_private_dir(const std::filesystem::path& dir);
// Writes the transcript as a 0600 file, creating dir with mode 0700 when missing (an existing
// dir is used as it is: the server checks its own with prepare_private_dir at start; workflow
// runs write into their output directory). Throws exl::Error naming the file on I/O failure.
void save_transcript(const std::filesystem::path& dir, const Transcript& t);
// Throws exl::Error naming the file when it is missing or malformed, or the id is invalid.
Transcript load_transcript(const std::filesystem::path& dir, std::string_view id);

// How many transcripts a directory keeps; 0 = no limit of that kind.
struct TranscriptRetention {
  size_t max_files = 1000;
  uint64_t max_bytes = uint64_t(256) << 20;
};
// Deletes the oldest transcripts (by modification time, then name) of dir until at most
// max_files remain and they hold at most max_bytes, never one whose id is in `keep` (live
// sessions). Leftover temporary files of crashed writes older than a minute go too. Returns the
// number of transcripts deleted; I/O errors on single files are skipped.
size_t prune_transcripts(const std::filesystem::path& dir, const TranscriptRetention& retention,
                         const std::vector<std::string>& keep = {});

}  // namespace exl
