#include "runtime/openai/batch_request.h"

#include <gtest/gtest.h>

namespace exl {
namespace batch_request_test {

using ojson = nlohmann::ordered_json;

BatchItem parse(const std::string& line, std::optional<ojson> schema = std::nullopt) {
  return parse_batch_line(line, 7, BatchForm::simple, schema, 1000);
}

TEST(BatchRequest, OpenAIFormTakesTheChatBody) {
  const auto it = parse(R"({"custom_id":"r1","method":"POST","url":"/v1/chat/completions","body":{"model":"m",
    "messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"}],"max_tokens":12,"temperature":0.5,
    "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}})");
  ASSERT_FALSE(it.error) << *it.error;
  EXPECT_EQ(it.form, BatchForm::openai);
  EXPECT_EQ(it.key, "\"r1\"");
  ASSERT_EQ(it.spec.messages.size(), 2u);
  EXPECT_EQ(it.spec.messages[1].content, "Hi");
  EXPECT_EQ(it.spec.max_tokens, 12);
  EXPECT_FLOAT_EQ(it.spec.sampling.temperature, 0.5f);
  EXPECT_EQ(it.spec.schema, ojson::parse(R"({"type":"object"})"));
}

TEST(BatchRequest, SimpleFormPromptSchemaAndDefaults) {
  const auto it = parse(R"({"id":5,"prompt":"Doc","system":"Sys","schema":{"type":"string"},"max_tokens":3})");
  ASSERT_FALSE(it.error) << *it.error;
  EXPECT_EQ(it.form, BatchForm::simple);
  EXPECT_EQ(it.key, "5");
  ASSERT_EQ(it.spec.messages.size(), 2u);
  EXPECT_EQ(it.spec.messages[0].role, "system");
  EXPECT_EQ(it.spec.messages[1].content, "Doc");
  EXPECT_FLOAT_EQ(it.spec.sampling.temperature, 0.0f);
  EXPECT_EQ(it.spec.schema, ojson::parse(R"({"type":"string"})"));
  const auto d = parse(R"({"id":"a","messages":[{"role":"user","content":"x"}]})", ojson::parse(R"({"type":"object"})"));
  ASSERT_FALSE(d.error);
  EXPECT_EQ(d.spec.schema, ojson::parse(R"({"type":"object"})"));
}

TEST(BatchRequest, BadLinesBecomeErrorItemsWithLineKeys) {
  auto bad = parse("{not json");
  ASSERT_TRUE(bad.error);
  EXPECT_EQ(bad.key, "#7");
  EXPECT_EQ(bad.error_code, "invalid_json_line");
  EXPECT_EQ(ojson::parse(batch_error_line(bad))["line"], 7);
  EXPECT_EQ(batch_result_key(batch_error_line(bad)), "#7");

  auto noid = parse(R"({"prompt":"x"})");
  EXPECT_EQ(noid.error_code, "missing_id");
  EXPECT_EQ(noid.key, "#7");
  auto nocid = parse(R"({"url":"/v1/chat/completions","body":{}})");
  EXPECT_EQ(nocid.form, BatchForm::openai);
  EXPECT_EQ(nocid.error_code, "missing_custom_id");
  const auto j = ojson::parse(batch_error_line(nocid));
  EXPECT_TRUE(j["response"].is_null());
  EXPECT_EQ(j["error"]["code"], "missing_custom_id");
  EXPECT_EQ(batch_result_key(batch_error_line(nocid)), "#7");

  auto url = parse(R"({"custom_id":"c","method":"POST","url":"/v1/embeddings","body":{}})");
  EXPECT_EQ(url.error_code, "invalid_url");
  EXPECT_EQ(url.key, "\"c\"");
  const auto u = ojson::parse(batch_error_line(url));
  EXPECT_EQ(u["custom_id"], "c");
  EXPECT_EQ(u["response"]["status_code"], 400);
  EXPECT_EQ(u["response"]["body"]["error"]["code"], "invalid_url");
  EXPECT_FALSE(u.contains("line"));
  EXPECT_EQ(batch_result_key(batch_error_line(url)), "\"c\"");

  auto both = parse(R"({"id":"x","prompt":"a","messages":[]})");
  EXPECT_EQ(both.error_code, "invalid_request");
  auto badmsg = parse(R"({"custom_id":"c","url":"/v1/chat/completions","body":{"messages":[{"role":"wizard","content":"x"}]}})");
  ASSERT_TRUE(badmsg.error);
  EXPECT_EQ(badmsg.error_status, 400);
  auto schema = parse(R"({"id":"x","prompt":"a","schema":[1]})");
  EXPECT_EQ(schema.error_code, "invalid_schema");
  auto lp = parse(R"({"custom_id":"c","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"x"}],"logprobs":true}})");
  EXPECT_EQ(lp.error_code, "unsupported_logprobs");
}

TEST(BatchRequest, DuplicatesGetTheirOwnLineKey) {
  auto it = parse(R"({"id":"a","prompt":"p"})");
  mark_duplicate(it);
  EXPECT_EQ(it.key, "#7");
  EXPECT_EQ(it.error_code, "duplicate_id");
  const auto j = ojson::parse(batch_error_line(it));
  EXPECT_EQ(j["id"], "a");
  EXPECT_EQ(j["line"], 7);
}

TEST(BatchRequest, ResultLines) {
  auto it = parse(R"({"id":"s","prompt":"p","schema":{"type":"object"}})");
  JobOutcome o;
  o.ok = true;
  o.text = R"({"a":1})";
  o.json = ojson::parse(o.text);
  o.reason = FinishReason::stop_token;
  o.stats.n_prompt_tokens = 10;
  o.stats.n_generated = 4;
  auto j = ojson::parse(batch_result_line(it, o, "m", nullptr));
  EXPECT_EQ(j, ojson::parse(R"({"id":"s","output":{"a":1},"finish_reason":"stop",
                               "usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14}})"));

  auto oa = parse(R"({"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"x"}]}})");
  auto tmpl = std::shared_ptr<const ChatTemplate>(make_chat_template({}, {}));
  j = ojson::parse(batch_result_line(oa, o, "m", tmpl));
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("batch_req_"));
  EXPECT_EQ(j["custom_id"], "c");
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_EQ(j["response"]["status_code"], 200);
  const auto& body = j["response"]["body"];
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["choices"][0]["message"]["content"], R"({"a":1})");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 14);

  JobOutcome failed;
  failed.error = "engine: boom";
  failed.reason = FinishReason::error;
  j = ojson::parse(batch_result_line(oa, failed, "m", tmpl));
  EXPECT_EQ(j["response"]["status_code"], 500);
  EXPECT_EQ(j["response"]["body"]["error"]["message"], "engine: boom");
  j = ojson::parse(batch_result_line(it, failed, "m", tmpl));
  EXPECT_EQ(j["error"]["message"], "engine: boom");
  EXPECT_EQ(batch_result_key(batch_result_line(it, failed, "m", tmpl)), "\"s\"");
}

}  // namespace batch_request_test
}  // namespace exl
