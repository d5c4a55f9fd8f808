// The HTTP API without sockets: routing, auth, Host allowlist, request validation, admission and
// the OpenAI wire format produced from generation events. Runs on stories260K-hf (CPU); the
// generator is never started, so nothing here generates.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/openai/completion_writer.h"
#include "runtime/server/router.h"
#include "test_support.h"

namespace exl {
namespace router_test {

using json = nlohmann::json;
constexpr const char* kModel = "models/stories260K-hf";

std::shared_ptr<ServerState> make_state(ServerOptions o = {}) {
  o.model_dir = (test::shared_dir() / kModel).string();
  if (o.api_key.empty()) o.api_key = "sekret";
  return std::make_shared<ServerState>(o);
}

HttpRequest req(std::string method, std::string target, std::string body = {}, std::string key = "sekret") {
  HttpRequest r;
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.headers["host"] = "127.0.0.1:8421";
  if (!key.empty()) r.headers["authorization"] = "Bearer " + key;
  return r;
}

// The error object's shape, and its type/code.
void expect_error(const RouteResult& r, int status, const std::string& type, const std::string& param = {},
                  const std::string& code = {}) {
  ASSERT_FALSE(r.plan.has_value());
  EXPECT_EQ(r.response.status, status) << r.response.body;
  json j = json::parse(r.response.body);
  ASSERT_TRUE(j.contains("error")) << r.response.body;
  const auto& e = j["error"];
  for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(e.contains(k)) << k;
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_FALSE(e["message"].get<std::string>().empty());
  EXPECT_EQ(e["type"], type) << r.response.body;
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r.response.body;
  }
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << r.response.body;
  }
}

std::string chat_body(json extra = json::object()) {
  json j = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  j.update(extra);
  return j.dump();
}

class Router : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::shared_dir() / kModel / "model.safetensors"))
      GTEST_SKIP() << "shared asset missing: " << (test::shared_dir() / kModel);
    if (!state_) state_ = make_state();
  }
  static std::shared_ptr<ServerState> state_;
};
std::shared_ptr<ServerState> Router::state_;

TEST_F(Router, HealthIsPublicEverythingElseNeedsTheKey) {
  EXPECT_EQ(route(req("GET", "/health", {}, ""), *state_).response.status, 200);
  expect_error(route(req("GET", "/v1/models", {}, ""), *state_), 401, "invalid_request_error", {}, "missing_api_key");
  expect_error(route(req("GET", "/v1/models", {}, "wrong"), *state_), 401, "invalid_request_error", {}, "invalid_api_key");
  expect_error(route(req("GET", "/v1/models", {}, "sekre"), *state_), 401, "invalid_request_error", {}, "invalid_api_key");
  expect_error(route(req("GET", "/metrics", {}, ""), *state_), 401, "invalid_request_error");
  expect_error(route(req("POST", "/v1/chat/completions", chat_body(), ""), *state_), 401, "invalid_request_error");
  auto ok = route(req("GET", "/v1/models"), *state_);
  ASSERT_EQ(ok.response.status, 200);
  json m = json::parse(ok.response.body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "stories260K-hf");
  EXPECT_EQ(m["data"][0]["object"], "model");
  HttpRequest x = req("GET", "/v1/models", {}, "");
  x.headers["x-api-key"] = "sekret";
  EXPECT_EQ(route(x, *state_).response.status, 200);
  x.headers["authorization"] = "bearer sekret";  // scheme is case-insensitive
  x.headers.erase("x-api-key");
  EXPECT_EQ(route(x, *state_).response.status, 200);
}

TEST_F(Router, HostAllowlist) {
  for (const char* host : {"evil.com", "evil.com:8421", "127.0.0.1.evil.com", "", "[::1"}) {
    HttpRequest r = req("GET", "/v1/models");
    r.headers["host"] = host;
    expect_error(route(r, *state_), 403, "invalid_request_error", {}, "host_not_allowed");
  }
  for (const char* host : {"localhost", "LOCALHOST:8421", "127.0.0.1", "[::1]:8421", "app.localhost:1"}) {
    HttpRequest r = req("GET", "/v1/models");
    r.headers["host"] = host;
    EXPECT_EQ(route(r, *state_).response.status, 200) << host;
  }
  ServerOptions o;
  o.host = "0.0.0.0";
  EXPECT_TRUE(host_allowed("anything.example:80", o));
  o.allowed_hosts = {"api.example"};
  EXPECT_TRUE(host_allowed("api.example:443", o));
  EXPECT_FALSE(host_allowed("other.example", o));
  ServerOptions lo;
  EXPECT_FALSE(host_allowed("192.168.1.5", lo));
  lo.allowed_hosts = {"*"};
  EXPECT_TRUE(host_allowed("192.168.1.5", lo));
}

// Issue 28: a web page could fire "simple" text/plain POSTs (no CORS preflight) at a keyless
// server; every route now refuses a foreign Origin, and a foreign Host, with a 403 error object.
TEST_F(Router, OriginAndHostAllowlistOnEveryRoute) {
  ServerOptions o;
  o.model_dir = (test::shared_dir() / kModel).string();  // no API key
  auto st = std::make_shared<ServerState>(o);
  st->set_bound_port(8421);
  auto with = [](HttpRequest r, const char* origin) {
    r.headers.erase("authorization");
    r.headers["origin"] = origin;
    r.headers["content-type"] = "text/plain";
    return r;
  };
  const HttpRequest post = req("POST", "/v1/chat/completions", chat_body(), "");
  for (const char* bad : {"https://evil.example", "http://localhost:8422", "https://localhost:8421", "null",
                          "http://127.0.0.1:8421.evil.example", ""}) {
    expect_error(route(with(post, bad), *st), 403, "invalid_request_error", {}, "origin_not_allowed");
    expect_error(route(with(req("GET", "/health", {}, ""), bad), *st), 403, "invalid_request_error", {},
                 "origin_not_allowed");
    expect_error(route(with(req("GET", "/metrics", {}, ""), bad), *st), 403, "invalid_request_error", {},
                 "origin_not_allowed");
  }
  EXPECT_EQ(st->running_generations(), 0);
  for (const char* good : {"http://127.0.0.1:8421", "http://localhost:8421", "http://[::1]:8421", "HTTP://LocalHost:8421"})
    EXPECT_TRUE(route(with(post, good), *st).plan.has_value()) << good;
  EXPECT_TRUE(route(post, *st).plan.has_value()) << "no Origin header (curl, SDKs)";
  HttpRequest rebound = req("GET", "/health", {}, "");
  rebound.headers["host"] = "attacker.example:8421";
  expect_error(route(rebound, *st), 403, "invalid_request_error", {}, "host_not_allowed");

  ServerOptions listed;
  listed.allowed_origins = {"https://app.example:8443/"};
  EXPECT_TRUE(origin_allowed("https://app.example:8443", listed, 8421));
  EXPECT_TRUE(origin_allowed("HTTPS://APP.EXAMPLE:8443", listed, 8421));
  EXPECT_FALSE(origin_allowed("https://app.example", listed, 8421));
  EXPECT_FALSE(origin_allowed("http://localhost:8421", listed, 0));  // port unknown: nothing by default
  listed.allowed_origins = {"*"};
  EXPECT_TRUE(origin_allowed("https://anything.example", listed, 8421));
}

TEST_F(Router, MetricsNeedTheKeyUnlessPublic) {
  expect_error(route(req("GET", "/metrics", {}, ""), *state_), 401, "invalid_request_error", {}, "missing_api_key");
  ServerOptions o;
  o.metrics_public = true;
  auto st = make_state(o);
  EXPECT_EQ(route(req("GET", "/metrics", {}, ""), *st).response.status, 200);
  expect_error(route(req("GET", "/v1/models", {}, ""), *st), 401, "invalid_request_error", {}, "missing_api_key");
}

TEST_F(Router, RetrieveModelByIdAnd404ForOthers) {
  for (const char* target : {"/v1/models/stories260K-hf", "/v1/models/stories260K%2Dhf", "/v1/models/stories260K-hf?x=1"}) {
    auto ok = route(req("GET", target), *state_);
    ASSERT_EQ(ok.response.status, 200) << target << " " << ok.response.body;
    json m = json::parse(ok.response.body);
    EXPECT_EQ(m["id"], "stories260K-hf");
    EXPECT_EQ(m["object"], "model");
    EXPECT_EQ(m["owned_by"], "exlagent");
    EXPECT_TRUE(m["created"].is_number_integer());
    EXPECT_EQ(ok.endpoint, "/v1/models/{id}");
  }
  for (const auto& [target, named] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/models/gpt-4o", "'gpt-4o'"}, {"/v1/models/org%2Fmodel", "'org/model'"},
           {"/v1/models/stories260K-HF", "'stories260K-HF'"}, {"/v1/models/bad%zz", "'bad%zz'"},
           {"/v1/models/bad%2", "'bad%2'"}, {"/v1/models/%+1x", "'%+1x'"}}) {
    auto r = route(req("GET", target), *state_);
    expect_error(r, 404, "invalid_request_error", {}, "model_not_found");
    const json e = json::parse(r.response.body)["error"];
    EXPECT_NE(e["message"].get<std::string>().find(named), std::string::npos) << e["message"];
    EXPECT_TRUE(e["param"].is_null());
  }
  expect_error(route(req("POST", "/v1/models/stories260K-hf"), *state_), 405, "invalid_request_error");
  expect_error(route(req("GET", "/v1/models/stories260K-hf", {}, ""), *state_), 401, "invalid_request_error", {},
               "missing_api_key");
}

TEST(RouterKeys, KeysEqualComparesWholeKeys) {
  EXPECT_TRUE(keys_equal("sekret", "sekret"));
  for (const char* given : {"", "s", "sekre", "sekreT", "sekret ", "sekretsekret", "tekret"})
    EXPECT_FALSE(keys_equal(given, "sekret")) << given;
  EXPECT_FALSE(keys_equal(std::string_view("sekret\0", 7), "sekret"));
  EXPECT_FALSE(keys_equal("", ""));
}

TEST_F(Router, UnknownRoutesMethodsAndMalformedBodies) {
  expect_error(route(req("GET", "/v1/nothing"), *state_), 404, "invalid_request_error", {}, "unknown_url");
  expect_error(route(req("GET", "/v1/chat/completions"), *state_), 405, "invalid_request_error");
  expect_error(route(req("POST", "/v1/models"), *state_), 405, "invalid_request_error");
  for (const char* bad : {"{bad", "", "[1,2]", "\"str\"", "{\"messages\": [}"})
    expect_error(route(req("POST", "/v1/chat/completions", bad), *state_), 400, "invalid_request_error", {},
                 "invalid_json");
  expect_error(route(req("POST", "/v1/chat/completions", "{\"model\":\"\xff\"}"), *state_), 400,
               "invalid_request_error");
  // Deep nesting is refused before anything copies or dumps it (those recurse).
  const int d = 200000;
  const std::string deep = R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"a":)" +
                           std::string(d, '[') + std::string(d, ']') + "}}}]}";
  expect_error(route(req("POST", "/v1/chat/completions", deep), *state_), 400, "invalid_request_error", {}, "invalid_json");
}

TEST_F(Router, ValidationNamesTheField) {
  struct Case {
    json body;
    const char* param;
  };
  const std::vector<Case> cases = {
      {{{"model", "m"}}, "messages"},
      {{{"messages", json::array()}}, "messages"},
      {json::parse(R"({"messages":[{"content":"x"}]})"), "messages[0].role"},
      {json::parse(R"({"messages":[{"role":"wizard","content":"x"}]})"), "messages[0].role"},
      {json::parse(R"({"messages":[{"role":"tool","content":"x"}]})"), "messages[0].tool_call_id"},
      {json::parse(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})"), "messages[0].content"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"temperature":3})"), "temperature"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})"), "temperature"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"top_p":1.5})"), "top_p"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})"), "max_tokens"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-5})"), "max_completion_tokens"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})"), "stop"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"stop":[""]})"), "stop"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"512":1}})"), "logit_bias"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"-1":1}})"), "logit_bias"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":101}})"), "logit_bias"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"seed":1.5})"), "seed"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})"), "stream_options"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"bad name"}}]})"), "tools[0].function.name"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"})"), "tool_choice"},
      {json::parse(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100000})"), "max_tokens"},
  };
  for (const auto& c : cases)
    expect_error(route(req("POST", "/v1/chat/completions", c.body.dump()), *state_), 400, "invalid_request_error", c.param);
  std::string long_text(3000, 'a');
  expect_error(route(req("POST", "/v1/chat/completions",
                         chat_body({{"messages", json::array({{{"role", "user"}, {"content", long_text}}})}})),
                     *state_),
               400, "invalid_request_error", "messages", "context_length_exceeded");
  expect_error(route(req("POST", "/v1/completions", R"({"prompt":5})"), *state_), 400, "invalid_request_error", "prompt");
  for (int n : {0, 17, -1})
    expect_error(route(req("POST", "/v1/chat/completions", chat_body({{"n", n}})), *state_), 400,
                 "invalid_request_error", "n");
  expect_error(route(req("POST", "/v1/completions", R"({"prompt":"x","n":17})"), *state_), 400, "invalid_request_error",
               "n");
  expect_error(route(req("POST", "/v1/completions", R"({"prompt":"x","n":2.5})"), *state_), 400, "invalid_request_error",
               "n");
  for (const json& bad : {json("draft"), json("medusa"), json(1)})
    expect_error(route(req("POST", "/v1/chat/completions", chat_body({{"speculate", bad}})), *state_), 400,
                 "invalid_request_error", "speculate");
}

TEST_F(Router, SpeculateReachesTheJobOrIsLeftToTheServer) {
  auto plain = route(req("POST", "/v1/completions", R"({"prompt":"x"})"), *state_);
  ASSERT_TRUE(plain.plan.has_value()) << plain.response.body;
  EXPECT_FALSE(plain.plan->jobs[0].speculate.has_value()) << "the server's --speculate decides";
  auto ngram = route(req("POST", "/v1/chat/completions", chat_body({{"speculate", "ngram"}, {"n", 2}})), *state_);
  ASSERT_TRUE(ngram.plan.has_value()) << ngram.response.body;
  for (const auto& job : ngram.plan->jobs) EXPECT_EQ(job.speculate, Speculation::ngram);
}

// n choices are n jobs: the same prompt and settings, each with its own mask hook, choice 0 with
// the request's seed and the others with distinct seeds derived from it.
TEST_F(Router, NChoicesAreNJobsWithDerivedSeedsAndTheirOwnMasks) {
  const json schema_rf = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
  auto r = route(req("POST", "/v1/chat/completions", chat_body({{"n", 3}, {"seed", 42}, {"response_format", schema_rf}})),
                 *state_);
  ASSERT_TRUE(r.plan.has_value()) << r.response.body;
  ASSERT_EQ(r.plan->jobs.size(), 3u);
  EXPECT_EQ(r.plan->meta.n, 3);
  EXPECT_EQ(r.plan->jobs[0].sampling.seed, 42u);
  std::set<uint64_t> seeds;
  for (const auto& job : r.plan->jobs) {
    EXPECT_EQ(job.prompt, r.plan->jobs[0].prompt);
    EXPECT_EQ(job.max_new_tokens, r.plan->jobs[0].max_new_tokens);
    ASSERT_TRUE(job.sampling.seed.has_value());
    seeds.insert(*job.sampling.seed);
    EXPECT_NE(job.mask, nullptr);
  }
  EXPECT_EQ(seeds.size(), 3u);
  EXPECT_NE(r.plan->jobs[1].mask, r.plan->jobs[2].mask);
  auto again = route(req("POST", "/v1/chat/completions", chat_body({{"n", 3}, {"seed", 42}})), *state_);
  ASSERT_TRUE(again.plan.has_value());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.plan->jobs[i].sampling.seed, r.plan->jobs[i].sampling.seed);
  auto unseeded = route(req("POST", "/v1/completions", R"({"prompt":"x","n":2})"), *state_);
  ASSERT_TRUE(unseeded.plan.has_value());
  ASSERT_EQ(unseeded.plan->jobs.size(), 2u);
  for (const auto& job : unseeded.plan->jobs) EXPECT_FALSE(job.sampling.seed.has_value());
}

TEST_F(Router, ConstraintsBecomeGrammarMasksAndUnenforceableOnesFailClosed) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])");
  const json schema_rf = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
  const std::vector<std::string> enforced = {
      chat_body({{"response_format", schema_rf}}),
      chat_body({{"response_format", {{"type", "json_object"}}}}),
      chat_body({{"tools", tools}, {"response_format", schema_rf}}),
      chat_body({{"tools", tools}, {"tool_choice", "required"}}),
      chat_body({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}),
  };
  for (const auto& body : enforced) {
    auto r = route(req("POST", "/v1/chat/completions", body), *state_);
    ASSERT_TRUE(r.plan.has_value()) << body << ": " << r.response.body;
    EXPECT_NE(r.plan->jobs[0].mask, nullptr) << body;
  }
  const json bad_schema = {{"type", "json_schema"},
                           {"json_schema", {{"name", "x"}, {"schema", json::parse(R"({"properties":{"a":{"$recursiveRef":"#meta"}}})")}}}};
  auto bad = route(req("POST", "/v1/chat/completions", chat_body({{"response_format", bad_schema}})), *state_);
  expect_error(bad, 400, "invalid_request_error", "response_format");
  EXPECT_NE(bad.response.body.find("/properties/a"), std::string::npos) << bad.response.body;
  EXPECT_NE(bad.response.body.find("'$recursiveRef'"), std::string::npos) << bad.response.body;
  const json bad_tools = json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","$recursiveRef":"#meta"}}}])");
  expect_error(route(req("POST", "/v1/chat/completions", chat_body({{"tools", bad_tools}, {"tool_choice", "required"}})), *state_),
               400, "invalid_request_error", "tools");
  expect_error(route(req("POST", "/v1/chat/completions",
                         chat_body({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}})),
                     *state_),
               400, "invalid_request_error", "tool_choice");
  auto ok = route(req("POST", "/v1/chat/completions", chat_body({{"tools", tools}, {"response_format", {{"type", "text"}}}})), *state_);
  ASSERT_TRUE(ok.plan.has_value()) << ok.response.body;
  EXPECT_TRUE(ok.plan->meta.tools_enabled);
  EXPECT_EQ(ok.plan->jobs[0].mask, nullptr);
}

TEST_F(Router, ChatPlanCarriesPromptAndSampling) {
  auto r = route(req("POST", "/v1/chat/completions",
                     chat_body({{"messages", json::array({{{"role", "developer"}, {"content", "Be kind."}},
                                                          {{"role", "user"}, {"content", [] {
                                                              json parts = json::array();
                                                              parts.push_back({{"type", "text"}, {"text", "Hi "}});
                                                              parts.push_back({{"type", "text"}, {"text", "there"}});
                                                              return parts;
                                                            }()}}})},
                                {"temperature", 0.5},
                                {"top_p", 0.9},
                                {"seed", 7},
                                {"stop", "END"},
                                {"logit_bias", {{"10", -100}, {"11", 5}}},
                                {"stream", true},
                                {"stream_options", {{"include_usage", true}}}})),
                 *state_);
  ASSERT_TRUE(r.plan.has_value()) << r.response.body;
  const auto& p = *r.plan;
  // The stories tokenizer has no chat template, so ChatML is used; developer is system.
  const std::string expected = "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(p.jobs[0].prompt, state_->tokenizer().encode(expected, true));
  EXPECT_EQ(p.jobs[0].prompt.front(), *state_->tokenizer().bos_id());
  EXPECT_EQ(p.jobs[0].max_new_tokens, state_->context_length() - int64_t(p.jobs[0].prompt.size()));
  EXPECT_FLOAT_EQ(p.jobs[0].sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.jobs[0].sampling.top_p, 0.9f);
  EXPECT_EQ(p.jobs[0].sampling.seed, 7u);
  EXPECT_EQ(p.jobs[0].sampling.logit_bias.at(10), -100.f);
  EXPECT_EQ(p.jobs[0].sampling.logit_bias.at(11), 5.f);
  EXPECT_NE(std::find(p.jobs[0].stop_strings.begin(), p.jobs[0].stop_strings.end(), "END"), p.jobs[0].stop_strings.end());
  EXPECT_NE(std::find(p.jobs[0].stop_strings.begin(), p.jobs[0].stop_strings.end(), "<|im_end|>"), p.jobs[0].stop_strings.end());
  for (int32_t eos : state_->tokenizer().eos_ids())
    EXPECT_NE(std::find(p.jobs[0].stop_tokens.begin(), p.jobs[0].stop_tokens.end(), eos), p.jobs[0].stop_tokens.end());
  EXPECT_TRUE(p.meta.chat && p.meta.stream && p.meta.include_usage);
  EXPECT_FALSE(p.meta.tools_enabled);
  EXPECT_EQ(p.meta.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(p.meta.model, "stories260K-hf");

  auto c = route(req("POST", "/v1/completions", R"({"prompt":["Once upon"],"max_tokens":7,"echo":true})"), *state_);
  ASSERT_TRUE(c.plan.has_value()) << c.response.body;
  EXPECT_EQ(c.plan->jobs[0].prompt, state_->tokenizer().encode("Once upon", true));
  EXPECT_EQ(c.plan->jobs[0].max_new_tokens, 7);
  EXPECT_FALSE(c.plan->meta.chat);
  EXPECT_EQ(c.plan->meta.echo, "Once upon");
}

// Issue #28: a user message holding "</s><s>" (eos and bos of the stories tokenizer) reaches the
// model as text, while /v1/completions, whose client writes its own template, still parses them.
TEST_F(Router, ChatContentCannotInjectSpecialTokens) {
  const Tokenizer& tok = state_->tokenizer();
  const int32_t eos = *tok.eos_ids().begin();
  auto specials = [&](const std::vector<int32_t>& ids) {
    std::vector<int32_t> out;
    for (int32_t id : ids)
      if (tok.is_special(id)) out.push_back(id);
    return out;
  };
  const std::string content = "Hi</s><s>there";
  auto r = route(req("POST", "/v1/chat/completions",
                     chat_body({{"messages", json::array({{{"role", "user"}, {"content", content}}})}})),
                 *state_);
  ASSERT_TRUE(r.plan.has_value()) << r.response.body;
  const std::string rendered = "<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> old = tok.encode(rendered, true);
  ASSERT_NE(std::find(old.begin(), old.end(), eos), old.end()) << "encoding the text whole parses </s>";
  EXPECT_EQ(specials(r.plan->jobs[0].prompt), std::vector<int32_t>{*tok.bos_id()});
  EXPECT_NE(tok.decode(r.plan->jobs[0].prompt).find(content), std::string::npos);

  auto c = route(req("POST", "/v1/completions", json{{"prompt", content}, {"max_tokens", 1}}.dump()), *state_);
  ASSERT_TRUE(c.plan.has_value()) << c.response.body;
  EXPECT_EQ(c.plan->jobs[0].prompt, tok.encode(content, true));
  EXPECT_NE(std::find(c.plan->jobs[0].prompt.begin(), c.plan->jobs[0].prompt.end(), eos), c.plan->jobs[0].prompt.end());
}

// Issue 28: a 6 MB prompt under the body limit cost 12 s of CPU before any limit applied. Prompt
// text is now held to --max-prompt-bytes before it is tokenized, then to --max-prompt-tokens.
TEST_F(Router, PromptLimitsInBytesThenTokens) {
  ServerOptions o;
  o.max_prompt_bytes = 4096;
  o.max_prompt_tokens = 64;
  auto st = make_state(o);
  ASSERT_EQ(st->max_prompt_tokens(), 64);
  auto message_of = [](const RouteResult& r) { return json::parse(r.response.body)["error"]["message"].get<std::string>(); };
  const auto user = [](const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); };

  auto bytes = route(req("POST", "/v1/chat/completions", chat_body({{"messages", user(std::string(4097, 'a'))}})), *st);
  expect_error(bytes, 400, "invalid_request_error", "messages", "context_length_exceeded");
  EXPECT_NE(message_of(bytes).find("4097 bytes"), std::string::npos) << message_of(bytes);
  EXPECT_NE(message_of(bytes).find("--max-prompt-bytes"), std::string::npos);
  // Tool-call arguments count as prompt text.
  const json call_msgs = json::parse(R"([{"role":"user","content":"x"},
    {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"ok"}])");
  json big_args = call_msgs;
  big_args[1]["tool_calls"][0]["function"]["arguments"] = json({{"k", std::string(5000, 'b')}}).dump();
  expect_error(route(req("POST", "/v1/chat/completions", chat_body({{"messages", big_args}})), *st), 400,
               "invalid_request_error", "messages", "context_length_exceeded");
  auto raw = route(req("POST", "/v1/completions", json({{"prompt", std::string(5000, 'c')}}).dump()), *st);
  expect_error(raw, 400, "invalid_request_error", "prompt", "context_length_exceeded");
  EXPECT_NE(message_of(raw).find("--max-prompt-bytes"), std::string::npos);

  // Under the byte limit but over 64 tokens (the context is 512): refused by the token limit.
  std::string words;
  for (int i = 0; i < 60; ++i) words += "cat dog sun ";
  ASSERT_LE(words.size(), 4096u);
  auto tokens = route(req("POST", "/v1/chat/completions", chat_body({{"messages", user(words)}})), *st);
  expect_error(tokens, 400, "invalid_request_error", "messages", "context_length_exceeded");
  EXPECT_NE(message_of(tokens).find("--max-prompt-tokens"), std::string::npos) << message_of(tokens);
  expect_error(route(req("POST", "/v1/completions", json({{"prompt", words}}).dump()), *st), 400,
               "invalid_request_error", "prompt", "context_length_exceeded");
  // Within both: a plan.
  EXPECT_TRUE(route(req("POST", "/v1/chat/completions", chat_body()), *st).plan.has_value());
  EXPECT_TRUE(route(req("POST", "/v1/completions", R"({"prompt":"Once upon a time"})"), *st).plan.has_value());
  // The token limit defaults to the context and never exceeds it.
  EXPECT_EQ(make_state()->max_prompt_tokens(), make_state()->context_length());
  ServerOptions huge;
  huge.max_prompt_tokens = 1 << 30;
  auto hs = make_state(huge);
  EXPECT_EQ(hs->max_prompt_tokens(), hs->context_length());
}

TEST_F(Router, AdmissionLimitAndDrain) {
  ServerOptions o;
  o.max_sessions = 2;
  auto st = make_state(o);
  auto a = route(req("POST", "/v1/chat/completions", chat_body()), *st);
  auto b = route(req("POST", "/v1/chat/completions", chat_body()), *st);
  ASSERT_TRUE(a.plan && b.plan);
  EXPECT_EQ(st->running_generations(), 2);
  auto over = route(req("POST", "/v1/chat/completions", chat_body()), *st);
  expect_error(over, 503, "rate_limit_error", {}, "server_overloaded");
  EXPECT_NE(std::find(over.response.headers.begin(), over.response.headers.end(),
                      std::pair<std::string, std::string>{"Retry-After", "1"}),
            over.response.headers.end());
  a.plan.reset();
  EXPECT_EQ(st->running_generations(), 1);
  EXPECT_TRUE(route(req("POST", "/v1/chat/completions", chat_body()), *st).plan.has_value());
  st->begin_drain();
  expect_error(route(req("POST", "/v1/completions", R"({"prompt":"x"})"), *st), 503, "unavailable_error", {},
               "server_shutting_down");
  EXPECT_EQ(route(req("GET", "/health", {}, ""), *st).response.status, 503);
}

TEST_F(Router, MetricsCountRequests) {
  auto st = make_state();
  route(req("GET", "/v1/models"), *st);
  route(req("GET", "/v1/models", {}, "bad"), *st);
  route(req("GET", "/nope"), *st);
  GenerationStats s;
  s.n_prompt_tokens = 100;
  s.n_cached_tokens = 64;
  s.n_generated = 11;
  s.ttft_s = 0.02;
  s.decode_s = 0.1;
  s.n_decode_passes = 6;
  s.n_drafted = 9;
  s.n_accepted = 5;
  st->metrics().observe_generation(s);
  st->metrics().observe_preparation(0.003);
  auto m = route(req("GET", "/metrics"), *st);
  ASSERT_EQ(m.response.status, 200);
  EXPECT_EQ(m.response.content_type.rfind("text/plain; version=0.0.4", 0), 0u);
  const std::string& t = m.response.body;
  for (const char* line : {"exlagent:requests_total{endpoint=\"/v1/models\",code=\"200\"} 1\n",
                           "exlagent:requests_total{endpoint=\"/v1/models\",code=\"401\"} 1\n",
                           "exlagent:requests_total{endpoint=\"other\",code=\"404\"} 1\n",
                           "exlagent:prompt_tokens_total 100\n", "exlagent:prefix_cache_hit_tokens_total 64\n",
                           "exlagent:generation_tokens_total 11\n", "exlagent:decode_passes_total 6\n",
                           "exlagent:spec_draft_tokens_total 9\n", "exlagent:spec_accepted_tokens_total 5\n",
                           "exlagent:time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n",
                           "exlagent:time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n",
                           "exlagent:inter_token_latency_seconds_count 10\n", "exlagent:requests_running 0\n",
                           "exlagent:request_preparation_seconds_bucket{le=\"0.001\"} 0\n",
                           "exlagent:request_preparation_seconds_bucket{le=\"0.005\"} 1\n"})
    EXPECT_NE(t.find(line), std::string::npos) << line << "\n" << t;
}

// --- CompletionWriter: events in, OpenAI wire format out -------------------------------------

GenerationEvent token(std::string text) {
  GenerationEvent e;
  e.type = GenerationEvent::Type::token;
  e.text = std::move(text);
  return e;
}
GenerationEvent done(FinishReason r, int64_t prompt = 10, int64_t cached = 4, int64_t gen = 3) {
  GenerationEvent e;
  e.type = GenerationEvent::Type::done;
  e.reason = r;
  e.stats.n_prompt_tokens = prompt;
  e.stats.n_cached_tokens = cached;
  e.stats.n_generated = gen;
  if (r == FinishReason::error) e.error = "engine: boom";
  return e;
}

std::vector<json> sse_events(const std::string& s, bool* saw_done) {
  std::vector<json> out;
  *saw_done = false;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    std::string ev = s.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    std::string data = ev.substr(6);
    EXPECT_FALSE(*saw_done) << "event after [DONE]";
    if (data == "[DONE]") *saw_done = true;
    else out.push_back(json::parse(data));
  }
  return out;
}

CompletionMeta meta(bool chat, bool stream, bool usage = false, bool tools = false) {
  CompletionMeta m;
  m.chat = chat;
  m.stream = stream;
  m.include_usage = usage;
  m.tools_enabled = tools;
  m.id = chat ? "chatcmpl-1" : "cmpl-1";
  m.created = 123;
  m.model = "m";
  return m;
}

TEST(CompletionWriter, ChatStreamWithUsage) {
  CompletionWriter w(meta(true, true, true), make_chat_template(parse_template_name("chatml"), {}));
  std::string s = w.begin();
  s += w.on_event(token("Once"));
  s += w.on_event(token(""));
  s += w.on_event(token(" upon"));
  s += w.on_event(done(FinishReason::max_tokens));
  bool saw_done = false;
  auto ev = sse_events(s, &saw_done);
  EXPECT_TRUE(saw_done);
  ASSERT_EQ(ev.size(), 5u);
  std::string content;
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i]["id"], "chatcmpl-1");
    EXPECT_EQ(ev[i]["created"], 123);
    EXPECT_EQ(ev[i]["object"], "chat.completion.chunk");
    if (i + 1 < ev.size()) {
      EXPECT_TRUE(ev[i]["usage"].is_null());
      content += ev[i]["choices"][0]["delta"].value("content", "");
    }
  }
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(content, "Once upon");
  EXPECT_EQ(ev[3]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(ev[2]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(ev[4]["choices"].empty());
  EXPECT_EQ(ev[4]["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(ev[4]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ev[4]["usage"]["total_tokens"], 13);
  EXPECT_EQ(ev[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(CompletionWriter, ChatStreamHoldsBackToolCalls) {
  CompletionWriter w(meta(true, true, false, true), make_chat_template(parse_template_name("chatml"), {}));
  std::string s = w.begin();
  for (const char* t : {"Sure.\n<tool_", "call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"}) {
    std::string part = w.on_event(token(t));
    EXPECT_EQ(part, "");
    s += part;
  }
  s += w.on_event(done(FinishReason::stop_string));
  bool saw_done = false;
  auto ev = sse_events(s, &saw_done);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[1]["choices"][0]["delta"]["content"], "Sure.");
  const auto& tc = ev[2]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(tc["index"], 0);
  EXPECT_EQ(tc["type"], "function");
  EXPECT_EQ(tc["function"]["name"], "f");
  EXPECT_EQ(tc["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(tc["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(ev[3]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_FALSE(ev[3].contains("usage"));
}

TEST(CompletionWriter, NonStreamingBodies) {
  CompletionWriter w(meta(true, false, false, true), make_chat_template(parse_template_name("mistral"), {}));
  EXPECT_EQ(w.on_event(token("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}]")), "");
  EXPECT_EQ(w.on_event(done(FinishReason::stop_token)), "");
  ASSERT_TRUE(w.done());
  json j = json::parse(w.response().body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["id"].get<std::string>().size(), 9u);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);

  CompletionWriter t(meta(false, false), nullptr);
  t.on_event(token("a time"));
  t.on_event(done(FinishReason::stop_string));
  json k = json::parse(t.response().body);
  EXPECT_EQ(k["object"], "text_completion");
  EXPECT_EQ(k["choices"][0]["text"], "a time");
  EXPECT_EQ(k["choices"][0]["finish_reason"], "stop");

  CompletionWriter e(meta(true, false), nullptr);
  e.on_event(done(FinishReason::error));
  EXPECT_EQ(e.response().status, 500);
  EXPECT_EQ(json::parse(e.response().body)["error"]["type"], "server_error");
  CompletionWriter es(meta(true, true), nullptr);
  bool saw_done = false;
  std::string es_text = es.begin();
  es_text += es.on_event(done(FinishReason::error));
  auto ev = sse_events(es_text, &saw_done);
  EXPECT_TRUE(saw_done);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["error"]["message"], "engine: boom");
}

// n = 3: choices interleave; each gets its role chunk, its own finish_reason when it ends, and
// the usage counts the prompt once and every choice's tokens.
TEST(CompletionWriter, ChoicesStreamInterleavedAndUsageCountsThePromptOnce) {
  CompletionMeta m = meta(true, true, true);
  m.n = 3;
  CompletionWriter w(m, nullptr);
  std::string s = w.begin();
  s += w.on_event(0, token("A"));
  s += w.on_event(2, token("C"));
  s += w.on_event(1, token("B"));
  s += w.on_event(2, done(FinishReason::stop_token, 10, 0, 1));
  EXPECT_FALSE(w.done());
  s += w.on_event(0, token("a"));
  s += w.on_event(0, done(FinishReason::max_tokens, 10, 0, 2));
  EXPECT_FALSE(w.done());
  s += w.on_event(1, done(FinishReason::stop_token, 10, 8, 5));
  EXPECT_TRUE(w.done());
  s += w.on_event(1, token("late"));
  bool saw_done = false;
  auto ev = sse_events(s, &saw_done);
  EXPECT_TRUE(saw_done);
  std::map<int, std::string> text, finish;
  std::map<int, int> roles;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    ASSERT_EQ(ev[i]["choices"].size(), 1u);
    const auto& c = ev[i]["choices"][0];
    const int idx = c["index"];
    if (c["delta"].contains("role")) ++roles[idx];
    text[idx] += c["delta"].value("content", "");
    if (!c["finish_reason"].is_null()) {
      EXPECT_EQ(finish.count(idx), 0u) << "one finish_reason per choice";
      finish[idx] = c["finish_reason"];
    }
  }
  EXPECT_EQ(roles, (std::map<int, int>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(text, (std::map<int, std::string>{{0, "Aa"}, {1, "B"}, {2, "C"}}));
  EXPECT_EQ(finish, (std::map<int, std::string>{{0, "length"}, {1, "stop"}, {2, "stop"}}));
  const json& usage = ev.back()["usage"];
  EXPECT_TRUE(ev.back()["choices"].empty());
  EXPECT_EQ(usage["prompt_tokens"], 10);
  EXPECT_EQ(usage["completion_tokens"], 8);
  EXPECT_EQ(usage["total_tokens"], 18);
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 0) << "choice 0's prompt";
  EXPECT_EQ(w.stats().n_generated, 8);
}

TEST(CompletionWriter, ChoicesInOneBodyAndAFailedChoiceFailsTheResponse) {
  CompletionMeta m = meta(true, false, false, true);
  m.n = 2;
  CompletionWriter w(m, make_chat_template(parse_template_name("chatml"), {}));
  w.on_event(1, token("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"));
  w.on_event(1, done(FinishReason::stop_string, 10, 0, 9));
  EXPECT_FALSE(w.done());
  w.on_event(0, token("Hello"));
  w.on_event(0, done(FinishReason::stop_token, 10, 0, 2));
  ASSERT_TRUE(w.done());
  json j = json::parse(w.response().body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["choices"][1]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(j["usage"]["completion_tokens"], 11);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);

  CompletionMeta tm = meta(false, false);
  tm.n = 2;
  CompletionWriter t(tm, nullptr);
  t.on_event(1, done(FinishReason::error));
  EXPECT_TRUE(t.done()) << "one failed choice ends the response";
  EXPECT_FALSE(t.choice_done(0));
  EXPECT_EQ(t.response().status, 500);
}

// --- logprobs -------------------------------------------------------------------------------

// Vocabulary: 0 "Once", 1 " upon", 2 "\xc3" (half a character), 3 "\xa9", 4 end of turn.
CompletionMeta logprob_meta(bool chat, bool stream, int32_t top) {
  CompletionMeta m = meta(chat, stream);
  m.top_logprobs = top;
  m.vocab = std::make_shared<TokenIndex>(std::vector<std::string>{"Once", " upon", "\xc3", "\xa9", ""},
                                         std::vector<int32_t>{4});
  m.hidden_tokens = {4};
  return m;
}

GenerationEvent lp_token(int32_t id, std::string text, float lp, std::vector<std::pair<int32_t, float>> top) {
  GenerationEvent e = token(std::move(text));
  e.token = id;
  e.logprobs = TokenLogprobs{lp, std::move(top)};
  return e;
}

std::vector<GenerationEvent> lp_events() {
  return {lp_token(0, "Once", -0.5f, {{0, -0.5f}, {1, -1.5f}}), lp_token(2, "", -0.25f, {{2, -0.25f}, {0, -2.f}}),
          lp_token(3, "\xc3\xa9", -0.125f, {{3, -0.125f}, {3, -0.125f}}), lp_token(4, "", -0.01f, {{4, -0.01f}, {0, -5.f}}),
          done(FinishReason::stop_token)};
}

TEST(CompletionWriter, ChatLogprobsListEveryTokenButTheEndOfTurn) {
  CompletionWriter w(logprob_meta(true, false, 2), nullptr);
  for (const auto& e : lp_events()) w.on_event(e);
  const json j = json::parse(w.response().body);
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["content"].size(), 3u) << lp;
  EXPECT_TRUE(lp["refusal"].is_null());
  EXPECT_EQ(lp["content"][0]["token"], "Once");
  EXPECT_DOUBLE_EQ(lp["content"][0]["logprob"].get<double>(), -0.5);
  EXPECT_EQ(lp["content"][0]["bytes"], json::parse("[79,110,99,101]"));
  EXPECT_EQ(lp["content"][0]["top_logprobs"][1]["token"], " upon");
  EXPECT_DOUBLE_EQ(lp["content"][0]["top_logprobs"][1]["logprob"].get<double>(), -1.5);
  EXPECT_EQ(lp["content"][1]["bytes"], json::parse("[195]"));
  EXPECT_EQ(lp["content"][2]["bytes"], json::parse("[169]"));
  CompletionWriter off(meta(true, false), nullptr);
  for (const auto& e : lp_events()) off.on_event(e);
  EXPECT_TRUE(json::parse(off.response().body)["choices"][0]["logprobs"].is_null());
}

TEST(CompletionWriter, StreamedLogprobsGoWithTheChunkThatSendsTheirText) {
  CompletionWriter w(logprob_meta(true, true, 1), nullptr);
  std::string s = w.begin();
  for (const auto& e : lp_events()) s += w.on_event(e);
  bool saw_done = false;
  const auto events = sse_events(s, &saw_done);
  EXPECT_TRUE(saw_done);
  json bytes = json::array();
  for (const auto& ev : events) {
    const json& c = ev["choices"][0];
    if (c["delta"].contains("content") && !c["delta"]["content"].get<std::string>().empty()) {
      ASSERT_TRUE(c["logprobs"].is_object()) << ev;
    }
    if (c["logprobs"].is_null()) continue;
    for (const auto& t : c["logprobs"]["content"]) bytes.push_back(t["bytes"]);
  }
  EXPECT_EQ(bytes, json::parse("[[79,110,99,101],[195],[169]]"));
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[2]["choices"][0]["logprobs"]["content"].size(), 2u) << "the held-back half goes with its other half";
}

TEST(CompletionWriter, CompletionsLogprobsHaveOffsetsAfterTheEcho) {
  CompletionMeta m = logprob_meta(false, false, 2);
  m.echo = "Hi";
  CompletionWriter w(m, nullptr);
  for (const auto& e : lp_events()) w.on_event(e);
  const json j = json::parse(w.response().body);
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 3u);
  EXPECT_EQ(lp["tokens"][0], "Once");
  EXPECT_EQ(lp["token_logprobs"], json::parse("[-0.5, -0.25, -0.125]"));
  EXPECT_EQ(lp["text_offset"], json::parse("[2, 6, 7]"));
  EXPECT_EQ(lp["top_logprobs"][0], json::parse(R"({"Once": -0.5, " upon": -1.5})"));
  EXPECT_EQ(lp["top_logprobs"][2].size(), 1u) << "one entry per distinct text";
}

TEST_F(Router, LogprobsParametersAreCheckedAndReachTheJob) {
  auto chat = route(req("POST", "/v1/chat/completions", chat_body({{"logprobs", true}, {"top_logprobs", 4}})), *state_);
  ASSERT_TRUE(chat.plan.has_value()) << chat.response.body;
  EXPECT_EQ(chat.plan->jobs[0].top_logprobs, 4);
  EXPECT_EQ(chat.plan->meta.top_logprobs, 4);
  ASSERT_NE(chat.plan->meta.vocab, nullptr);
  EXPECT_FALSE(chat.plan->meta.hidden_tokens.empty());
  chat.plan.reset();
  auto only = route(req("POST", "/v1/chat/completions", chat_body({{"logprobs", true}})), *state_);
  ASSERT_TRUE(only.plan.has_value());
  EXPECT_EQ(only.plan->jobs[0].top_logprobs, 0);
  only.plan.reset();
  auto none = route(req("POST", "/v1/chat/completions", chat_body({{"logprobs", false}})), *state_);
  ASSERT_TRUE(none.plan.has_value());
  EXPECT_EQ(none.plan->jobs[0].top_logprobs, -1);
  none.plan.reset();
  auto c = route(req("POST", "/v1/completions", R"({"prompt":"x","logprobs":2})"), *state_);
  ASSERT_TRUE(c.plan.has_value()) << c.response.body;
  EXPECT_EQ(c.plan->jobs[0].top_logprobs, 2);
  c.plan.reset();
  expect_error(route(req("POST", "/v1/chat/completions", chat_body({{"top_logprobs", 2}})), *state_), 400,
               "invalid_request_error", "top_logprobs");
  expect_error(route(req("POST", "/v1/chat/completions", chat_body({{"logprobs", true}, {"top_logprobs", 21}})), *state_),
               400, "invalid_request_error", "top_logprobs");
  expect_error(route(req("POST", "/v1/chat/completions", chat_body({{"logprobs", 3}})), *state_), 400,
               "invalid_request_error", "logprobs");
  expect_error(route(req("POST", "/v1/completions", R"({"prompt":"x","logprobs":6})"), *state_), 400,
               "invalid_request_error", "logprobs");
}

}  // namespace router_test
}  // namespace exl
