// Issue 28 (grammar DoS) at the HTTP API: pathological patterns are refused or compiled quickly,
// a grammar past the server's budget or one nothing satisfies is a 400 (an unsatisfiable schema
// was a 500 from the failed generation), and a request whose client is gone stops compiling and
// leaves nothing cached. Runs on stories260K-hf (CPU) without sockets; nothing generates.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/server/router.h"
#include "test_support.h"

namespace exl {
namespace grammar_budget_route_test {

using json = nlohmann::json;
constexpr const char* kModel = "models/stories260K-hf";

std::shared_ptr<ServerState> make_state(ServerOptions o = {}) {
  o.model_dir = (test::shared_dir() / kModel).string();
  return std::make_shared<ServerState>(o);
}

HttpRequest schema_request(const json& schema) {
  HttpRequest r;
  r.method = "POST";
  r.target = "/v1/chat/completions";
  r.headers["host"] = "127.0.0.1:8421";
  r.body = json{{"model", "m"},
                {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})},
                {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}}
               .dump();
  return r;
}

json pattern(const std::string& p) { return {{"type", "string"}, {"pattern", p}}; }

// The error body of a refused request: its status, code and message.
json error_of(const RouteResult& r, int status) {
  EXPECT_FALSE(r.plan.has_value());
  EXPECT_EQ(r.response.status, status) << r.response.body;
  return json::parse(r.response.body).value("error", json::object());
}

class GrammarBudgetRoute : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::shared_dir() / kModel / "model.safetensors"))
      GTEST_SKIP() << "shared asset missing: " << (test::shared_dir() / kModel);
  }
};

TEST_F(GrammarBudgetRoute, PathologicalPatternsAreRefusedOrCompiled) {
  auto state = make_state();
  RouteResult ok = route(schema_request(pattern("^[a-z]{1,65535}$")), *state);
  EXPECT_TRUE(ok.plan.has_value()) << ok.response.body;
  json e = error_of(route(schema_request(pattern("^.{0,100000}$")), *state), 400);
  EXPECT_EQ(e.value("type", ""), "invalid_request_error");
  EXPECT_EQ(e.value("param", ""), "response_format");
  EXPECT_NE(e.value("message", "").find("{0,100000}"), std::string::npos) << e;
}

TEST_F(GrammarBudgetRoute, UnsatisfiableSchemaIsABadRequest) {
  auto state = make_state();
  json e = error_of(route(schema_request({{"type", "string"}, {"minLength", 5}, {"maxLength", 2}}), *state), 400);
  EXPECT_EQ(e.value("type", ""), "invalid_request_error");
  EXPECT_NE(e.value("message", "").find("cannot be satisfied"), std::string::npos) << e;
}

// A tool whose parameters' grammar cannot be compiled: a GrammarError, reported against "tools"
// (an exl::Error from the tool list itself would name "tool_choice"; GrammarError is one too,
// so its handler must come first).
TEST_F(GrammarBudgetRoute, UnenforceableToolParametersNameTools) {
  auto state = make_state();
  HttpRequest r = schema_request(json::object());
  json body = json::parse(r.body);
  body.erase("response_format");
  body["tools"] = json::array({{{"type", "function"},
                                {"function",
                                 {{"name", "f"},
                                  {"parameters",
                                   {{"type", "object"},
                                    {"properties", {{"s", {{"type", "string"}, {"minLength", 5}, {"maxLength", 2}}}}},
                                    {"required", json::array({"s"})}}}}}}});
  body["tool_choice"] = "required";
  r.body = body.dump();
  json e = error_of(route(r, *state), 400);
  EXPECT_EQ(e.value("code", ""), "unsupported_schema") << e;
  EXPECT_EQ(e.value("param", ""), "tools") << e;
  EXPECT_NE(e.value("message", "").find("cannot be enforced: "), std::string::npos) << e;
}

TEST_F(GrammarBudgetRoute, ServerBudgetIsEnforced) {
  ServerOptions o;
  o.grammar_budget.max_states = 100;
  auto state = make_state(o);
  json e = error_of(route(schema_request(pattern("^[a-z]{1,300}$")), *state), 400);
  EXPECT_EQ(e.value("code", ""), "grammar_budget_exceeded");
  EXPECT_NE(e.value("message", "").find("limit of 100 automaton states"), std::string::npos) << e;
}

TEST_F(GrammarBudgetRoute, DisconnectCancelsAndNothingIsCached) {
  auto state = make_state();
  HttpRequest gone = schema_request(pattern("^[a-y]{1,4321}$"));
  int polls = 0;
  gone.client_gone = [&] { return ++polls > 0; };
  json e = error_of(route(gone, *state), 499);
  EXPECT_EQ(e.value("code", ""), "request_cancelled");
  EXPECT_GE(polls, 1);
  HttpRequest again = schema_request(pattern("^[a-y]{1,4321}$"));
  int polls_again = 0;
  again.client_gone = [&] { return ++polls_again < 0; };
  RouteResult ok = route(again, *state);
  EXPECT_TRUE(ok.plan.has_value()) << ok.response.body;
  EXPECT_GE(polls_again, 1);  // compiled again: the cancelled attempt left no cache entry
}

}  // namespace grammar_budget_route_test
}  // namespace exl
