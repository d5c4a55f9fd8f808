// POST /v1/responses: the request mapped onto a chat request (input items, instructions, tools,
// text.format, refused fields), the response object and its streamed events from generation
// events, and the route on stories260K-hf (the generator is never started).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/openai/api_error.h"
#include "runtime/openai/completion_writer.h"
#include "runtime/openai/responses_request.h"
#include "runtime/server/router.h"
#include "test_support.h"

namespace exl {
namespace responses_test {

using json = nlohmann::json;

ApiError responses_error(const json& body) {
  try {
    parse_responses_request(body.dump(), 512);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

TEST(ResponsesRequest, InputItemsBecomeChatMessages) {
  const json body = {
      {"model", "m"},
      {"instructions", "Be brief."},
      {"input",
       {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather "}}, {{"type", "input_text"}, {"text", "in Oslo?"}}}}},
        {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "w"}, {"arguments", R"({"c":"Oslo"})"}},
        {{"type", "function_call"}, {"call_id", "call_2"}, {"name", "w"}, {"arguments", R"({"c":"Rome"})"}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "4"}},
        {{"type", "message"}, {"role", "developer"}, {"content", "Answer in words."}}}},
      {"tools", {{{"type", "function"}, {"name", "w"}, {"description", "weather"}, {"strict", true},
                  {"parameters", {{"type", "object"}, {"properties", {{"c", {{"type", "string"}}}}}}}}}},
      {"tool_choice", {{"type", "function"}, {"name", "w"}}},
      {"parallel_tool_calls", false},
      {"max_output_tokens", 9},
      {"temperature", 0.5},
      {"top_p", 0.75},
      {"stream", true}};
  const ResponsesRequest r = parse_responses_request(body.dump(), 512);
  const auto& m = r.chat.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[0].content, "Be brief.");
  EXPECT_EQ(m[1].role, "user");
  EXPECT_EQ(m[1].content, "Weather in Oslo?");
  EXPECT_EQ(m[2].role, "assistant");
  ASSERT_EQ(m[2].tool_calls.size(), 2u) << "consecutive calls share one assistant message";
  EXPECT_EQ(m[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(m[2].tool_calls[1].arguments, R"({"c":"Rome"})");
  EXPECT_EQ(m[3].role, "tool");
  EXPECT_EQ(m[3].tool_call_id, "call_1");
  EXPECT_EQ(m[3].content, "4");
  EXPECT_EQ(m[4].role, "system");
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0]["function"]["name"], "w");
  EXPECT_EQ(r.chat.tools[0]["function"]["parameters"]["type"], "object");
  EXPECT_EQ(r.chat.tool_choice, ToolChoice::named);
  EXPECT_EQ(r.chat.tool_choice_name, "w");
  EXPECT_FALSE(r.chat.parallel_tool_calls);
  EXPECT_EQ(r.chat.gen.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.chat.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.chat.gen.sampling.top_p, 0.75f);
  EXPECT_TRUE(r.chat.gen.stream);
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["max_output_tokens"], 9);
  EXPECT_EQ(r.echo["tools"][0]["name"], "w");
  EXPECT_EQ(r.echo["text"]["format"]["type"], "text");

  const ResponsesRequest s = parse_responses_request(R"({"input":"Hi"})", 512);
  ASSERT_EQ(s.chat.messages.size(), 1u);
  EXPECT_EQ(s.chat.messages[0].role, "user");
  EXPECT_EQ(s.chat.messages[0].content, "Hi");
  EXPECT_EQ(s.chat.tool_choice, ToolChoice::none);
  EXPECT_FALSE(s.chat.gen.stream);
  EXPECT_TRUE(s.echo["instructions"].is_null());
}

TEST(ResponsesRequest, TextFormatsBecomeResponseFormats) {
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}};
  const ResponsesRequest r = parse_responses_request(
      json{{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "ans"}, {"schema", schema}, {"strict", true}}}}}}
          .dump(),
      512);
  EXPECT_EQ(r.chat.response_format, "json_schema");
  EXPECT_EQ(json::parse(r.chat.json_schema.dump()), schema);
  EXPECT_EQ(r.echo["text"]["format"]["type"], "json_schema");
  EXPECT_EQ(r.echo["text"]["format"]["name"], "ans");
  const ResponsesRequest o =
      parse_responses_request(json{{"input", "x"}, {"text", {{"format", {{"type", "json_object"}}}}}}.dump(), 512);
  EXPECT_EQ(o.chat.response_format, "json_object");
  const ResponsesRequest t = parse_responses_request(json{{"input", "x"}, {"text", {{"format", {{"type", "text"}}}}}}.dump(), 512);
  EXPECT_EQ(t.chat.response_format, "text");
}

TEST(ResponsesRequest, RefusedFieldsAreNamed) {
  struct Case {
    json body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"input", "x"}, {"previous_response_id", "resp_1"}}, "previous_response_id"},
      {{{"input", "x"}, {"store", true}}, "store"},
      {{{"input", "x"}, {"background", true}}, "background"},
      {{{"input", "x"}, {"conversation", "conv_1"}}, "conversation"},
      {json::object(), "input"},
      {{{"input", json::array()}}, "input"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}}, "input[0].content[0]"},
      {{{"input", {{{"type", "reasoning"}, {"summary", json::array()}}}}}, "input[0].type"},
      {{{"input", {{{"type", "function_call_output"}, {"output", "4"}}}}}, "input[0].call_id"},
      {{{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "tools[0].type"},
      {{{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}, "text.format.type"},
      {{{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens"},
      {{{"input", "x"}, {"temperature", 3}}, "temperature"},
  };
  for (const auto& c : cases) {
    const ApiError e = responses_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
  }
  EXPECT_NE(std::string(responses_error({{"input", "x"}, {"previous_response_id", "r"}}).what()).find("keeps no responses"),
            std::string::npos);
  EXPECT_NO_THROW(parse_responses_request(R"({"input":"x","store":false})", 512));
}

// --- the response object and its events ------------------------------------------------------

GenerationEvent token(std::string text) {
  GenerationEvent e;
  e.text = std::move(text);
  return e;
}

GenerationEvent done(FinishReason r, int64_t gen = 3) {
  GenerationEvent e;
  e.type = GenerationEvent::Type::done;
  e.reason = r;
  e.stats.n_prompt_tokens = 10;
  e.stats.n_cached_tokens = 4;
  e.stats.n_generated = gen;
  if (r == FinishReason::error) e.error = "engine: boom";
  return e;
}

CompletionMeta responses_meta(bool stream, bool tools) {
  CompletionMeta m;
  m.chat = true;
  m.responses = true;
  m.stream = stream;
  m.tools_enabled = tools;
  m.id = "resp_abc";
  m.created = 77;
  m.model = "m";
  m.response_echo = {{"instructions", "Be brief."}, {"max_output_tokens", nullptr}, {"tools", json::array()}};
  return m;
}

struct ResponseEvent {
  std::string name;
  json data;
};

std::vector<ResponseEvent> response_events(const std::string& s) {
  std::vector<ResponseEvent> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = s.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string ev = s.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    out.push_back({ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7))});
  }
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].data["type"], out[i].name);
    EXPECT_EQ(out[i].data["sequence_number"], i);
  }
  return out;
}

std::vector<std::string> names(const std::vector<ResponseEvent>& ev) {
  std::vector<std::string> out;
  for (const auto& e : ev) out.push_back(e.name);
  return out;
}

TEST(ResponsesWriter, TextResponseObject) {
  CompletionWriter w(responses_meta(false, false), nullptr);
  w.on_event(token("Once"));
  w.on_event(token(" upon"));
  w.on_event(done(FinishReason::stop_token));
  const HttpResponse r = w.response();
  ASSERT_EQ(r.status, 200);
  const json j = json::parse(r.body);
  EXPECT_EQ(j["id"], "resp_abc");
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["created_at"], 77);
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["incomplete_details"].is_null());
  EXPECT_EQ(j["instructions"], "Be brief.");
  ASSERT_EQ(j["output"].size(), 1u);
  const json& item = j["output"][0];
  EXPECT_EQ(item["type"], "message");
  EXPECT_EQ(item["role"], "assistant");
  EXPECT_EQ(item["status"], "completed");
  EXPECT_EQ(item["content"][0]["type"], "output_text");
  EXPECT_EQ(item["content"][0]["text"], "Once upon");
  EXPECT_EQ(j["usage"]["input_tokens"], 10);
  EXPECT_EQ(j["usage"]["output_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  EXPECT_EQ(j["usage"]["input_tokens_details"]["cached_tokens"], 4);

  CompletionWriter cut(responses_meta(false, false), nullptr);
  cut.on_event(token("Once"));
  cut.on_event(done(FinishReason::max_tokens));
  const json k = json::parse(cut.response().body);
  EXPECT_EQ(k["status"], "incomplete");
  EXPECT_EQ(k["incomplete_details"]["reason"], "max_output_tokens");

  CompletionWriter failed(responses_meta(false, false), nullptr);
  failed.on_event(done(FinishReason::error));
  EXPECT_EQ(failed.response().status, 500);
}

TEST(ResponsesWriter, FunctionCallItems) {
  CompletionWriter w(responses_meta(false, true), make_chat_template(parse_template_name("chatml"), {}));
  w.on_event(token("<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"Oslo\"}}\n</tool_call>"));
  w.on_event(done(FinishReason::stop_string));
  const json j = json::parse(w.response().body);
  ASSERT_EQ(j["output"].size(), 1u) << j;
  const json& call = j["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "w");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json({{"c", "Oslo"}}));
  EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(call["status"], "completed");
  EXPECT_EQ(j["status"], "completed");
}

TEST(ResponsesWriter, StreamedTextEvents) {
  CompletionWriter w(responses_meta(true, false), nullptr);
  std::string s = w.begin();
  s += w.on_event(token("Once"));
  s += w.on_event(token(""));
  s += w.on_event(token(" upon"));
  s += w.on_event(done(FinishReason::stop_token));
  const auto ev = response_events(s);
  EXPECT_EQ(names(ev), (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                                 "response.content_part.added", "response.output_text.delta",
                                                 "response.output_text.delta", "response.output_text.done",
                                                 "response.content_part.done", "response.output_item.done",
                                                 "response.completed"}));
  EXPECT_EQ(ev[0].data["response"]["status"], "in_progress");
  EXPECT_TRUE(ev[0].data["response"]["output"].empty());
  EXPECT_EQ(ev[4].data["delta"], "Once");
  EXPECT_EQ(ev[4].data["item_id"], ev[2].data["item"]["id"]);
  EXPECT_EQ(ev[6].data["text"], "Once upon");
  EXPECT_EQ(ev[8].data["item"]["content"][0]["text"], "Once upon");
  EXPECT_EQ(ev[9].data["response"]["output"][0]["content"][0]["text"], "Once upon");
  EXPECT_EQ(ev[9].data["response"]["usage"]["output_tokens"], 3);
  EXPECT_EQ(s.find("[DONE]"), std::string::npos);
}

TEST(ResponsesWriter, StreamedCallsAreHeldBackThenSentAsItems) {
  CompletionWriter w(responses_meta(true, true), make_chat_template(parse_template_name("chatml"), {}));
  std::string s = w.begin();
  EXPECT_EQ(w.on_event(token("Checking.\n<tool_call>\n{\"name\": \"w\", ")), "");
  s += w.on_event(token("\"arguments\": {\"c\": \"Oslo\"}}\n</tool_call>"));
  s += w.on_event(done(FinishReason::stop_string));
  const auto ev = response_events(s);
  EXPECT_EQ(names(ev), (std::vector<std::string>{
                           "response.created", "response.in_progress", "response.output_item.added",
                           "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                           "response.content_part.done", "response.output_item.done", "response.output_item.added",
                           "response.function_call_arguments.delta", "response.function_call_arguments.done",
                           "response.output_item.done", "response.completed"}));
  EXPECT_EQ(ev[4].data["delta"], "Checking.");
  EXPECT_EQ(ev[8].data["output_index"], 1);
  EXPECT_EQ(ev[8].data["item"]["type"], "function_call");
  EXPECT_EQ(ev[8].data["item"]["arguments"], "");
  EXPECT_EQ(ev[9].data["delta"], ev[10].data["arguments"]);
  EXPECT_EQ(ev[11].data["item"]["name"], "w");
  EXPECT_EQ(ev[12].data["response"]["output"].size(), 2u);

  CompletionWriter cut(responses_meta(true, false), nullptr);
  std::string c = cut.begin();
  c += cut.on_event(token("x"));
  c += cut.on_event(done(FinishReason::max_tokens));
  EXPECT_EQ(response_events(c).back().name, "response.incomplete");
  CompletionWriter failed(responses_meta(true, false), nullptr);
  std::string f = failed.begin();
  f += failed.on_event(done(FinishReason::error));
  const auto fe = response_events(f);
  EXPECT_EQ(fe.back().name, "error");
  EXPECT_EQ(fe.back().data["message"], "engine: boom");
}

// The route: a Responses request renders the same prompt as the equivalent chat request.
TEST(ResponsesRoute, RendersTheChatPromptAndCarriesTheConstraint) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  ServerOptions o;
  o.model_dir = (test::shared_dir() / "models/stories260K-hf").string();
  o.cpu_threads = 1;
  auto state = std::make_shared<ServerState>(o);
  auto req = [](const std::string& path, const json& body) {
    HttpRequest r;
    r.method = "POST";
    r.target = path;
    r.headers["host"] = "127.0.0.1";
    r.body = body.dump();
    return r;
  };
  RouteResult resp = route(req("/v1/responses", {{"instructions", "Be kind."}, {"input", "Hi"}, {"max_output_tokens", 5},
                                                 {"text", {{"format", {{"type", "json_object"}}}}}}),
                           *state);
  ASSERT_TRUE(resp.plan.has_value()) << resp.response.body;
  RouteResult chat = route(req("/v1/chat/completions", {{"messages", {{{"role", "system"}, {"content", "Be kind."}},
                                                                      {{"role", "user"}, {"content", "Hi"}}}}}),
                           *state);
  ASSERT_TRUE(chat.plan.has_value()) << chat.response.body;
  EXPECT_EQ(resp.plan->jobs[0].prompt, chat.plan->jobs[0].prompt);
  EXPECT_EQ(resp.plan->jobs[0].max_new_tokens, 5);
  EXPECT_NE(resp.plan->jobs[0].mask, nullptr);
  EXPECT_TRUE(resp.plan->meta.responses);
  EXPECT_EQ(resp.plan->meta.id.rfind("resp_", 0), 0u);
  EXPECT_EQ(resp.endpoint, "/v1/responses");
  RouteResult bad = route(req("/v1/responses", {{"input", "Hi"}, {"previous_response_id", "resp_1"}}), *state);
  EXPECT_EQ(bad.response.status, 400);
  EXPECT_EQ(json::parse(bad.response.body)["error"]["param"], "previous_response_id");
}

}  // namespace responses_test
}  // namespace exl
