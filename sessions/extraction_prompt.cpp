#include "sessions/extraction_prompt.h"

#include "sessions/python_json.h"

namespace exl {

std::string_view default_extraction_instructions() {
  return "You extract structured data. Read the user's document and answer with one JSON object that matches this "
         "JSON Schema. Copy names exactly, write dates as YYYY-MM-DD and amounts as numbers. Answer with the JSON "
         "only.";
}

std::vector<ChatMessage> extraction_messages(std::string_view instructions, const nlohmann::ordered_json& schema,
                                             std::string_view document) {
  if (instructions.empty()) instructions = default_extraction_instructions();
  ChatMessage sys{"system", std::string(instructions) + "\n\nSchema:\n" + python_json_dumps(schema), {}, {}};
  ChatMessage user{"user", std::string(document), {}, {}};
  return {std::move(sys), std::move(user)};
}

}  // namespace exl
