// The server's built-in tools in agent sessions over /v1/ws, on the embedded demo model (ChatML,
// 1024-token context: the built-ins' descriptions do not fit stories260K's 512): calculator and
// read_file (offered because the server has a read root) answer scripted calls; read_file refuses
// paths outside its root; a client cannot register a built-in's name; a session's final-answer
// schema keeps the client's property order (it is the order the grammar makes the model write).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "runtime/server/server.h"
#include "runtime/server/session_hub.h"
#include "test_server.h"
#include "test_support.h"
#include "ws_test_client.h"

namespace exl {
namespace ws_builtin_tools_test {

using json = nlohmann::json;
using test::WsTestClient;
namespace fs = std::filesystem;

constexpr const char* kKey = "builtin-key";

std::string chatml_call(const std::string& name, const json& arguments) {
  return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + arguments.dump() + "}\n</tool_call>";
}

class WsBuiltinTools : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path model = test::source_dir() / "examples" / "demo-model" / "model";
    if (!fs::exists(model / "config.json")) return;
    dir_ = fs::temp_directory_path() / ("exl-ws-builtin-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "root" / "notes");
    std::ofstream(dir_ / "root" / "notes" / "todo.txt") << "buy 3 lemons\n";
    std::ofstream(dir_ / "secret.txt") << "outside the root\n";
    ServerOptions o = test::test_server_options(model, kKey);
    o.session_dir = (dir_ / "sessions").string();
    o.read_root = (dir_ / "root").string();
    server_ = std::make_unique<test::TestServer>(o);
    state_ = server_->state;
  }
  static void TearDownTestSuite() {
    server_.reset();
    state_.reset();
    fs::remove_all(dir_);
  }
  void SetUp() override {
    if (!server_) GTEST_SKIP() << "examples/demo-model/model is absent";
  }
  static void script(std::vector<std::string> replies) {
    state_->sessions().set_turn_constraint(scripted_turns(state_->tokenizer(), std::move(replies)));
  }
  // How long a test waits for a turn's event: a turn of the demo model under ASan took 20–30 s
  // beside another test (these are correctness tests, not timed ones).
  static constexpr std::chrono::milliseconds k_turn_wait{120000};
  // Runs one user message in a new session offered `tools`; returns the tool_result events.
  static std::vector<json> run(WsTestClient& c, const std::vector<std::string>& tools, int expected_results) {
    json created = c.call("sessions/create", {{"tools", tools}, {"maxTokens", 96}});
    EXPECT_TRUE(created.contains("result")) << created;
    if (!created.contains("result")) return {};
    const std::string sid = created["result"]["sessionId"];
    EXPECT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "go"}}).contains("result"));
    std::vector<json> results;
    for (int i = 0; i < expected_results; ++i) {
      auto r = c.next_of("sessions/event", "tool_result", k_turn_wait);
      EXPECT_TRUE(r) << json(c.seen()).dump();
      if (!r) break;
      results.push_back((*r)["params"]);
    }
    auto done = c.next_of("sessions/event", "done", k_turn_wait);
    EXPECT_TRUE(done && (*done)["params"]["reason"] == "final") << json(c.seen()).dump();
    return results;
  }

  static std::shared_ptr<ServerState> state_;
  static std::unique_ptr<test::TestServer> server_;
  static fs::path dir_;
};
std::shared_ptr<ServerState> WsBuiltinTools::state_;
std::unique_ptr<test::TestServer> WsBuiltinTools::server_;
fs::path WsBuiltinTools::dir_;

TEST_F(WsBuiltinTools, CalculatorIsExactOnDecimals) {
  script({chatml_call("calculator", {{"expression", "0.1 + 0.2 * 3"}}), "Done."});
  WsTestClient c(server_->port(), kKey);
  const auto results = run(c, {"calculator"}, 1);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0]["name"], "calculator");
  EXPECT_EQ(results[0]["isError"], false) << results[0];
  EXPECT_NE(results[0]["content"].get<std::string>().find("0.7"), std::string::npos) << results[0];
  EXPECT_EQ(results[0]["content"].get<std::string>().find("0.70000"), std::string::npos) << "not binary floating point";
}

TEST_F(WsBuiltinTools, ReadFileReadsOnlyUnderTheRoot) {
  script({chatml_call("read_file", {{"path", "notes/todo.txt"}}) + "\n" + chatml_call("read_file", {{"path", "../secret.txt"}}),
          "Done."});
  WsTestClient c(server_->port(), kKey);
  const auto results = run(c, {"read_file"}, 2);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0]["isError"], false) << results[0];
  EXPECT_NE(results[0]["content"].get<std::string>().find("buy 3 lemons"), std::string::npos) << results[0];
  EXPECT_EQ(results[1]["isError"], true) << results[1];
  EXPECT_EQ(results[1]["content"].get<std::string>().find("outside the root"), std::string::npos) << results[1];
}

TEST_F(WsBuiltinTools, BuiltInNamesAreReservedAndUnknownToolsRefused) {
  WsTestClient c(server_->port(), kKey);
  json bad = c.call("sessions/create", {{"tools", {"no_such_tool"}}});
  ASSERT_TRUE(bad.contains("error")) << bad;
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("no_such_tool"), std::string::npos) << bad;
  json reg = c.call("tools/register", {{"tools", json::array({{{"name", "calculator"}, {"inputSchema", {{"type", "object"}}}}})}});
  EXPECT_TRUE(reg.contains("error")) << "a client must not shadow a built-in tool: " << reg;
  json list = c.call("tools/list");
  ASSERT_TRUE(list.contains("result")) << list;
}

TEST_F(WsBuiltinTools, FinalAnswerSchemaKeepsPropertyOrder) {
  script({"{\"zeta\": 1, \"alpha\": \"a\"}"});
  WsTestClient c(server_->port(), kKey);
  const std::string frame = R"({"jsonrpc":"2.0","id":1,"method":"sessions/create","params":{"finalAnswerSchema":)"
                            R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}},)"
                            R"("required":["zeta","alpha"],"additionalProperties":false}}})";
  json created = c.call_raw(frame);
  ASSERT_TRUE(created.contains("result")) << created;
  const std::string sid = created["result"]["sessionId"];
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "go"}}).contains("result"));
  auto done = c.next_of("sessions/event", "done", k_turn_wait);
  ASSERT_TRUE(done) << json(c.seen()).dump();
  EXPECT_EQ((*done)["params"]["reason"], "final") << *done;
  const std::string saved = test::read_file(dir_ / "sessions" / (sid + ".json"));
  const size_t zeta = saved.find("\"zeta\""), alpha = saved.find("\"alpha\"");
  ASSERT_NE(zeta, std::string::npos) << saved;
  EXPECT_LT(zeta, alpha) << "the stored schema lost the client's property order: " << saved;
}

}  // namespace ws_builtin_tools_test
}  // namespace exl
