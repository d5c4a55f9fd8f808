// Agent turn constraints: without a final-answer schema a turn is free text; with one, every walk
// through the grammar (random allowed tokens on a real vocabulary) ends in text the template parses
// either as a call of an offered tool with schema-valid arguments or as a schema-valid answer.
#include "sessions/agent_constraint.h"

#include <gtest/gtest.h>

#include <random>

#include "engine/generate/sampler.h"
#include "test_support.h"

namespace exl {
namespace agent_constraint_test {

using Json = nlohmann::ordered_json;

std::string walk(LogitsMaskHook& hook, const Tokenizer& tok, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out;
  std::vector<uint32_t> mask(mask_words(size_t(tok.vocab_size())));
  const auto& eos = tok.eos_ids();
  for (int step = 0; step < 400 && !hook.terminated(); ++step) {
    std::vector<int32_t> forced = hook.forced_tokens(out);
    if (!forced.empty()) {
      for (int32_t t : forced) {
        hook.accept(t);
        out.push_back(t);
      }
      continue;
    }
    std::fill(mask.begin(), mask.end(), 0u);
    hook.fill_mask(mask);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < tok.vocab_size(); ++t)
      if (mask[size_t(t) / 32] >> (t % 32) & 1u) allowed.push_back(t);
    EXPECT_FALSE(allowed.empty()) << "the grammar got stuck";
    if (allowed.empty()) break;
    const int32_t t = allowed[rng() % allowed.size()];
    hook.accept(t);
    out.push_back(t);
    if (eos.count(t)) break;
  }
  std::vector<int32_t> text_ids;
  for (int32_t t : out)
    if (!eos.count(t)) text_ids.push_back(t);
  return tok.decode(text_ids);
}

TEST(AgentConstraint, FinalAnswerOrToolCallIsAlwaysValid) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto tok = load_tokenizer(test::shared_dir() / "models/stories260K-hf");
  auto tmpl = make_chat_template({TemplateFamily::mistral, {}, false}, {"<s>", "</s>"});
  const Json final_schema = Json::parse(
      R"({"type":"object","properties":{"zeta":{"type":"integer","minimum":0,"maximum":9},"answer":{"type":"string","maxLength":6}},"required":["zeta","answer"],"additionalProperties":false})");
  const Json tools = Json::parse(R"([{"type":"function","function":{"name":"add","parameters":{"type":"object",
      "properties":{"a":{"type":"integer","minimum":0,"maximum":9}},"required":["a"],"additionalProperties":false}}}])");
  const Json no_tools = Json::array();
  std::vector<ChatMessage> msgs;

  const Json none;
  EXPECT_EQ(make_agent_turn_constraint({1, msgs, &no_tools, &none, ToolFormat::mistral}, *tok), nullptr);

  int calls = 0, answers = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    const bool with_tools = seed % 2 == 0;
    auto hook = make_agent_turn_constraint({1, msgs, with_tools ? &tools : &no_tools, &final_schema, ToolFormat::mistral}, *tok);
    ASSERT_NE(hook, nullptr);
    const std::string text = walk(*hook, *tok, seed);
    ParsedReply r = tmpl->parse_reply(text, with_tools);
    if (!r.tool_calls.empty()) {
      ++calls;
      ASSERT_TRUE(with_tools) << text;
      for (const auto& c : r.tool_calls) {
        EXPECT_EQ(c.name, "add") << text;
        const auto args = nlohmann::json::parse(c.arguments);
        ASSERT_TRUE(args.contains("a")) << text;
        EXPECT_TRUE(args["a"].is_number_integer() && args["a"] >= 0 && args["a"] <= 9) << text;
        EXPECT_EQ(args.size(), 1u) << text;
      }
    } else {
      ++answers;
      const auto j = nlohmann::json::parse(text);
      ASSERT_TRUE(j.is_object() && j.size() == 2 && j["answer"].is_string() && j["zeta"].is_number_integer()) << text;
      EXPECT_LE(j["answer"].get<std::string>().size(), 6u * 4) << text;
      EXPECT_LT(text.find("\"zeta\""), text.find("\"answer\"")) << "properties in the schema's order: " << text;
    }
  }
  EXPECT_GT(answers, 0);
  EXPECT_GT(calls, 0);
}

TEST(AgentConstraint, ToolsWithoutSchemaGiveAValidCallOrText) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto tok = load_tokenizer(test::shared_dir() / "models/stories260K-hf");
  auto tmpl = make_chat_template({TemplateFamily::mistral, {}, false}, {"<s>", "</s>"});
  const Json tools = Json::parse(R"([{"type":"function","function":{"name":"add","parameters":{"type":"object",
      "properties":{"a":{"type":"integer","minimum":0,"maximum":9}},"required":["a"],"additionalProperties":false}}}])");
  const Json none;
  std::vector<ChatMessage> msgs;
  int calls = 0, texts = 0;
  for (uint32_t seed = 1; seed <= 16; ++seed) {
    auto hook = make_agent_turn_constraint({1, msgs, &tools, &none, ToolFormat::mistral}, *tok);
    ASSERT_NE(hook, nullptr);
    const std::string text = walk(*hook, *tok, seed);
    ParsedReply r = tmpl->parse_reply(text, true);
    if (text.rfind("[TOOL_CALLS]", 0) == 0) {
      ++calls;
      ASSERT_EQ(r.tool_calls.size(), 1u) << text;
      const auto args = nlohmann::json::parse(r.tool_calls[0].arguments);
      EXPECT_TRUE(args.size() == 1 && args["a"].is_number_integer() && args["a"] >= 0 && args["a"] <= 9) << text;
    } else {
      ++texts;
      EXPECT_FALSE(text.empty());
    }
  }
  EXPECT_GT(texts, 0);
}

TEST(AgentConstraint, UnenforceableFinalSchemaIsAnError) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto tok = load_tokenizer(test::shared_dir() / "models/stories260K-hf");
  const Json bad = Json::parse(R"({"type":"string","pattern":"(a)\\1"})");
  const Json no_tools = Json::array();
  std::vector<ChatMessage> msgs;
  EXPECT_ANY_THROW(make_agent_turn_constraint({1, msgs, &no_tools, &bad, ToolFormat::mistral}, *tok));
}

}  // namespace agent_constraint_test
}  // namespace exl
