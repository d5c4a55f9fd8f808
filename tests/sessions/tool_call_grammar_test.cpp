// Tool-call grammars: the rendered call syntax of each family is accepted and what violates the
// tool's schema, the tool choice or the parallel setting is rejected; random walks through the
// grammar always produce text that the family's own parse_reply turns into valid calls.
#include "sessions/tool_call_grammar.h"

#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar_compose.h"
#include "grammar/grammar_error.h"
#include "grammar/matcher.h"
#include "kernels/error.h"

namespace exl {
namespace tool_call_grammar_test {

using Json = nlohmann::ordered_json;

std::vector<ToolCallSpec> tools() {
  return {{"get_weather", Json::parse(R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
           "unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false})")},
          {"add", Json::parse(R"({"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":99},
           "b":{"type":"integer","minimum":0,"maximum":99}},"required":["a","b"],"additionalProperties":false})")}};
}

bool accepts(const Grammar& g, std::string_view text) {
  Matcher m(std::make_shared<const CompiledGrammar>(g, nullptr));
  return m.accept_bytes(text) && m.is_accepting();
}

ToolCallGrammarOptions opts(ToolCallMode mode, bool parallel = false, std::string name = {}) {
  ToolCallGrammarOptions o;
  o.mode = mode;
  o.parallel_tool_calls = parallel;
  o.tool_name = std::move(name);
  return o;
}

TEST(ToolCallGrammar, CallOrTextRefusesTextThatStartsABadCall) {
  const Grammar cm = tool_call_grammar(ToolFormat::hermes, tools(), opts(ToolCallMode::call_or_text));
  EXPECT_TRUE(accepts(cm, "Hello there"));
  EXPECT_TRUE(accepts(cm, "<tool_cal"));
  EXPECT_TRUE(accepts(cm, "<b>bold</b>\nmore"));
  EXPECT_TRUE(accepts(cm, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1,\"b\":2}}\n</tool_call>"));
  EXPECT_FALSE(accepts(cm, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1}}\n</tool_call>"));
  EXPECT_FALSE(accepts(cm, "<tool_call>anything"));
  EXPECT_FALSE(accepts(cm, ""));
  const Grammar mi = tool_call_grammar(ToolFormat::mistral, tools(), opts(ToolCallMode::call_or_text));
  EXPECT_TRUE(accepts(mi, "[TOOL] is not the marker"));
  EXPECT_TRUE(accepts(mi, R"([TOOL_CALLS] [{"name": "add", "arguments": {"a":3,"b":4}}])"));
  EXPECT_FALSE(accepts(mi, "[TOOL_CALLS] hi"));
  const Grammar l3 = tool_call_grammar(ToolFormat::llama3_json, tools(), opts(ToolCallMode::call_or_text));
  EXPECT_TRUE(accepts(l3, "text with {braces}"));
  EXPECT_TRUE(accepts(l3, R"({"name": "add", "parameters": {"a":1,"b":2}})"));
  EXPECT_FALSE(accepts(l3, "{"));
  EXPECT_FALSE(accepts(l3, R"({"name": "nope"})"));
}

TEST(ToolCallGrammar, AcceptsEachFamilysRenderedSyntax) {
  const Grammar l3 = tool_call_grammar(ToolFormat::llama3_json, tools(), opts(ToolCallMode::required));
  EXPECT_TRUE(accepts(l3, R"({"name": "add", "parameters": {"a":1,"b":2}})"));
  EXPECT_FALSE(accepts(l3, R"({"name": "add", "arguments": {"a":1,"b":2}})"));
  EXPECT_FALSE(accepts(l3, R"({"name": "add", "parameters": {"a":1,"b":200}})"));
  EXPECT_FALSE(accepts(l3, R"({"name": "sub", "parameters": {"a":1,"b":2}})"));

  const Grammar cm = tool_call_grammar(ToolFormat::hermes, tools(), opts(ToolCallMode::required, true));
  const std::string one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\",\"unit\":\"c\"}}\n</tool_call>";
  const std::string two = one + "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":3,\"b\":4}}\n</tool_call>";
  EXPECT_TRUE(accepts(cm, one));
  EXPECT_TRUE(accepts(cm, two));
  EXPECT_FALSE(accepts(cm, one + "\n"));
  const Grammar cm1 = tool_call_grammar(ToolFormat::hermes, tools(), opts(ToolCallMode::required, false));
  EXPECT_TRUE(accepts(cm1, one));
  EXPECT_FALSE(accepts(cm1, two));

  const Grammar mi = tool_call_grammar(ToolFormat::mistral, tools(), opts(ToolCallMode::named, true, "add"));
  EXPECT_TRUE(accepts(mi, R"([TOOL_CALLS] [{"name": "add", "arguments": {"a":3,"b":4}}, {"name": "add", "arguments": {"a":0,"b":0}}])"));
  EXPECT_FALSE(accepts(mi, R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city":"Oslo","unit":"c"}}])"));
}

// With json.dumps spacing, as the server and agent sessions compile it.
ToolCallGrammarOptions spaced(ToolCallGrammarOptions o) {
  o.schema_options.whitespace = JsonSchemaOptions::Whitespace::spaced;
  return o;
}

// parallel_tool_calls false with tool_choice auto: one call, or text with no call markup anywhere,
// so no reply parses into two calls (text before a call would let a second one follow).
TEST(ToolCallGrammar, CallOrPlainTextHoldsAtMostOneCall) {
  const std::string one = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1,\"b\":2}}\n</tool_call>";
  const Grammar cm = tool_call_grammar(ToolFormat::hermes, tools(), opts(ToolCallMode::call_or_plain_text, false));
  EXPECT_TRUE(accepts(cm, "Hello there"));
  EXPECT_TRUE(accepts(cm, one));
  EXPECT_FALSE(accepts(cm, one + "\n" + one));
  EXPECT_FALSE(accepts(cm, "Sure. " + one));
  EXPECT_FALSE(accepts(cm, "Sure. " + one + "\n" + one));
  EXPECT_FALSE(accepts(cm, ""));
  const Grammar par = tool_call_grammar(ToolFormat::hermes, tools(), opts(ToolCallMode::call_or_plain_text, true));
  EXPECT_TRUE(accepts(par, one + "\n" + one)) << "parallel calls stay possible when allowed";
  const Grammar mi = tool_call_grammar(ToolFormat::mistral, tools(), opts(ToolCallMode::call_or_plain_text, false));
  EXPECT_TRUE(accepts(mi, R"([TOOL_CALLS] [{"name": "add", "arguments": {"a":3,"b":4}}])"));
  EXPECT_FALSE(accepts(mi, R"([TOOL_CALLS] [{"name": "add", "arguments": {"a":3,"b":4}}, {"name": "add", "arguments": {"a":0,"b":0}}])"));
  EXPECT_FALSE(accepts(mi, R"(ok [TOOL_CALLS] [{"name": "add", "arguments": {"a":3,"b":4}}])"));
  const Grammar ge = tool_call_grammar(ToolFormat::generic, tools(), spaced(opts(ToolCallMode::call_or_plain_text, false)));
  const std::string g1 = R"(<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>)";
  EXPECT_TRUE(accepts(ge, g1));
  EXPECT_FALSE(accepts(ge, g1 + "\n" + g1));
  EXPECT_TRUE(accepts(ge, "Four."));
}

TEST(ToolCallGrammar, GenericFormatAcceptsOnlyCallsOfOfferedTools) {
  const Grammar g = tool_call_grammar(ToolFormat::generic, tools(), spaced(opts(ToolCallMode::required, true)));
  const std::string one = R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}</tool_call>)";
  const std::string two = one + "\n" + R"(<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>)";
  EXPECT_TRUE(accepts(g, one));
  EXPECT_TRUE(accepts(g, two));
  EXPECT_FALSE(accepts(g, R"(<tool_call>{"name": "sub", "arguments": {"a": 3, "b": 4}}</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>{"name": "add", "arguments": {"a": 3}}</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>{"name": "add", "arguments": {"a": 3, "b": 400}}</tool_call>)"));
  EXPECT_FALSE(accepts(g, R"(<tool_call>{"name": "add", "parameters": {"a": 3, "b": 4}}</tool_call>)"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n" + one.substr(11)));  // the hermes layout is not the generic one
  EXPECT_FALSE(accepts(g, "Sure. " + one));
  EXPECT_FALSE(accepts(g, one + "\n"));
  const Grammar single = tool_call_grammar(ToolFormat::generic, tools(), spaced(opts(ToolCallMode::required, false)));
  EXPECT_TRUE(accepts(single, one));
  EXPECT_FALSE(accepts(single, two));
  const Grammar named = tool_call_grammar(ToolFormat::generic, tools(), spaced(opts(ToolCallMode::named, false, "add")));
  EXPECT_FALSE(accepts(named, one));
  EXPECT_TRUE(accepts(named, R"(<tool_call>{"name": "add", "arguments": {"a": 0, "b": 99}}</tool_call>)"));
  auto tmpl = make_chat_template(parse_template_name("llama2"), {});
  const ParsedReply r = tmpl->parse_reply(two, true);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(r.tool_calls[0].arguments), Json::parse(R"({"city": "Oslo", "unit": "c"})"));
  EXPECT_EQ(r.tool_calls[1].name, "add");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(tmpl->parse_reply(two, false).tool_calls.empty());
}

TEST(ToolCallGrammar, NoCallRefusesCallMarkupAnywhere) {
  for (ToolFormat f : {ToolFormat::hermes, ToolFormat::generic, ToolFormat::mistral}) {
    const Grammar g = tool_call_grammar(f, {}, opts(ToolCallMode::no_call));
    const std::string marker = f == ToolFormat::mistral ? "[TOOL_CALLS]" : "<tool_call>";
    EXPECT_TRUE(accepts(g, "Hello there")) << to_string(f);
    EXPECT_TRUE(accepts(g, "a <b>bold</b> [TOOL] <tool_cal <tool_call [TOOL_CALL")) << to_string(f);
    EXPECT_TRUE(accepts(g, "{\"name\": \"add\", \"arguments\": {}}")) << to_string(f);
    EXPECT_FALSE(accepts(g, "")) << to_string(f);
    EXPECT_FALSE(accepts(g, marker)) << to_string(f);
    EXPECT_FALSE(accepts(g, marker + "{\"name\": \"add\", \"arguments\": {}}")) << to_string(f);
    EXPECT_FALSE(accepts(g, "Let me check.\n" + marker + "\n{}")) << to_string(f);
    EXPECT_FALSE(accepts(g, "<<tool_call><" + marker)) << to_string(f);
    EXPECT_FALSE(accepts(g, std::string(1, marker[0]) + marker)) << to_string(f);
  }
  const Grammar l3 = tool_call_grammar(ToolFormat::llama3_json, {}, opts(ToolCallMode::no_call));
  EXPECT_TRUE(accepts(l3, "text with {braces}"));
  EXPECT_FALSE(accepts(l3, R"({"name": "add", "parameters": {"a": 1, "b": 2}})"));
  EXPECT_FALSE(accepts(l3, "  \n{"));
  EXPECT_FALSE(accepts(l3, " "));
}

TEST(ToolCallGrammar, FinalAnswerAndCallOrFinal) {
  ToolCallGrammarOptions o = opts(ToolCallMode::final_answer);
  o.final_schema = Json::parse(R"({"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]})");
  const Grammar fin = tool_call_grammar(ToolFormat::hermes, {}, o);
  EXPECT_TRUE(accepts(fin, R"({"answer":"42"})"));
  EXPECT_FALSE(accepts(fin, R"({"answer":42})"));
  o.mode = ToolCallMode::call_or_final;
  const Grammar both = tool_call_grammar(ToolFormat::hermes, tools(), o);
  EXPECT_TRUE(accepts(both, R"({"answer":"42"})"));
  EXPECT_TRUE(accepts(both, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":3,\"b\":4}}\n</tool_call>"));
}

TEST(ToolCallGrammar, ErrorsNameTheProblem) {
  EXPECT_THROW(tool_call_grammar(ToolFormat::hermes, {}, opts(ToolCallMode::required)), Error);
  EXPECT_THROW(tool_call_grammar(ToolFormat::hermes, tools(), opts(ToolCallMode::named, false, "nope")), Error);
  std::vector<ToolCallSpec> bad{{"f", Json::parse(R"({"type":"object","properties":{"x":{"$recursiveRef":"#meta"}}})")}};
  try {
    tool_call_grammar(ToolFormat::hermes, bad, opts(ToolCallMode::required));
    FAIL() << "no error";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("tool 'f'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'$recursiveRef'"), std::string::npos) << e.what();
  }
  auto specs = tool_specs_from_openai(Json::parse(R"([{"type":"function","function":{"name":"x"}}])"));
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_TRUE(specs[0].parameters.is_null());
  EXPECT_THROW(tool_specs_from_openai(Json::parse(R"([{"type":"function"}])")), Error);
}

// A vocabulary of the printable ASCII bytes plus EOS (id 95).
std::shared_ptr<const TokenIndex> ascii_index() {
  std::vector<std::string> bytes;
  for (int c = 0x20; c < 0x7F; ++c) bytes.emplace_back(1, char(c));
  bytes.emplace_back();  // EOS
  bytes[0] = " ";
  bytes.emplace_back("\n");
  return std::make_shared<TokenIndex>(std::move(bytes), std::vector<int32_t>{95});
}

// Walks the grammar choosing allowed tokens at random, preferring EOS and closing characters so
// walks end; nullopt when a walk runs past the limit.
std::optional<std::string> random_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng) {
  Matcher m(g);
  std::string out;
  std::vector<uint32_t> mask(g->index()->mask_words());
  for (int step = 0; step < 600; ++step) {
    std::fill(mask.begin(), mask.end(), 0u);
    m.fill_mask(mask);
    std::vector<int32_t> allowed, closers;
    for (int32_t t = 0; t < int32_t(g->index()->vocab_size()); ++t)
      if (mask[size_t(t) / 32] >> (t % 32) & 1) {
        allowed.push_back(t);
        const std::string& b = g->index()->bytes(t);
        if (t == 95 || b == "\"" || b == "}" || b == "]") closers.push_back(t);
      }
    if (allowed.empty()) return std::nullopt;
    const auto& pool = (!closers.empty() && rng() % 3 == 0) ? closers : allowed;
    const int32_t t = pool[rng() % pool.size()];
    EXPECT_TRUE(m.accept(t));
    if (t == 95) return out;
    out += g->index()->bytes(t);
  }
  return std::nullopt;
}

TEST(ToolCallGrammar, RandomWalksParseIntoValidCalls) {
  const auto idx = ascii_index();
  std::mt19937 rng(1234);
  for (const char* name : {"llama3", "chatml", "mistral", "llama2", "llama3.0"}) {
    auto tmpl = make_chat_template(parse_template_name(name), {});
    const ToolFormat f = tmpl->tool_format();
    auto g = std::make_shared<const CompiledGrammar>(tool_call_grammar(f, tools(), opts(ToolCallMode::required, true)), idx);
    int finished = 0;
    for (int walk = 0; walk < 40; ++walk) {
      std::optional<std::string> text = random_walk(g, rng);
      if (!text) continue;
      ++finished;
      ParsedReply r = tmpl->parse_reply(*text, true);
      ASSERT_FALSE(r.tool_calls.empty()) << to_string(f) << ": " << *text;
      if (f == ToolFormat::llama3_json) {
        EXPECT_EQ(r.tool_calls.size(), 1u);
      }
      for (const ToolCall& c : r.tool_calls) {
        Json args = Json::parse(c.arguments);
        if (c.name == "add") {
          ASSERT_EQ(args.size(), 2u) << *text;
          EXPECT_TRUE(args.at("a").is_number_integer() && args.at("a").get<int>() >= 0 && args.at("a").get<int>() <= 99);
          EXPECT_TRUE(args.at("b").is_number_integer() && args.at("b").get<int>() >= 0 && args.at("b").get<int>() <= 99);
        } else {
          ASSERT_EQ(c.name, "get_weather") << *text;
          ASSERT_EQ(args.size(), 2u) << *text;
          EXPECT_LE(args.at("city").get<std::string>().size(), 12u);
          EXPECT_TRUE(args.at("unit") == "c" || args.at("unit") == "f");
        }
      }
    }
    EXPECT_GE(finished, 20) << to_string(f);
  }
}

TEST(GrammarCompose, ListsSequencesAndEmbeddedRulesCompose) {
  GrammarComposer c;
  EXPECT_THROW(c.sequence("empty", {SeqItem::text("")}), GrammarError);
  EXPECT_THROW(c.list("bad", 7, ",", true), GrammarError);
  const int32_t x = c.sequence("x", {SeqItem::text("ab")});
  const int32_t y = c.sequence("y", {SeqItem::text("c")});
  const int32_t alt = c.alternatives("xy", {x, y});
  const int32_t lst = c.list("l", alt, ",", true);
  const Grammar g = c.finish(c.sequence("root", {SeqItem::text("["), SeqItem::call(lst), SeqItem::text("]")}));
  EXPECT_TRUE(accepts(g, "[ab]"));
  EXPECT_TRUE(accepts(g, "[ab,c,ab]"));
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_FALSE(accepts(g, "[ab,]"));
  EXPECT_FALSE(accepts(g, "[a]"));
}

}  // namespace tool_call_grammar_test
}  // namespace exl
