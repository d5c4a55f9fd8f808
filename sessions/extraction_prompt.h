// The conversation an extraction job sends to a chat model: a system message holding the
// instructions, "\n\nSchema:\n" and the JSON Schema as Python's json.dumps writes it (", " and
// ": " separators, schema key order), a user message holding the document, and the generation
// prompt for the assistant, whose reply is the JSON object only. The embedded demo model
// (examples/demo-model/gen_data.py: SYSTEM_EXTRACT, extraction_example) is trained on exactly this
// layout, so keep the two in step. Pure functions; any thread.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sessions/chat_template.h"

namespace exl {

// Used when the caller gives no instructions (the demo model's training instructions).
std::string_view default_extraction_instructions();

// instructions empty = the default ones. Throws exl::Error for a schema that is not valid UTF-8.
std::vector<ChatMessage> extraction_messages(std::string_view instructions, const nlohmann::ordered_json& schema,
                                             std::string_view document);

}  // namespace exl
