#include "sessions/extraction_prompt.h"

#include <gtest/gtest.h>

namespace exl {
namespace extraction_prompt_test {

// The expected text is what examples/demo-model/gen_data.py builds for the same schema
// (SYSTEM_EXTRACT + json.dumps(schema)), so the demo model sees its training layout.
TEST(ExtractionPrompt, MatchesTheDemoModelsTrainingLayout) {
  const auto schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})");
  const auto ms = extraction_messages("", schema, "Ann is 31.");
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].role, "system");
  EXPECT_EQ(ms[0].content,
            "You extract structured data. Read the user's document and answer with one JSON object that matches this "
            "JSON Schema. Copy names exactly, write dates as YYYY-MM-DD and amounts as numbers. Answer with the JSON "
            "only.\n\nSchema:\n"
            R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]})");
  EXPECT_EQ(ms[1].role, "user");
  EXPECT_EQ(ms[1].content, "Ann is 31.");
  EXPECT_EQ(extraction_messages("Find people.", schema, "x")[0].content.substr(0, 22), "Find people.\n\nSchema:\n");
}

}  // namespace extraction_prompt_test
}  // namespace exl
