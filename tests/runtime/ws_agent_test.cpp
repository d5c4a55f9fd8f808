// Agent sessions over /v1/ws against the real server (stories260K on the CPU, loopback), driven
// by a Beast WebSocket client: a session calls a tool that the client registered and finishes;
// tool timeout; tool-client disconnect; the second turn's prefix-cache hit; bad frames, methods
// and limits, after each of which the server still serves.
//
// The tiny model cannot call tools by itself, so these tests script the model's output with
// SessionHub::set_turn_constraint (a ForcedTextHook per turn: the real generator samples under a
// mask that allows only the scripted tokens). The grammar that constrains unscripted turns is
// tested in tests/sessions/agent_constraint_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "runtime/server/server.h"
#include "runtime/server/session_hub.h"
#include "test_server.h"
#include "test_support.h"
#include "ws_test_client.h"

namespace exl {
namespace ws_agent_test {

using json = nlohmann::json;
using test::WsTestClient;

constexpr const char* kKey = "ws-key";
// Mistral's tool format is the most compact; stories260K's context is only 512 tokens.
constexpr const char* kCall = "[TOOL_CALLS] [{\"name\": \"lookup\", \"arguments\": {\"city\": \"Oslo\"}}]";
constexpr const char* kStory = "Once upon a time there was a little cat who liked to play in the sun with her friends.";

constexpr const char* kStoriesWeights = "models/stories260K-hf/model.safetensors";

// The options of a test that starts its own stories260K server: no API key, 16-token pages,
// `cache_pages` of them, transcripts in a fresh temporary directory named `temp_name`.
ServerOptions own_server_options(const std::string& temp_name, int cache_pages = 64) {
  ServerOptions o = test::test_server_options(test::shared_dir() / "models/stories260K-hf");
  o.page_size = 16;
  o.cache_pages = cache_pages;
  o.session_dir = (test::temp_dir(temp_name) / "sessions").string();
  return o;
}

class WsAgent : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = test::shared_dir() / "models/stories260K-hf";
    if (!std::filesystem::exists(dir / "model.safetensors")) return;
    session_dir_ = std::filesystem::temp_directory_path() / ("exl-ws-agent-" + std::to_string(::getpid()));
    ServerOptions o = test::test_server_options(dir, kKey);
    o.page_size = 16;
    o.max_sessions = 6;
    o.session_dir = session_dir_.string();
    o.chat_template = "mistral";
    server_ = std::make_unique<test::TestServer>(o);
    state_ = server_->state;
  }
  static void TearDownTestSuite() {
    server_.reset();
    state_.reset();
    std::filesystem::remove_all(session_dir_);
  }
  void SetUp() override {
    if (!server_) GTEST_SKIP() << "shared asset missing: models/stories260K-hf";
  }
  static void script(std::vector<std::string> replies) {
    state_->sessions().set_turn_constraint(scripted_turns(state_->tokenizer(), std::move(replies)));
  }
  static json lookup_tool() {
    return {{"name", "lookup"},
            {"description", "Current temperature of a city"},
            {"inputSchema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}};
  }
  static void expect_server_alive() {
    WsTestClient c(server_->port(), kKey);
    EXPECT_EQ(c.call("server/info")["result"]["protocol"], "exlagent.v1");
  }

  static std::shared_ptr<ServerState> state_;
  static std::unique_ptr<test::TestServer> server_;
  static std::filesystem::path session_dir_;
};
std::shared_ptr<ServerState> WsAgent::state_;
std::unique_ptr<test::TestServer> WsAgent::server_;
std::filesystem::path WsAgent::session_dir_;

TEST_F(WsAgent, SessionCallsClientToolAndFinishes) {
  script({kCall, "It is 4 degrees in Oslo."});
  WsTestClient c(server_->port(), kKey);
  json reg = c.call("tools/register", {{"tools", json::array({lookup_tool()})}});
  ASSERT_EQ(reg["result"]["tools"], json::array({"lookup"})) << reg;
  json created = c.call("sessions/create", {{"system", "You are helpful."}, {"tools", {"lookup"}}, {"maxTokens", 64}});
  ASSERT_TRUE(created.contains("result")) << created;
  const std::string sid = created["result"]["sessionId"];
  ASSERT_EQ(c.call("sessions/send", {{"sessionId", sid}, {"content", "How warm is Oslo?"}})["result"]["accepted"], true);

  auto call = c.next_of("tools/call");
  ASSERT_TRUE(call) << "no tools/call request; frames: " << json(c.seen()).dump();
  EXPECT_EQ((*call)["params"]["name"], "lookup");
  EXPECT_EQ((*call)["params"]["arguments"], json({{"city", "Oslo"}}));
  const json meta = (*call)["params"]["_meta"];
  EXPECT_EQ(meta["progressToken"], (*call)["id"]);
  EXPECT_GT(meta["exlagent/deadlineMs"].get<int64_t>(), 0);
  c.send({{"jsonrpc", "2.0"}, {"method", "notifications/progress"},
          {"params", {{"progressToken", (*call)["id"]}, {"progress", 1}, {"total", 2}}}});
  c.send({{"jsonrpc", "2.0"}, {"id", (*call)["id"]},
          {"result", {{"content", {{{"type", "text"}, {"text", "4 degrees"}}}}, {"isError", false}}}});

  auto done = c.next_of("sessions/event", "done");
  ASSERT_TRUE(done);
  EXPECT_EQ((*done)["params"]["sessionId"], sid);
  EXPECT_EQ((*done)["params"]["reason"], "final");
  EXPECT_NE((*done)["params"]["content"].get<std::string>().find("It is 4 degrees in Oslo."), std::string::npos);
  EXPECT_EQ((*done)["params"]["turns"], 2);

  // The event stream, in order: tokens, tool_call, tool_result, turn_end x2, done.
  std::vector<std::string> types;
  std::string text;
  for (const auto& f : c.seen())
    if (f.value("method", "") == "sessions/event") {
      const std::string t = f["params"]["type"];
      if (t == "token") text += f["params"]["text"].get<std::string>();
      if (types.empty() || types.back() != t) types.push_back(t);
    }
  EXPECT_EQ(types, (std::vector<std::string>{"token", "turn_end", "tool_call", "tool_result", "token", "turn_end", "done"}));
  EXPECT_NE(text.find("[TOOL_CALLS]"), std::string::npos);
  for (const auto& f : c.seen())
    if (f.value("method", "") == "sessions/event" && f["params"]["type"] == "tool_result") {
      EXPECT_EQ(f["params"]["content"], "4 degrees");
      EXPECT_EQ(f["params"]["isError"], false);
    }

  // The transcript on disk: system, user, assistant with the call, tool result, final answer.
  std::ifstream f(session_dir_ / (sid + ".json"));
  ASSERT_TRUE(f) << "no transcript";
  json tr = json::parse(f);
  const json& m = tr["messages"];
  ASSERT_EQ(m.size(), 5u) << tr.dump(1);
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[1]["content"], "How warm is Oslo?");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["name"], "lookup");
  EXPECT_EQ(m[3]["role"], "tool");
  EXPECT_EQ(m[3]["content"], "4 degrees");
  EXPECT_EQ(m[3]["tool_call_id"], m[2]["tool_calls"][0]["id"]);
  EXPECT_EQ(m[4]["role"], "assistant");

  // Resume after a "restart": a new connection loads the transcript and continues it.
  c.close();
  WsTestClient d(server_->port(), kKey);
  json resumed;
  for (int i = 0; i < 50; ++i) {  // the old connection's sessions close asynchronously
    resumed = d.call("sessions/resume", {{"sessionId", sid}});
    if (resumed.contains("result")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(resumed.contains("result")) << resumed;
  EXPECT_EQ(resumed["result"]["messages"].size(), 5u);
  script({"Still 4 degrees."});
  ASSERT_TRUE(d.call("sessions/send", {{"sessionId", sid}, {"content", "And now?"}}).contains("result"));
  auto done2 = d.next_of("sessions/event", "done");
  ASSERT_TRUE(done2);
  EXPECT_EQ((*done2)["params"]["reason"], "final");
}

TEST_F(WsAgent, SecondTurnIsPrefixCacheHit) {
  script({kStory});
  WsTestClient c(server_->port(), kKey);
  const std::string sid = c.call("sessions/create", {{"system", "Tell stories."}, {"maxTokens", 64}})["result"]["sessionId"];
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "Tell me a story."}}).contains("result"));
  auto t1 = c.next_of("sessions/event", "turn_end");
  ASSERT_TRUE(t1);
  ASSERT_TRUE(c.next_of("sessions/event", "done"));
  const int64_t p1 = (*t1)["params"]["usage"]["prompt_tokens"];
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "Another one."}}).contains("result"));
  auto t2 = c.next_of("sessions/event", "turn_end");
  ASSERT_TRUE(t2);
  const int64_t cached = (*t2)["params"]["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, p1) << "turn 2 prompt " << (*t2)["params"]["usage"]["prompt_tokens"];
  EXPECT_GT((*t2)["params"]["usage"]["prompt_tokens"].get<int64_t>(), cached);
  ASSERT_TRUE(c.next_of("sessions/event", "done"));
}

TEST_F(WsAgent, ToolTimeoutGoesBackToTheModel) {
  script({kCall, "The lookup timed out."});
  WsTestClient c(server_->port(), kKey);
  ASSERT_TRUE(c.call("tools/register", {{"tools", json::array({lookup_tool()})}}).contains("result"));
  const std::string sid =
      c.call("sessions/create", {{"tools", {"lookup"}}, {"toolTimeoutMs", 300}})["result"]["sessionId"];
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "Oslo?"}}).contains("result"));
  auto call = c.next_of("tools/call");
  ASSERT_TRUE(call);
  auto cancelled = c.next_of("notifications/cancelled");
  ASSERT_TRUE(cancelled);
  EXPECT_EQ((*cancelled)["params"]["requestId"], (*call)["id"]);
  EXPECT_EQ((*cancelled)["params"]["reason"], "deadline");
  // A late answer is ignored.
  c.send({{"jsonrpc", "2.0"}, {"id", (*call)["id"]}, {"result", {{"content", json::array()}, {"isError", false}}}});
  auto done = c.next_of("sessions/event", "done");
  ASSERT_TRUE(done);
  EXPECT_EQ((*done)["params"]["reason"], "final");
  bool saw_timeout = false;
  for (const auto& f : c.seen())
    if (f.value("method", "") == "sessions/event" && f["params"]["type"] == "tool_result") {
      EXPECT_EQ(f["params"]["isError"], true);
      saw_timeout = f["params"]["content"].get<std::string>().find("timed out") != std::string::npos;
    }
  EXPECT_TRUE(saw_timeout);
  EXPECT_EQ(c.call("server/info")["result"]["protocol"], "exlagent.v1");
}

TEST_F(WsAgent, ToolClientDisconnectFailsCallsAndDropsTools) {
  script({kCall, "The tool is gone."});
  auto tools = std::make_unique<WsTestClient>(server_->port(), kKey);
  ASSERT_TRUE(tools->call("tools/register", {{"tools", json::array({lookup_tool()})}}).contains("result"));
  WsTestClient c(server_->port(), kKey);
  const std::string sid = c.call("sessions/create", {{"tools", {"lookup"}}})["result"]["sessionId"];
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "Oslo?"}}).contains("result"));
  ASSERT_TRUE(tools->next_of("tools/call"));
  tools->drop();
  auto result = c.next_of("sessions/event", "tool_result");
  ASSERT_TRUE(result);
  EXPECT_EQ((*result)["params"]["isError"], true);
  EXPECT_NE((*result)["params"]["content"].get<std::string>().find("disconnected"), std::string::npos);
  auto done = c.next_of("sessions/event", "done");
  ASSERT_TRUE(done);
  EXPECT_EQ((*done)["params"]["reason"], "final");
  // Its tools are gone for new sessions.
  EXPECT_EQ(c.call("tools/list")["result"]["tools"], json::array());
  EXPECT_EQ(c.call("sessions/create", {{"tools", {"lookup"}}})["error"]["code"], -32602);
}

// Issue 28, fault injection: a tool client that answers with garbage (not JSON: the call waits for
// its deadline), with the wrong shape, or with huge output (cut, with a note saying so). Each run
// still ends with done, another client's session still runs, and the server still serves.
TEST_F(WsAgent, ToolGarbageWrongShapeAndHugeOutput) {
  WsTestClient tools(server_->port(), kKey);
  ASSERT_TRUE(tools.call("tools/register", {{"tools", json::array({lookup_tool()})}}).contains("result"));
  WsTestClient c(server_->port(), kKey);
  // Only the garbage case waits for its timeout; the others answer, and a long timeout keeps a
  // 3 MiB reply under a sanitizer on a loaded machine from timing out instead.
  auto run = [&](const std::function<void(const json& call)>& answer, int timeout_ms = 30000) -> json {
    script({kCall, "Done."});
    json created = c.call("sessions/create", {{"tools", {"lookup"}}, {"toolTimeoutMs", timeout_ms}});
    EXPECT_TRUE(created.contains("result")) << created;
    const std::string sid = created["result"]["sessionId"];
    EXPECT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "Oslo?"}}).contains("result"));
    auto call = tools.next_of("tools/call");
    EXPECT_TRUE(call);
    if (call) answer(*call);
    auto result = c.next_of("sessions/event", "tool_result");
    EXPECT_TRUE(result);
    auto done = c.next_of("sessions/event", "done");
    EXPECT_TRUE(done) << json(c.seen()).dump().substr(0, 2000);
    c.call("sessions/close", {{"sessionId", sid}});
    return result ? (*result)["params"] : json();
  };
  // Not JSON: a parse error back to the tool client; the call times out.
  json garbage = run([&](const json&) {
    tools.send_text("{\"jsonrpc\": \"2.0\", \"id\": \"tc-");
    auto e = tools.read();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)["error"]["code"], -32700);
  }, 500);
  EXPECT_EQ(garbage["isError"], true);
  EXPECT_NE(garbage["content"].get<std::string>().find("timed out"), std::string::npos) << garbage;
  // The wrong shape: a result that is not a CallToolResult object.
  json wrong = run([&](const json& call) {
    tools.send({{"jsonrpc", "2.0"}, {"id", call["id"]}, {"result", "sunny"}});
  });
  EXPECT_EQ(wrong["isError"], true);
  EXPECT_NE(wrong["content"].get<std::string>().find("malformed"), std::string::npos) << wrong;
  // Huge output: 3 MiB of text, cut to 64 KiB with a note.
  json huge = run([&](const json& call) {
    tools.send({{"jsonrpc", "2.0"}, {"id", call["id"]},
                {"result", {{"content", {{{"type", "text"}, {"text", std::string(3u << 20, 'z')}}}}}}});
  });
  const std::string content = huge["content"];
  EXPECT_LT(content.size(), (64u << 10) + 200);
  EXPECT_EQ(content.substr(0, 16), std::string(16, 'z'));
  EXPECT_NE(content.find("[exlagent: tool output truncated: 65536 of 3145728 bytes shown]"), std::string::npos);
  // Another session, on another connection, still runs to its final answer.
  script({"Fine."});
  WsTestClient other(server_->port(), kKey);
  const std::string sid = other.call("sessions/create", {{"maxTokens", 8}})["result"]["sessionId"];
  ASSERT_TRUE(other.call("sessions/send", {{"sessionId", sid}, {"content", "Hi"}}).contains("result"));
  auto done = other.next_of("sessions/event", "done");
  ASSERT_TRUE(done);
  EXPECT_EQ((*done)["params"]["reason"], "final");
  expect_server_alive();
}

// A conversation over --max-prompt-tokens ends its run with an error event naming the limit.
TEST(WsAgentLimits, PromptTokenLimitEndsTheRunWithAnError) {
  EXL_REQUIRE_SHARED(kStoriesWeights);
  ServerOptions o = own_server_options("WsAgentLimits");
  o.max_prompt_tokens = 40;
  test::TestServer server(o);
  WsTestClient c(server.port(), "");
  const std::string sid = c.call("sessions/create", {{"maxTokens", 4}})["result"]["sessionId"];
  std::string words;
  for (int i = 0; i < 30; ++i) words += "cat dog ";
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", words}}).contains("result"));
  auto error = c.next_of("sessions/event", "error");
  ASSERT_TRUE(error);
  EXPECT_NE((*error)["params"]["message"].get<std::string>().find("--max-prompt-tokens"), std::string::npos) << *error;
  auto done = c.next_of("sessions/event", "done");
  ASSERT_TRUE(done);
  EXPECT_EQ((*done)["params"]["reason"], "error");
}

TEST_F(WsAgent, BadFramesMethodsAndLimits) {
  {
    WsTestClient c(server_->port(), kKey);
    c.send_text("{not json");
    auto e = c.read();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)["error"]["code"], -32700);
    EXPECT_EQ(c.call("sessions/teleport")["error"]["code"], -32601);
    EXPECT_EQ(c.call("sessions/send", {{"sessionId", "s-nope"}, {"content", "x"}})["error"]["code"], -32011);
    EXPECT_EQ(c.call("sessions/send", {{"content", "x"}})["error"]["code"], -32602);
    EXPECT_EQ(c.call("sessions/create", {{"maxTurns", 0}})["error"]["code"], -32602);
    EXPECT_EQ(c.call("sessions/create", {{"sampling", {{"temperature", "hot"}}}})["error"]["code"], -32602);
    EXPECT_EQ(c.call("tools/register", {{"tools", {{{"name", "bad name!"}, {"inputSchema", json::object()}}}}})["error"]["code"],
              -32602);
    EXPECT_EQ(c.call("tools/register", {{"tools", {{{"name", "t"}, {"inputSchema", {{"type", "string"}}}}}}})["error"]["code"],
              -32602);
    EXPECT_EQ(c.call("sessions/resume", {{"sessionId", "../../etc/passwd"}})["error"]["code"], -32602);
    EXPECT_EQ(c.call("sessions/resume", {{"sessionId", "s-never-saved"}})["error"]["code"], -32011);
    // Session limit (--max-sessions 6).
    std::vector<std::string> ids;
    json over;
    for (int i = 0; i < 7; ++i) {
      json r = c.call("sessions/create");
      if (r.contains("error")) {
        over = r;
        break;
      }
      ids.push_back(r["result"]["sessionId"]);
    }
    EXPECT_EQ(over["error"]["code"], -32014) << over;
    EXPECT_LE(ids.size(), 6u);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(c.call("sessions/close", {{"sessionId", ids[0]}})["result"], json::object());
    EXPECT_TRUE(c.call("sessions/create").contains("result"));
    // Content over 1 MiB.
    EXPECT_EQ(c.call("sessions/send", {{"sessionId", ids[1]}, {"content", std::string((1u << 20) + 1, 'a')}})["error"]["code"],
              -32013);
    // Message rate.
    const int n = 300;
    for (int i = 0; i < n; ++i) c.send({{"jsonrpc", "2.0"}, {"id", 1000 + i}, {"method", "server/info"}});
    int limited = 0;
    for (int i = 0; i < n; ++i) {
      auto r = c.read();
      ASSERT_TRUE(r);
      limited += r->contains("error") && (*r)["error"]["code"] == -32012;
    }
    EXPECT_GT(limited, 0);
  }
  expect_server_alive();
  {
    WsTestClient c(server_->port(), kKey);
    c.send_text(std::string((4u << 20) + 10, ' '));
    EXPECT_FALSE(c.read());
    EXPECT_EQ(c.close_reason().code, 1009);
  }
  expect_server_alive();
  {
    WsTestClient c(server_->port(), kKey);
    c.close();
  }
  expect_server_alive();
}

// Issue 28: create+close of sessions filled a shared temp directory with world-readable
// transcripts that were never deleted. Now: a private directory, 0600 files, and a retention limit.
TEST(WsAgentTranscripts, PrivateAndBounded) {
  EXL_REQUIRE_SHARED(kStoriesWeights);
  ServerOptions o = own_server_options("WsAgentTranscripts");
  const std::filesystem::path sessions = o.session_dir;
  o.session_retain_files = 3;
  test::TestServer server(o);
  WsTestClient c(server.port(), "");
  for (int i = 0; i < 12; ++i) {
    json created = c.call("sessions/create", {{"system", "You are helpful."}});
    ASSERT_TRUE(created.contains("result")) << created;
    ASSERT_TRUE(c.call("sessions/close", {{"sessionId", created["result"]["sessionId"]}}).contains("result"));
  }
  EXPECT_EQ(c.call("server/info")["result"]["protocol"], "exlagent.v1");  // every close has been handled
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(sessions)) {
    ++files;
    EXPECT_EQ(e.path().extension(), ".json") << e.path();
    EXPECT_EQ(std::filesystem::status(e.path()).permissions() & std::filesystem::perms::all,
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)
        << e.path();
  }
  EXPECT_GE(files, 1u);
  EXPECT_LE(files, 3u);
  EXPECT_EQ(std::filesystem::status(sessions).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
}

// Graceful shutdown drains agent runs: a session waiting for a client's tool when the server is
// told to stop gets the answer and finishes; new requests meanwhile get "shutting down".
TEST(WsAgentShutdown, RunningSessionFinishesBeforeExit) {
  EXL_REQUIRE_SHARED(kStoriesWeights);
  ServerOptions o = own_server_options("WsAgentShutdown", 128);
  o.chat_template = "mistral";
  test::TestServer server(o);
  server.state->sessions().set_turn_constraint(scripted_turns(server.state->tokenizer(), {kCall, "It is 4 degrees."}));
  WsTestClient c(server.port(), "");
  ASSERT_TRUE(c.call("tools/register", {{"tools", json::array({{{"name", "lookup"}, {"inputSchema", {{"type", "object"}}}}})}})
                  .contains("result"));
  const std::string sid = c.call("sessions/create", {{"tools", {"lookup"}}})["result"]["sessionId"];
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "Oslo?"}}).contains("result"));
  auto call = c.next_of("tools/call");
  ASSERT_TRUE(call);

  auto stopped = std::async(std::launch::async, [&server] { server.server.shutdown(std::chrono::seconds(20)); });
  EXPECT_EQ(stopped.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "shutdown must wait for the session's run";
  json refused = c.call("server/info");
  ASSERT_TRUE(refused.contains("error")) << refused;
  EXPECT_EQ(refused["error"]["code"], rpc_code::shutting_down);
  json create = c.call("sessions/create", {{"tools", {"lookup"}}});
  ASSERT_TRUE(create.contains("error")) << "sessions/create during the drain: " << create;
  EXPECT_EQ(create["error"]["code"], rpc_code::shutting_down);
  c.send({{"jsonrpc", "2.0"}, {"id", (*call)["id"]}, {"result", {{"content", {{{"type", "text"}, {"text", "4"}}}}}}});
  auto done = c.next_of("sessions/event", "done");
  ASSERT_TRUE(done) << json(c.seen()).dump();
  EXPECT_EQ((*done)["params"]["reason"], "final") << *done;
  // Then a normal close: 1001 going away, not a dropped connection (1006).
  while (c.next(std::chrono::milliseconds(10000))) {
  }
  EXPECT_EQ(c.last_error(), boost::beast::websocket::error::closed) << c.last_error().message();
  EXPECT_EQ(c.close_reason().code, boost::beast::websocket::close_code::going_away);
  EXPECT_EQ(stopped.wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

// Issue 28: on shutdown with nothing running, idle WebSocket clients were dropped without a close
// frame (1006); they now get 1001 going away.
TEST(WsAgentShutdown, IdleConnectionsGetGoingAway) {
  EXL_REQUIRE_SHARED(kStoriesWeights);
  test::TestServer server(own_server_options("WsAgentShutdownIdle"));
  WsTestClient a(server.port(), ""), b(server.port(), "");
  ASSERT_TRUE(a.call("sessions/create", json::object()).contains("result"));
  ASSERT_TRUE(b.call("server/info").contains("result"));
  auto stopped = std::async(std::launch::async, [&server] { server.server.shutdown(std::chrono::seconds(5)); });
  auto read_a = std::async(std::launch::async, [&a] { return a.next(std::chrono::milliseconds(10000)); });
  auto read_b = std::async(std::launch::async, [&b] { return b.next(std::chrono::milliseconds(10000)); });
  EXPECT_FALSE(read_a.get().has_value());
  EXPECT_FALSE(read_b.get().has_value());
  stopped.get();
  for (WsTestClient* c : {&a, &b}) {
    EXPECT_EQ(c->last_error(), boost::beast::websocket::error::closed) << c->last_error().message();
    EXPECT_EQ(c->close_reason().code, boost::beast::websocket::close_code::going_away);
  }
}

// A turn still queued in the generator when the server goes: the state's teardown destroys the
// job after the sessions and their executor, so the job's callback must hold nothing of theirs
// but a weak reference (ASan: a heap-use-after-free of the strand's service before).
TEST(WsAgentShutdown, AQueuedTurnOutlivesItsSessionsSafely) {
  EXL_REQUIRE_SHARED(kStoriesWeights);
  auto server = std::make_unique<test::TestServer>(own_server_options("WsAgentShutdownQueued"));
  server->state->generator().stop();  // the turn stays queued
  WsTestClient c(server->port(), "");
  const json created = c.call("sessions/create", json::object());
  ASSERT_TRUE(created.contains("result")) << created;
  const std::string sid = created["result"]["sessionId"];
  ASSERT_TRUE(c.call("sessions/send", {{"sessionId", sid}, {"content", "Once upon a time"}}).contains("result"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the session's strand submits the job
  server.reset();
  SUCCEED();
}

}  // namespace ws_agent_test
}  // namespace exl
