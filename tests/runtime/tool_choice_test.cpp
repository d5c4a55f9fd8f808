// tool_choice on /v1/chat/completions across tool formats: "none" with tools in the prompt forbids
// the format's call markup (an adversarial sampler that steers toward it cannot write it), and on
// templates without a native tool format (Llama 2) the generic format gives a grammar-valid call
// for every seed when a call is required. Runs on stories260K-hf (CPU).
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "engine/generate/grammar_constraint.h"
#include "runtime/openai/openai_request.h"
#include "runtime/openai/output_constraint.h"
#include "runtime/server/router.h"
#include "runtime/server/server.h"
#include "http_test_client.h"
#include "test_server.h"
#include "test_support.h"

namespace exl {
namespace tool_choice_test {

using json = nlohmann::json;
constexpr const char* kKey = "tool-choice-key";
constexpr const char* kModel = "models/stories260K-hf";

const json kTools = json::parse(R"([{"type":"function","function":{"name":"w","parameters":{"type":"object",
    "properties":{"c":{"type":"string","maxLength":4}},"required":["c"],"additionalProperties":false}}}])");

// A sampler that wants to write `target`: at each step it takes the allowed token that continues
// the target furthest, else a random allowed token. hook null = nothing is masked.
std::string adversarial_walk(LogitsMaskHook* hook, const Tokenizer& tok, const std::string& target, uint32_t seed,
                             int max_steps = 80) {
  const auto index = shared_token_index(tok);
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(mask_words(size_t(tok.vocab_size())));
  std::string out;
  for (int step = 0; step < max_steps && (!hook || !hook->terminated()); ++step) {
    std::fill(mask.begin(), mask.end(), hook ? 0u : ~0u);
    if (hook) hook->fill_mask(mask);
    int32_t best = -1;
    size_t best_len = 0;
    std::vector<int32_t> allowed;
    const std::string_view rest = out.size() < target.size() ? std::string_view(target).substr(out.size()) : "";
    for (int32_t t = 0; t < tok.vocab_size(); ++t) {
      if (!(mask[size_t(t) / 32] >> (t % 32) & 1u) || tok.eos_ids().count(t)) continue;
      const std::string& b = index->bytes(t);
      if (b.empty()) continue;
      allowed.push_back(t);
      if (b.size() > best_len && rest.substr(0, b.size()) == b) best = t, best_len = b.size();
    }
    if (allowed.empty()) break;
    const int32_t t = best >= 0 ? best : allowed[rng() % allowed.size()];
    if (hook) hook->accept(t);
    out += index->bytes(t);
    if (best < 0 && out.size() >= target.size()) break;
  }
  return out;
}

TEST(ToolChoiceNone, AnAdversarialSamplerCannotWriteCallMarkup) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto tok = load_tokenizer(test::shared_dir() / kModel);
  const std::string body = json{{"messages", {{{"role", "user"}, {"content", "Oslo?"}}}}, {"tools", kTools},
                                {"tool_choice", "none"}}.dump();
  const ChatRequest none = parse_chat_request(body, tok->vocab_size());
  for (const char* name : {"chatml", "mistral", "llama2", "llama3.0"}) {
    auto tmpl = make_chat_template(parse_template_name(name), {});
    const std::string marker = tmpl->tool_format() == ToolFormat::mistral ? "[TOOL_CALLS]" : "<tool_call>";
    const std::string call = tmpl->tool_format() == ToolFormat::mistral
                                 ? marker + R"( [{"name": "w", "arguments": {"c": "x"}}])"
                                 : marker + R"({"name": "w", "arguments": {"c": "x"}}</tool_call>)";
    EXPECT_NE(adversarial_walk(nullptr, *tok, call, 1).find(marker), std::string::npos) << "the sampler works";
    for (const std::string& target : {call, "Sure. " + call, "<" + call}) {
      for (uint32_t seed = 1; seed <= 3; ++seed) {
        auto hook = make_output_constraint(none, *tok, tmpl->tool_format());
        ASSERT_NE(hook, nullptr) << name;
        const std::string text = adversarial_walk(hook.get(), *tok, target, seed);
        EXPECT_FALSE(text.empty()) << name;
        EXPECT_EQ(text.find(marker), std::string::npos) << name << ": " << text;
        EXPECT_TRUE(tmpl->parse_reply(text, true).tool_calls.empty()) << name << ": " << text;
      }
    }
  }
  auto tmpl = make_chat_template(parse_template_name("llama3"), {});
  auto hook = make_output_constraint(none, *tok, ToolFormat::llama3_json);
  ASSERT_NE(hook, nullptr);
  const std::string text = adversarial_walk(hook.get(), *tok, R"({"name": "w", "parameters": {"c": "x"}})", 1);
  EXPECT_TRUE(tmpl->parse_reply(text, true).tool_calls.empty()) << text;
  EXPECT_NE(text.find_first_not_of(" \n\t"), std::string::npos);
  EXPECT_NE(text[text.find_first_not_of(" \n\t")], '{') << text;
  // Without tools, or with auto, nothing is constrained.
  const ChatRequest plain = parse_chat_request(json{{"messages", {{{"role", "user"}, {"content", "x"}}}}}.dump(),
                                               tok->vocab_size());
  EXPECT_EQ(make_output_constraint(plain, *tok, ToolFormat::hermes), nullptr);
}

// parallel_tool_calls false with tool_choice auto: a sampler that steers toward two calls (or
// text then a call, then another) gets at most one; true (the default) leaves auto unconstrained.
TEST(ParallelToolCalls, FalseAllowsAtMostOneCallPerReply) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto tok = load_tokenizer(test::shared_dir() / kModel);
  json body = {{"messages", {{{"role", "user"}, {"content", "Oslo?"}}}}, {"tools", kTools}};
  EXPECT_EQ(make_output_constraint(parse_chat_request(body.dump(), tok->vocab_size()), *tok, ToolFormat::hermes), nullptr);
  body["parallel_tool_calls"] = false;
  const ChatRequest single = parse_chat_request(body.dump(), tok->vocab_size());
  for (const char* name : {"chatml", "mistral", "llama2"}) {
    auto tmpl = make_chat_template(parse_template_name(name), {});
    const bool mistral = tmpl->tool_format() == ToolFormat::mistral;
    const bool hermes = tmpl->tool_format() == ToolFormat::hermes;
    const std::string call = mistral ? R"([TOOL_CALLS] [{"name": "w", "arguments": {"c": "x"}}, {"name": "w", "arguments": {"c": "y"}}])"
                             : hermes ? "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"x\"}}\n</tool_call>\n"
                                        "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"y\"}}\n</tool_call>"
                                      : R"(<tool_call>{"name": "w", "arguments": {"c": "x"}}</tool_call>)"
                                        "\n"
                                        R"(<tool_call>{"name": "w", "arguments": {"c": "y"}}</tool_call>)";
    const std::string free = adversarial_walk(nullptr, *tok, call, 1, 400);
    EXPECT_NE(free.find("\"name\"", free.find("\"name\"") + 1), std::string::npos)
        << name << ": the sampler writes two calls unconstrained: " << free;
    for (const std::string& target : {call, "Sure. " + call}) {
      for (uint32_t seed = 1; seed <= 3; ++seed) {
        auto hook = make_output_constraint(single, *tok, tmpl->tool_format());
        ASSERT_NE(hook, nullptr) << name;
        const std::string text = adversarial_walk(hook.get(), *tok, target, seed, 400);
        EXPECT_LE(tmpl->parse_reply(text, true).tool_calls.size(), 1u) << name << ": " << text;
      }
    }
  }
}

// A server on the Llama 2 template, which has no tool format of its own.
class GenericToolServer : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = test::shared_dir() / kModel;
    if (!std::filesystem::exists(dir / "model.safetensors")) return;
    ServerOptions o = test::test_server_options(dir, kKey);
    o.chat_template = "llama2";
    server_ = std::make_unique<test::TestServer>(o);
    state_ = server_->state;
  }
  static void TearDownTestSuite() {
    server_.reset();
    state_.reset();
  }
  void SetUp() override {
    if (!server_) GTEST_SKIP() << "shared asset missing: " << kModel;
  }
  static json chat(const json& body) {
    test::HttpReply r = test::http_request(server_->port(), "POST", "/v1/chat/completions", body.dump(), kKey);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  }
  static std::shared_ptr<ServerState> state_;
  static std::unique_ptr<test::TestServer> server_;
};
std::shared_ptr<ServerState> GenericToolServer::state_;
std::unique_ptr<test::TestServer> GenericToolServer::server_;

TEST_F(GenericToolServer, RequiredGivesAValidCallForEverySeed) {
  EXPECT_EQ(state_->chat_template()->tool_format(), ToolFormat::generic);
  const json messages = {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Oslo?"}}};
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "w"}}}}}) {
    for (int seed = 1; seed <= 6; ++seed) {
      const json r = chat({{"messages", messages}, {"tools", kTools}, {"tool_choice", choice}, {"temperature", 1},
                           {"seed", seed}, {"parallel_tool_calls", false}});
      const json& c = r["choices"][0];
      ASSERT_EQ(c["finish_reason"], "tool_calls") << "seed " << seed << ": " << r.dump();
      ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.dump();
      const json& call = c["message"]["tool_calls"][0];
      EXPECT_EQ(call["type"], "function");
      EXPECT_EQ(call["function"]["name"], "w");
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      ASSERT_TRUE(args.is_object() && args.size() == 1 && args["c"].is_string()) << args;
      EXPECT_LE(args["c"].get<std::string>().size(), 4u * 4) << args;  // 4 characters, up to 4 bytes each
    }
  }
  // The call goes back into the conversation, its result follows as a tool message.
  const json again = chat({{"messages", {{{"role", "user"}, {"content", "Oslo?"}},
                                         {{"role", "assistant"}, {"content", nullptr},
                                          {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                                           {"function", {{"name", "w"}, {"arguments", R"({"c":"x"})"}}}}}}},
                                         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "4"}}}},
                           {"tools", kTools}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(again["object"], "chat.completion") << again.dump();
}

TEST_F(GenericToolServer, NoneIsConstrainedAndNeverParsed) {
  HttpRequest req;
  req.method = "POST";
  req.target = "/v1/chat/completions";
  req.headers["host"] = "127.0.0.1";
  req.headers["authorization"] = std::string("Bearer ") + kKey;
  req.body = json{{"messages", {{{"role", "user"}, {"content", "Oslo?"}}}}, {"tools", kTools},
                  {"tool_choice", "none"}}.dump();
  RouteResult r = route(req, *state_);
  ASSERT_TRUE(r.plan.has_value()) << r.response.body;
  EXPECT_NE(r.plan->jobs[0].mask, nullptr);
  EXPECT_FALSE(r.plan->meta.tools_enabled);
}

}  // namespace tool_choice_test
}  // namespace exl
