// Chat templates against the official Hugging Face templates. Every expected string below was
// rendered by Python jinja2 (HF's environment: trim_blocks, lstrip_blocks, json.dumps tojson) from
// the official template text: Llama 3.1 Instruct, Llama 3.0 Instruct and Qwen3 (the last two read
// from ../shared/models/*/tokenizer_config.json), Qwen2.5 Instruct, Mistral-7B-Instruct-v0.3 and
// Llama-2-chat.
#include <gtest/gtest.h>

#include "kernels/error.h"
#include "sessions/chat_template.h"
#include "sessions/python_json.h"
#include "test_support.h"

namespace exl {
namespace chat_template_test {

using Json = nlohmann::ordered_json;

Json tools() {
  return Json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Get the weather",
    "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");
}

ChatMessage msg(std::string role, std::string content) { return {std::move(role), std::move(content), {}, {}}; }
ChatMessage call(std::vector<std::pair<std::string, std::string>> calls, std::string content = {}) {
  ChatMessage m{"assistant", std::move(content), {}, {}};
  for (auto& [id, args] : calls) m.tool_calls.push_back({id, "get_weather", args});
  return m;
}
ChatMessage result(std::string id, std::string content) { return {"tool", std::move(content), {}, std::move(id)}; }

std::unique_ptr<ChatTemplate> tmpl(std::string_view name, TemplateTokens t = {}) {
  return make_chat_template(parse_template_name(name), std::move(t));
}

const char* kToolBlockQwen =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
    "\"get_weather\", \"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a "
    "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

const char* kGenericTools =
    "You can call these tools. To call one, reply with only <tool_call>{\"name\": <tool name>, \"arguments\": "
    "<arguments object>}</tool_call>.\nTools:\n{\"name\": \"get_weather\", \"description\": \"Get the weather\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
    "[\"city\"]}}";
const char* kGenericCall = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";

const char* kMistralTools =
    "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the "
    "weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
    "\"required\": [\"city\"]}}}][/AVAILABLE_TOOLS]";

TEST(ChatTemplate, Llama31PlainConversation) {
  std::vector<ChatMessage> m = {msg("system", "You are terse."), msg("user", "Hi there"), msg("assistant", "Hello."),
                                msg("user", "Bye")};
  EXPECT_EQ(tmpl("llama3")->render(m, nullptr, true).text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
            "2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi "
            "there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|"
            "end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  std::vector<ChatMessage> m2 = {msg("user", "Hi"), msg("assistant", "Hello.")};
  EXPECT_EQ(tmpl("llama3")->render(m2, Json::array(), false).text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
            "2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|"
            "start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>");
}

TEST(ChatTemplate, Llama31ToolCallAndIpythonResult) {
  std::vector<ChatMessage> m = {msg("user", "Weather in Oslo?"), call({{"call_1", R"({"city":"Oslo"})"}}),
                                result("call_1", "4 C")};
  EXPECT_EQ(
      tmpl("llama3")->render(m, tools(), true).text,
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: "
      "December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the "
      "following functions, please respond with a JSON for a function call with its proper arguments that best "
      "answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
      "argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n   "
      "     \"name\": \"get_weather\",\n        \"description\": \"Get the weather\",\n        \"parameters\": {\n    "
      "        \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    "
      "\"type\": \"string\"\n                }\n            },\n            \"required\": [\n                "
      "\"city\"\n            ]\n        }\n    }\n}\n\nWeather in "
      "Oslo?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": "
      "{\"city\": \"Oslo\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"4 "
      "C\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THROW(tmpl("llama3")->render(std::vector<ChatMessage>{call({{"a", "{}"}, {"b", "{}"}})}, nullptr, true),
               Error);
}

TEST(ChatTemplate, Llama30FromSharedTokenizerConfig) {
  EXL_REQUIRE_SHARED("models/llama3-tokenizer/tokenizer_config.json");
  auto text = read_chat_template(test::shared_dir() / "models/llama3-tokenizer");
  ASSERT_TRUE(text.has_value());
  auto choice = detect_template_family(*text);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->family, TemplateFamily::llama3);
  EXPECT_TRUE(choice->llama3_0);
  std::vector<ChatMessage> m = {msg("system", "You are terse."), msg("user", "Hi there")};
  EXPECT_EQ(make_chat_template(*choice, {"<|begin_of_text|>", ""})->render(m, nullptr, true).text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_"
            "id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // No native tool format: the generic one, the tool prompt in a system turn added before the
  // conversation, tool results as a user turn.
  std::vector<ChatMessage> t = {msg("user", "Weather in Oslo?"), call({{"id1", R"({"city":"Oslo"})"}}),
                                result("id1", "4")};
  EXPECT_EQ(make_chat_template(*choice, {"<|begin_of_text|>", ""})->render(t, tools(), true).text,
            std::string("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n") + kGenericTools +
                "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWeather in Oslo?<|eot_id|><|start_header_id|>"
                "assistant<|end_header_id|>\n\n" + kGenericCall +
                "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n<tool_response>\n4\n</tool_response><|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
  m[1].role = "robot";
  try {
    make_chat_template(*choice, {})->render(m, nullptr, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama3.0: unknown role 'robot'"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, Qwen25DefaultSystemAndParallelCalls) {
  std::vector<ChatMessage> m = {msg("user", "Hi there"), msg("assistant", "Hello."), msg("user", "Bye")};
  EXPECT_EQ(tmpl("qwen2.5")->render(m, nullptr, true).text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|"
            "im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  std::vector<ChatMessage> t = {msg("system", "You are terse."),
                                msg("user", "Weather in Oslo and Rome?"),
                                call({{"call_1", R"({"city":"Oslo"})"}, {"call_2", R"({"city": "Rome"})"}}),
                                result("call_1", "4 C"),
                                result("call_2", "19 C"),
                                msg("assistant", "Cold and warm.")};
  EXPECT_EQ(tmpl("qwen2.5")->render(t, tools(), false).text,
            std::string("<|im_start|>system\nYou are terse.\n\n") + kToolBlockQwen +
                "<|im_start|>user\nWeather in Oslo and Rome?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": "
                "\"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
                "\"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<"
                "tool_response>\n4 C\n</tool_response>\n<tool_response>\n19 C\n</tool_response><|im_end|>\n<|im_"
                "start|>assistant\nCold and warm.<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3TemplateDetectedAsPlainChatml) {
  EXL_REQUIRE_SHARED("models/qwen3-tokenizer/tokenizer_config.json");
  auto choice = choose_template(test::shared_dir() / "models/qwen3-tokenizer");
  EXPECT_EQ(choice.family, TemplateFamily::chatml);
  EXPECT_EQ(choice.default_system, "");
  std::vector<ChatMessage> m = {msg("user", "Weather in Oslo?"), call({{"call_1", R"({"city":"Oslo"})"}}, "Let me check."),
                                result("call_1", "4 C")};
  EXPECT_EQ(make_chat_template(choice, {})->render(m, tools(), true).text,
            std::string("<|im_start|>system\n") + kToolBlockQwen +
                "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\nLet me "
                "check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                "\"Oslo\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n4 "
                "C\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, MistralV03Tools) {
  std::vector<ChatMessage> single = {msg("system", "You are terse."), msg("user", "Weather in Oslo?")};
  EXPECT_EQ(tmpl("mistral")->render(single, tools(), true).text,
            std::string("<s>") + kMistralTools + "[INST] You are terse.\n\nWeather in Oslo?[/INST]");
  std::vector<ChatMessage> multi = {msg("user", "Weather in Oslo?"), call({{"abcDEF123", R"({"city":"Oslo"})"}}),
                                    result("abcDEF123", "4"), msg("assistant", "It is 4 degrees.")};
  EXPECT_EQ(tmpl("mistral")->render(multi, tools(), false).text,
            std::string("<s>") + kMistralTools +
                "[INST] Weather in Oslo?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                "\"Oslo\"}, \"id\": \"abcDEF123\"}]</s>[TOOL_RESULTS] {\"content\": 4, \"call_id\": "
                "\"abcDEF123\"}[/TOOL_RESULTS] It is 4 degrees.</s>");
  EXPECT_EQ(tmpl("mistral")->render(std::vector<ChatMessage>{msg("user", "Hi there")}, nullptr, true).text,
            "<s>[INST] Hi there[/INST]");
}

TEST(ChatTemplate, Llama2SystemAndAlternation) {
  std::vector<ChatMessage> m = {msg("system", "You are terse."), msg("user", "Hi there"), msg("assistant", "Hello."),
                                msg("user", "Bye")};
  EXPECT_EQ(tmpl("llama2")->render(m, nullptr, true).text,
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello. </s><s>[INST] Bye [/INST]");
  EXPECT_THROW(tmpl("llama2")->render(std::vector<ChatMessage>{msg("user", "a"), msg("user", "b")}, nullptr, true),
               Error);
  // No native tool format: the generic one, the tool prompt inside <<SYS>>, tool results in a user turn.
  std::vector<ChatMessage> t = {msg("system", "You are terse."), msg("user", "Weather in Oslo?"),
                                call({{"id1", R"({"city":"Oslo"})"}}), result("id1", "4"), result("id2", "5")};
  EXPECT_EQ(tmpl("llama2")->render(t, tools(), true).text,
            std::string("<s>[INST] <<SYS>>\nYou are terse.\n\n") + kGenericTools +
                "\n<</SYS>>\n\nWeather in Oslo? [/INST] " + kGenericCall +
                " </s><s>[INST] <tool_response>\n4\n</tool_response>\n<tool_response>\n5\n</tool_response> [/INST]");
  EXPECT_EQ(tmpl("llama2")->render(std::vector<ChatMessage>{msg("user", "Hi")}, tools(), true).text,
            std::string("<s>[INST] <<SYS>>\n") + kGenericTools + "\n<</SYS>>\n\nHi [/INST]");
  EXPECT_THROW(tmpl("llama2")->render(std::vector<ChatMessage>{msg("user", "a"), result("x", "b")}, tools(), true),
               Error);
}

// render(messages[:k]) is a prefix of render(messages) at every turn boundary, and with the
// generation prompt whenever the next message is the assistant's.
TEST(ChatTemplate, EarlierTurnsNeverChange) {
  std::vector<ChatMessage> conv = {msg("system", "Be brief."),
                                   msg("user", "Weather in Oslo?"),
                                   call({{"abcDEF123", R"({"city":"Oslo"})"}}),
                                   result("abcDEF123", "4"),
                                   msg("assistant", "It is 4 degrees."),
                                   msg("user", "And Rome?"),
                                   call({{"ghiJKL456", R"({"city":"Rome"})"}}),
                                   result("ghiJKL456", "19"),
                                   msg("assistant", "19 degrees."),
                                   msg("user", "Thanks")};
  std::vector<ChatMessage> plain = {msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Hello."),
                                    msg("user", "Weather?"), msg("assistant", "Sunny."), msg("user", "Thanks")};
  for (const char* name : {"llama3", "chatml", "qwen2.5", "mistral", "llama2", "llama3.0", "llama2+plain"}) {
    const bool tool_capable = std::string(name) != "llama2+plain";
    const auto& c = tool_capable ? conv : plain;
    const Json t = tool_capable ? tools() : Json();
    if (!tool_capable) name = "llama2";
    auto tp = tmpl(name);
    const std::string full = tp->render(c, t, true).text;
    const size_t first = 1;
    for (size_t k = first; k < c.size(); ++k) {
      std::span<const ChatMessage> head(c.data(), k + 1);
      if (c[k].role == "tool" && k + 1 < c.size() && c[k + 1].role == "tool") continue;
      EXPECT_EQ(full.rfind(tp->render(head, t, false).text, 0), 0u) << name << " k=" << k;
      if (k + 1 < c.size() && c[k + 1].role == "assistant") {
        EXPECT_EQ(full.rfind(tp->render(head, t, true).text, 0), 0u) << name << " generation prompt k=" << k;
      }
    }
  }
}

TEST(ChatTemplate, ParsesToolCallsPerFamily) {
  auto hermes = tmpl("chatml")->parse_reply(
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
      true);
  ASSERT_EQ(hermes.tool_calls.size(), 2u);
  EXPECT_EQ(hermes.content, "Checking.");
  EXPECT_EQ(hermes.tool_calls[1].name, "get_weather");
  EXPECT_EQ(hermes.tool_calls[1].arguments, R"({"city":"Rome"})");

  auto l3 = tmpl("llama3")->parse_reply("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", true);
  ASSERT_EQ(l3.tool_calls.size(), 1u);
  EXPECT_EQ(l3.tool_calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(l3.content, "");

  auto mi = tmpl("mistral")->parse_reply(
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"id\": \"abcDEF123\"}]", true);
  ASSERT_EQ(mi.tool_calls.size(), 1u);
  EXPECT_EQ(mi.tool_calls[0].id, "abcDEF123");

  // Tools off, malformed JSON, unterminated blocks and missing names all stay plain content.
  const std::string call_text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(tmpl("chatml")->parse_reply(call_text, false).tool_calls.empty());
  for (const char* bad : {"<tool_call>\n{\"name\": \"x\", \"arguments\": {\n</tool_call>",
                          "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}", "<tool_call>{\"arguments\": {}}</tool_call>",
                          "<tool_call>{\"name\": \"x\", \"arguments\": 3}</tool_call>"}) {
    auto r = tmpl("chatml")->parse_reply(bad, true);
    EXPECT_TRUE(r.tool_calls.empty()) << bad;
    EXPECT_EQ(r.content, bad);
  }
  EXPECT_TRUE(tmpl("llama3")->parse_reply("{\"city\": \"Oslo\"}", true).tool_calls.empty());
  EXPECT_TRUE(tmpl("mistral")->parse_reply("[TOOL_CALLS] [{\"name\": ", true).tool_calls.empty());
  EXPECT_EQ(tmpl("llama2")->parse_reply("Once upon a time", true).content, "Once upon a time");
}

TEST(ChatTemplate, RenderedCallParsesBackToTheSameCall) {
  for (const char* name : {"chatml", "llama3", "mistral", "llama2", "llama3.0"}) {
    auto tp = tmpl(name);
    std::vector<ChatMessage> m = {msg("user", "Weather in Oslo?"), call({{"abcDEF123", R"({"city":"Oslo","days":[1,2]})"}})};
    const std::string prompt = tp->render(std::span(m.data(), 1), tools(), true).text;
    std::string full = tp->render(m, tools(), false).text;
    ASSERT_EQ(full.rfind(prompt, 0), 0u) << name;
    std::string reply = full.substr(prompt.size());
    for (const auto& stop : tp->stop_strings())
      if (size_t p = reply.rfind(stop); p != std::string::npos && p + stop.size() >= reply.size() - 1) reply.resize(p);
    auto parsed = tp->parse_reply(reply, true);
    ASSERT_EQ(parsed.tool_calls.size(), 1u) << name << ": " << reply;
    EXPECT_EQ(parsed.tool_calls[0].name, "get_weather");
    EXPECT_EQ(parsed.tool_calls[0].arguments, R"({"city":"Oslo","days":[1,2]})") << name;
  }
}

TEST(ChatTemplate, EveryTemplateHasAToolFormat) {
  EXPECT_EQ(tmpl("llama3")->tool_format(), ToolFormat::llama3_json);
  EXPECT_EQ(tmpl("chatml")->tool_format(), ToolFormat::hermes);
  EXPECT_EQ(tmpl("qwen2.5")->tool_format(), ToolFormat::hermes);
  EXPECT_EQ(tmpl("mistral")->tool_format(), ToolFormat::mistral);
  EXPECT_EQ(tmpl("llama2")->tool_format(), ToolFormat::generic);
  EXPECT_EQ(tmpl("llama3.0")->tool_format(), ToolFormat::generic);
  EXPECT_EQ(generic_tools_prompt(tools()), kGenericTools);
}

TEST(ChatTemplate, DetectionAndNames) {
  EXPECT_EQ(detect_template_family("{{ '<|im_start|>' + message.role }}")->family, TemplateFamily::chatml);
  EXPECT_EQ(detect_template_family("{{ '[AVAILABLE_TOOLS] [' }}")->family, TemplateFamily::mistral);
  EXPECT_EQ(detect_template_family("{{ bos_token + '[INST] ' }}")->family, TemplateFamily::mistral);
  EXPECT_EQ(detect_template_family("{% set content = '<<SYS>>\\n' %}[INST]")->family, TemplateFamily::llama2);
  auto l31 = detect_template_family("<|start_header_id|>system Environment: ipython");
  EXPECT_FALSE(l31->llama3_0);
  EXPECT_FALSE(detect_template_family("{{ messages }}").has_value());
  EXPECT_THROW(parse_template_name("vicuna"), Error);
  EXPECT_EQ(tmpl("mistral")->make_tool_call_id(42).size(), 9u);
  EXPECT_EQ(tmpl("chatml")->make_tool_call_id(42).rfind("call_", 0), 0u);
  EXPECT_NE(tmpl("chatml")->make_tool_call_id(1), tmpl("chatml")->make_tool_call_id(2));
}

TEST(ChatTemplate, ModelDirectories) {
  auto d = test::temp_dir("chat_template_dirs");
  EXPECT_EQ(choose_template(d).family, TemplateFamily::chatml);  // no tokenizer_config.json
  test::write_file(d / "tokenizer_config.json",
                   R"({"chat_template":[{"name":"default","template":"[INST]"},{"name":"tool_use","template":"<|im_start|>"}]})");
  EXPECT_EQ(choose_template(d).family, TemplateFamily::chatml);
  EXPECT_EQ(choose_template(d, "llama2").family, TemplateFamily::llama2);
  test::write_file(d / "tokenizer_config.json", R"({"chat_template":"{{ messages }}"})");
  EXPECT_THROW(choose_template(d), Error);
  test::write_file(d / "tokenizer_config.json", "{not json");
  EXPECT_THROW(choose_template(d), Error);
}

TEST(PythonJson, MatchesJsonDumps) {
  Json j = Json::parse(R"({"b":[1,2.5,{}],"a":{"x":"é\n\"q\""},"c":[],"d":null,"e":true})");
  EXPECT_EQ(python_json_dumps(j), R"({"b": [1, 2.5, {}], "a": {"x": "é\n\"q\""}, "c": [], "d": null, "e": true})");
  EXPECT_EQ(python_json_dumps(j, 2),
            "{\n  \"b\": [\n    1,\n    2.5,\n    {}\n  ],\n  \"a\": {\n    \"x\": \"é\\n\\\"q\\\"\"\n  },\n  \"c\": "
            "[],\n  \"d\": null,\n  \"e\": true\n}");
}

}  // namespace chat_template_test
}  // namespace exl
