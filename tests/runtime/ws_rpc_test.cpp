// The /v1/ws JSON-RPC layer without sockets: framing errors, method dispatch, notifications, and
// the upgrade checks (Host, Origin, API key, subprotocol).
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "runtime/server/session_hub.h"
#include "runtime/server/ws_rpc.h"
#include "test_support.h"

namespace exl {
namespace ws_rpc_test {

using json = nlohmann::json;

class WsRpc : public testing::Test {
 protected:
  void SetUp() override {
    const auto dir = test::shared_dir() / "models/stories260K-hf";
    if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << "shared asset missing: " << dir;
    if (!state_) {
      ServerOptions o;
      o.model_dir = dir.string();
      o.api_key = "k";
      o.session_dir = (std::filesystem::temp_directory_path() / ("exl-ws-rpc-" + std::to_string(::getpid()))).string();
      state_ = std::make_shared<ServerState>(o);
    }
  }
  json call(const std::string& text) {
    auto r = handle_rpc_message(text, *state_);
    EXPECT_TRUE(r.has_value()) << text;
    return r ? json::parse(*r) : json();
  }
  static std::shared_ptr<ServerState> state_;
};
std::shared_ptr<ServerState> WsRpc::state_;

TEST_F(WsRpc, ErrorsUseJsonRpcCodes) {
  EXPECT_EQ(call("{nope")["error"]["code"], -32700);
  EXPECT_TRUE(call("{nope")["id"].is_null());
  EXPECT_EQ(call(R"([{"jsonrpc":"2.0","id":1,"method":"server/info"}])")["error"]["code"], -32600);
  EXPECT_EQ(call(R"({"id":1,"method":"server/info"})")["error"]["code"], -32600);
  EXPECT_EQ(call(R"({"jsonrpc":"2.0","id":{"x":1},"method":"server/info"})")["error"]["code"], -32600);
  EXPECT_EQ(call(R"({"jsonrpc":"2.0","id":1,"method":5})")["error"]["code"], -32600);
  json nf = call(R"({"jsonrpc":"2.0","id":"a7","method":"sessions/teleport"})");
  EXPECT_EQ(nf["error"]["code"], -32601);
  EXPECT_EQ(nf["id"], "a7");
  EXPECT_EQ(call(R"({"jsonrpc":"2.0","id":2,"method":"server/info","params":3})")["error"]["code"], -32602);
  const std::string deep = R"({"jsonrpc":"2.0","id":3,"method":"server/info","params":{"x":)" + std::string(100000, '[') +
                           std::string(100000, ']') + "}}";
  EXPECT_EQ(call(deep)["error"]["code"], -32600);
}

TEST_F(WsRpc, MethodsAndNotifications) {
  json info = call(R"({"jsonrpc":"2.0","id":1,"method":"server/info"})");
  EXPECT_EQ(info["jsonrpc"], "2.0");
  EXPECT_EQ(info["id"], 1);
  EXPECT_EQ(info["result"]["protocol"], "exlagent.v1");
  EXPECT_EQ(info["result"]["model"], "stories260K-hf");
  EXPECT_EQ(call(R"({"jsonrpc":"2.0","id":2,"method":"models/list","params":{}})")["result"]["data"][0]["id"],
            "stories260K-hf");
  EXPECT_FALSE(handle_rpc_message(R"({"jsonrpc":"2.0","method":"notifications/initialized"})", *state_).has_value());
  EXPECT_FALSE(handle_rpc_message(R"({"jsonrpc":"2.0","id":9,"result":{}})", *state_).has_value());
}

// Issue 28: a rate-limited request was answered with id null, so its caller waited forever.
TEST_F(WsRpc, RateLimitedRequestsKeepTheirId) {
  WsPeer peer;
  peer.send = [](std::string) {};
  json last;
  for (int i = 1; i <= kWsMaxMessagesPerSecond + 1; ++i) {
    auto r = handle_rpc_message(json({{"jsonrpc", "2.0"}, {"id", "req-" + std::to_string(i)}, {"method", "server/info"}}).dump(),
                                *state_, &peer);
    ASSERT_TRUE(r.has_value());
    last = json::parse(*r);
  }
  ASSERT_TRUE(last.contains("error")) << last << " (the window may have rolled over; rerun)";
  EXPECT_EQ(last["error"]["code"], rpc_code::rate_limited);
  EXPECT_EQ(last["id"], "req-" + std::to_string(kWsMaxMessagesPerSecond + 1));
  auto garbage = handle_rpc_message("{nope", *state_, &peer);
  ASSERT_TRUE(garbage.has_value());
  EXPECT_TRUE(json::parse(*garbage)["id"].is_null());
}

// Issue 28: "maxTokens": 4294967301 became 5 (integer wrap). Numbers out of range are invalid params.
TEST_F(WsRpc, OutOfRangeNumbersAreInvalidParams) {
  WsPeer peer;
  peer.id = 777;
  peer.send = [](std::string) {};
  for (const char* params : {R"({"maxTokens":4294967301})", R"({"maxTokens":-4294967295})",
                             R"({"maxTurns":4294967297})", R"({"maxTokens":5.5})", R"({"toolTimeoutMs":18446744073709551615})",
                             R"({"sampling":{"top_k":4294967301}})", R"({"sampling":{"seed":-1}})",
                             R"({"sampling":{"temperature":1e300}})"}) {
    const std::string frame = std::string(R"({"jsonrpc":"2.0","id":5,"method":"sessions/create","params":)") + params + "}";
    auto r = handle_rpc_message(frame, *state_, &peer);
    ASSERT_TRUE(r.has_value());
    json j = json::parse(*r);
    ASSERT_TRUE(j.contains("error")) << params << " -> " << j;
    EXPECT_EQ(j["error"]["code"], rpc_code::invalid_params) << params;
    EXPECT_EQ(j["id"], 5);
  }
  auto ok = json::parse(*handle_rpc_message(
      R"({"jsonrpc":"2.0","id":6,"method":"sessions/create","params":{"maxTokens":7}})", *state_, &peer));
  ASSERT_TRUE(ok.contains("result")) << ok;
  close_ws_peer(peer, *state_);
}

TEST_F(WsRpc, UpgradeChecks) {
  HttpRequest r;
  r.method = "GET";
  r.target = "/v1/ws";
  r.headers = {{"host", "127.0.0.1:8421"}, {"authorization", "Bearer k"}, {"sec-websocket-protocol", "foo, exlagent.v1"}};
  EXPECT_FALSE(check_ws_upgrade(r, *state_).has_value());
  auto status = [&](HttpRequest x) {
    auto e = check_ws_upgrade(x, *state_);
    return e ? e->status : 101;
  };
  // The Origin check is the HTTP routes' one: only the server's own loopback origins by default.
  state_->set_bound_port(8421);
  r.headers["origin"] = "http://localhost:8421";
  EXPECT_EQ(status(r), 101);
  HttpRequest other_port = r;
  other_port.headers["origin"] = "http://localhost:3000";  // another local web app
  EXPECT_EQ(status(other_port), 403);
  HttpRequest o = r;
  o.headers["origin"] = "https://evil.example";
  EXPECT_EQ(status(o), 403);
  HttpRequest h = r;
  h.headers["host"] = "evil.example";
  EXPECT_EQ(status(h), 403);
  HttpRequest k = r;
  k.headers["authorization"] = "Bearer wrong";
  EXPECT_EQ(status(k), 401);
  HttpRequest p = r;
  p.headers["sec-websocket-protocol"] = "mcp";
  EXPECT_EQ(status(p), 101) << "an MCP client (runtime/server/ws_mcp.h)";
  EXPECT_EQ(choose_ws_subprotocol("mcp, exlagent.v1"), "exlagent.v1");
  EXPECT_EQ(choose_ws_subprotocol(" mcp"), "mcp");
  p.headers["sec-websocket-protocol"] = "graphql-ws";
  EXPECT_EQ(status(p), 400);
  p.headers.erase("sec-websocket-protocol");
  EXPECT_EQ(status(p), 400);
  HttpRequest t = r;
  t.target = "/v1/other";
  EXPECT_EQ(status(t), 404);
  state_->set_bound_port(0);
}

// A connection that chose the "mcp" subprotocol speaks the MCP lifecycle over the server's tools.
TEST_F(WsRpc, McpPeersGetTheMcpLifecycle) {
  std::mutex mu;
  std::vector<json> sent;
  WsPeer peer;
  peer.id = 9001;
  peer.mcp = true;
  peer.send = [&](std::string f) {
    std::lock_guard lk(mu);
    sent.push_back(json::parse(f));
  };
  auto rpc = [&](const json& msg) {
    auto r = handle_rpc_message(msg.dump(), *state_, &peer);
    return r ? json::parse(*r) : json();
  };
  EXPECT_EQ(rpc({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "tools/list"}})["error"]["code"], -32600) << "before initialize";
  EXPECT_EQ(rpc({{"jsonrpc", "2.0"}, {"id", 2}, {"method", "ping"}})["result"], json::object());
  const json init = rpc({{"jsonrpc", "2.0"}, {"id", 3}, {"method", "initialize"},
                         {"params", {{"protocolVersion", "2025-03-26"}, {"capabilities", json::object()},
                                     {"clientInfo", {{"name", "t"}, {"version", "1"}}}}}});
  EXPECT_EQ(init["result"]["protocolVersion"], "2025-03-26");
  EXPECT_EQ(init["result"]["serverInfo"]["name"], "exlagent");
  EXPECT_TRUE(init["result"]["capabilities"].contains("tools"));
  EXPECT_TRUE(rpc({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}).is_null());
  const json list = rpc({{"jsonrpc", "2.0"}, {"id", 4}, {"method", "tools/list"}});
  std::vector<std::string> names;
  for (const auto& t : list["result"]["tools"]) names.push_back(t["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"calculator", "current_time", "json_query", "regex_extract"})) << list;
  EXPECT_TRUE(rpc({{"jsonrpc", "2.0"}, {"id", 5}, {"method", "tools/call"},
                   {"params", {{"name", "calculator"}, {"arguments", {{"expression", "0.1 + 0.2 * 3"}}}}}})
                  .is_null())
      << "answered when the call finishes";
  EXPECT_TRUE(rpc({{"jsonrpc", "2.0"}, {"id", 6}, {"method", "tools/call"},
                   {"params", {{"name", "calculator"}, {"arguments", {{"expression", 3}}}}}})
                  .is_null());
  EXPECT_EQ(rpc({{"jsonrpc", "2.0"}, {"id", 7}, {"method", "tools/call"}, {"params", {{"name", "nope"}}}})["error"]["code"],
            -32602);
  EXPECT_EQ(rpc({{"jsonrpc", "2.0"}, {"id", 8}, {"method", "sessions/create"}})["error"]["code"], -32601)
      << "exlagent.v1 methods are not MCP's";
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lk(mu);
      if (sent.size() >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard lk(mu);
  ASSERT_EQ(sent.size(), 2u);
  std::map<int, json> by_id;
  for (const auto& f : sent) by_id[f["id"].get<int>()] = f["result"];
  EXPECT_EQ(by_id[5]["isError"], false) << by_id[5];
  EXPECT_EQ(by_id[5]["content"][0]["type"], "text");
  EXPECT_EQ(by_id[5]["content"][0]["text"], "0.7") << by_id[5];
  EXPECT_EQ(by_id[6]["isError"], true) << "the registry checks the arguments: " << by_id[6];
}

}  // namespace ws_rpc_test
}  // namespace exl
