// One line of a batch input file, parsed, and the result line written for it.
//
// Two input forms, told apart per line:
//  - OpenAI batch: {"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
//    where body is a chat completion request (messages, max_tokens, temperature, response_format
//    json_schema / json_object, tools, ...). Result lines use OpenAI's batch output format:
//    {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}.
//  - simple: {"id", "prompt" | "messages", "schema"?, "system"?, "max_tokens"?, "temperature"?,
//    "seed"?}; a prompt is one user turn; temperature defaults to 0. Result lines are
//    {"id", "output", "finish_reason", "usage"} (output: the parsed JSON with a schema, else the
//    text) or {"id", "error": {"code", "message"}}.
// A line that is not a JSON object, or has no id, gets a result line with "line": N (1-based)
// and its resume key is "#N"; so does the second and later occurrence of a duplicate id.
// Pure functions; any thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/job_engine.h"

namespace exl {

enum class BatchForm : uint8_t { openai, simple };

struct BatchItem {
  size_t line = 0;           // 1-based line number in the input
  BatchForm form = BatchForm::simple;
  std::string key;           // resume key: the id as text, or "#<line>"
  nlohmann::json id;         // custom_id (OpenAI) or id (simple); null when absent
  std::optional<std::string> error;  // the line cannot run: this message ...
  std::string error_code;            // ... this code ...
  int error_status = 0;              // ... and, OpenAI form: 400 = a bad request body, 0 = a bad line
  ChatJobSpec spec;          // when it can run
  bool tools_enabled = false;  // OpenAI: parse tool calls out of the reply
};

// Parses one non-blank input line. default_schema applies to lines that ask for no format.
// Never throws: problems become item.error.
BatchItem parse_batch_line(std::string_view text, size_t line, BatchForm fallback_form,
                           const std::optional<nlohmann::ordered_json>& default_schema, int64_t vocab_size);

// Marks `item` as a duplicate of an earlier line's id.
void mark_duplicate(BatchItem& item);

// The result line (compact JSON, no newline) for an item that could not run.
std::string batch_error_line(const BatchItem& item);
// The result line for a finished job. model_id names the model in OpenAI bodies.
std::string batch_result_line(const BatchItem& item, const JobOutcome& outcome, const std::string& model_id,
                              std::shared_ptr<const ChatTemplate> tmpl);

// The resume key of a result line already in the output file; nullopt when it has none.
std::optional<std::string> batch_result_key(std::string_view result_line);

}  // namespace exl
