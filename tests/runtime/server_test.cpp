// The real server on 127.0.0.1 (port 0 = a free port) with stories260K on the CPU, driven by a
// Beast HTTP client over loopback: chat (plain and SSE), completions, prefix-cache usage, auth,
// malformed and oversized requests, bad Host, client disconnect and graceful shutdown. After each
// bad request a good request on a new connection must still succeed.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <set>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/cli_runner.h"
#include "runtime/server/server.h"
#include "http_test_client.h"
#include "test_server.h"
#include "test_support.h"

namespace exl {
namespace server_test {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;

constexpr const char* kKey = "test-key-123";

using Reply = test::HttpReply;

class ServerFixture : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = test::shared_dir() / "models/stories260K-hf";
    if (!std::filesystem::exists(dir / "model.safetensors")) return;
    ServerOptions o = test::test_server_options(dir, kKey);
    o.page_size = 16;
    o.max_body_bytes = 64 * 1024;
    server_ = std::make_unique<test::TestServer>(o);
    state_ = server_->state;
    std::printf("[ server   ] listening on 127.0.0.1:%u\n", unsigned(server_->port()));
  }
  static void TearDownTestSuite() {
    server_.reset();
    state_.reset();
  }
  void SetUp() override {
    if (!server_) GTEST_SKIP() << "shared asset missing: models/stories260K-hf";
  }

  static Reply request(const std::string& method, const std::string& target, const std::string& body = {},
                       const std::string& key = kKey, const std::string& host = "127.0.0.1") {
    return test::http_request(server_->port(), method, target, body, key, host);
  }

  static json chat(json body, int expect_status = 200) {
    Reply r = request("POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, expect_status) << r.body;
    return json::parse(r.body);
  }

  static void expect_good_request_still_works() {
    json j = chat({{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 3}});
    EXPECT_EQ(j["object"], "chat.completion");
  }

  // SSE data payloads, checking the framing.
  static std::vector<std::string> sse_data(const std::string& body) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "unterminated SSE event";
      if (end == std::string::npos) break;
      std::string ev = body.substr(pos, end - pos);
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      out.push_back(ev.substr(6));
      pos = end + 2;
    }
    return out;
  }

  static std::shared_ptr<ServerState> state_;
  static std::unique_ptr<test::TestServer> server_;
};
std::shared_ptr<ServerState> ServerFixture::state_;
std::unique_ptr<test::TestServer> ServerFixture::server_;

json story_request(int max_tokens, bool stream) {
  json j = {{"model", "stories260K"},
            {"messages",
             {{{"role", "system"}, {"content", "You tell short stories for small children about animals."}},
              {{"role", "user"}, {"content", "Tell me a story about a brave little dog."}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  if (stream) {
    j["stream"] = true;
    j["stream_options"] = {{"include_usage", true}};
  }
  return j;
}

TEST_F(ServerFixture, ChatNonStreaming) {
  json j = chat(story_request(20, false));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "stories260K-hf");
  ASSERT_EQ(j["choices"].size(), 1u);
  const auto& c = j["choices"][0];
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_TRUE(c["message"]["content"].is_string());
  EXPECT_FALSE(c["message"]["content"].get<std::string>().empty());
  const int64_t n = j["usage"]["completion_tokens"];
  EXPECT_GE(n, 1);
  EXPECT_LE(n, 20);
  EXPECT_EQ(c["finish_reason"], n == 20 ? "length" : "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int64_t>() + n);
}

TEST_F(ServerFixture, StreamingMatchesNonStreamingAtTemperatureZero) {
  json whole = chat(story_request(24, false));
  Reply r = request("POST", "/v1/chat/completions", story_request(24, true).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "text/event-stream");
  auto data = sse_data(r.body);
  ASSERT_GE(data.size(), 4u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string content, id;
  std::string finish;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    json c = json::parse(data[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (id.empty()) id = c["id"];
    EXPECT_EQ(c["id"], id);
    if (i + 2 < data.size()) {
      EXPECT_TRUE(c["usage"].is_null());
      ASSERT_EQ(c["choices"].size(), 1u);
      if (i == 0) {
        EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
      }
      content += c["choices"][0]["delta"].value("content", "");
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    } else {
      EXPECT_TRUE(c["choices"].empty());
      // The same prompt a second time may be served from the prefix cache: compare all but that.
      auto usage = c["usage"], expected = whole["usage"];
      usage["prompt_tokens_details"].erase("cached_tokens");
      expected["prompt_tokens_details"].erase("cached_tokens");
      EXPECT_EQ(usage, expected) << "usage chunk";
    }
  }
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
}

TEST_F(ServerFixture, RepeatedPromptReportsCachedTokens) {
  json a = chat(story_request(4, false));
  json b = chat(story_request(4, false));
  const int64_t prompt = a["usage"]["prompt_tokens"];
  EXPECT_GT(prompt, 32);
  EXPECT_EQ(b["usage"]["prompt_tokens"], prompt);
  const int64_t cached = b["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, 0);
  EXPECT_GE(cached, prompt / 16 * 16 - 16);  // every full page but possibly the last
  EXPECT_LT(cached, prompt);
}

TEST_F(ServerFixture, CompletionsAndModels) {
  Reply r = request("POST", "/v1/completions", R"({"model":"m","prompt":"Once upon a time","max_tokens":8,"temperature":0})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_FALSE(j["choices"][0]["text"].get<std::string>().empty());
  Reply m = request("GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "stories260K-hf");
  Reply one = request("GET", "/v1/models/stories260K-hf");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(json::parse(one.body)["id"], "stories260K-hf");
  EXPECT_EQ(json::parse(one.body)["object"], "model");
  Reply missing = request("GET", "/v1/models/gpt-4o");
  ASSERT_EQ(missing.status, 404) << missing.body;
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], "model_not_found");
  EXPECT_NE(missing.body.find("gpt-4o"), std::string::npos);
  Reply h = request("GET", "/health", {}, "");
  EXPECT_EQ(h.status, 200);
  Reply metrics = request("GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("exlagent:requests_total{endpoint=\"/v1/completions\",code=\"200\"}"), std::string::npos);
  const std::string prep = "exlagent:request_preparation_seconds_count ";  // the completion's preparation
  const auto at = metrics.body.find(prep);
  ASSERT_NE(at, std::string::npos) << metrics.body;
  EXPECT_GE(std::stoll(metrics.body.substr(at + prep.size())), 1);
}

TEST_F(ServerFixture, BadRequestsThenGoodOnes) {
  EXPECT_EQ(request("GET", "/v1/models", {}, "").status, 401);
  expect_good_request_still_works();
  EXPECT_EQ(request("GET", "/v1/models", {}, "wrong-key").status, 401);
  expect_good_request_still_works();
  Reply bad = request("POST", "/v1/chat/completions", "{\"messages\": [");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(json::parse(bad.body)["error"]["code"], "invalid_json");
  expect_good_request_still_works();
  EXPECT_EQ(request("GET", "/v1/models", {}, kKey, "attacker.example").status, 403);
  expect_good_request_still_works();
  Reply big = request("POST", "/v1/chat/completions", std::string(100 * 1024, ' '));
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(json::parse(big.body)["error"]["code"], "request_too_large");
  expect_good_request_still_works();
  Reply schema = request("POST", "/v1/chat/completions",
                         R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"$recursiveRef":"#meta"}}}})");
  EXPECT_EQ(schema.status, 400);
  EXPECT_EQ(json::parse(schema.body)["error"]["type"], "invalid_request_error");
  expect_good_request_still_works();
}

TEST_F(ServerFixture, GarbageOnTheWireGetsAnErrorAndTheServerLives) {
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
  net::write(sock, net::buffer(std::string("NOT HTTP AT ALL\r\n\r\n")));
  std::string got;
  beast::error_code ec;
  char buf[4096];
  for (;;) {
    size_t n = sock.read_some(net::buffer(buf), ec);
    if (ec) break;
    got.append(buf, n);
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  expect_good_request_still_works();
}

TEST_F(ServerFixture, KeepAliveServesSeveralRequestsOnOneConnection) {
  net::io_context ioc;
  tcp::socket sock(ioc);
  sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
  beast::flat_buffer buf;
  for (int i = 0; i < 3; ++i) {
    http::request<http::string_body> req(http::verb::post, "/v1/chat/completions", 11);
    req.set(http::field::host, "localhost");
    req.set("x-api-key", kKey);
    req.body() = story_request(3, i == 1).dump();
    req.prepare_payload();
    http::write(sock, req);
    http::response<http::string_body> res;
    http::read(sock, buf, res);
    EXPECT_EQ(res.result_int(), 200) << res.body();
    EXPECT_TRUE(res.keep_alive());
  }
}

int64_t generated_tokens_total(ServerState& st) {
  const std::string m = st.metrics().render(0);
  const std::string key = "\nexlagent:generation_tokens_total ";
  const size_t p = m.find(key);
  return p == std::string::npos ? -1 : std::stoll(m.substr(p + key.size()));
}

int64_t metric_total(ServerState& st, const std::string& name) {
  const std::string m = st.metrics().render(0);
  const std::string key = "\n" + name + " ";
  const size_t p = m.find(key);
  return p == std::string::npos ? -1 : std::stoll(m.substr(p + key.size()));
}

// n = 3 runs three jobs; choices 1 and 2 start after choice 0 has prefilled and take every full
// page of the prompt from the prefix cache (the fixture's pages hold 16 tokens), so the prompt is
// prefilled once. A seeded request is reproducible as a whole, and its choices differ.
TEST_F(ServerFixture, NChoicesSharePromptPagesAndAreReproducibleWithASeed) {
  json body = story_request(12, false);
  body["messages"][0]["content"] = "You are the storyteller of a small seaside village school.";
  body["messages"][1]["content"] = "Tell me a story about a brave little cat named Whiskers who lives by the sea.";
  body["n"] = 3;
  body["seed"] = 11;
  body["temperature"] = 1.0;
  const int64_t prompt_before = metric_total(*state_, "exlagent:prompt_tokens_total");
  const int64_t hits_before = metric_total(*state_, "exlagent:prefix_cache_hit_tokens_total");
  json a = chat(body);
  const int64_t prompt = a["usage"]["prompt_tokens"];
  ASSERT_GT(prompt, 48);
  const int64_t cached0 = a["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_LE(cached0, 16) << "a prompt never seen but for the template's opening page";
  EXPECT_EQ(metric_total(*state_, "exlagent:prompt_tokens_total") - prompt_before, 3 * prompt);
  EXPECT_GE(metric_total(*state_, "exlagent:prefix_cache_hit_tokens_total") - hits_before,
            cached0 + 2 * ((prompt - 1) / 16 * 16))
      << "choices 1 and 2 reuse choice 0's full prompt pages";
  ASSERT_EQ(a["choices"].size(), 3u);
  int64_t completion = 0;
  std::set<std::string> texts;
  for (size_t i = 0; i < 3; ++i) {
    const auto& c = a["choices"][i];
    EXPECT_EQ(c["index"], i);
    texts.insert(c["message"]["content"].get<std::string>());
    EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length") << c;
  }
  EXPECT_EQ(texts.size(), 3u) << a;
  completion = a["usage"]["completion_tokens"];
  EXPECT_GE(completion, 3);
  EXPECT_LE(completion, 36);
  EXPECT_EQ(a["usage"]["total_tokens"], prompt + completion);

  json b = chat(body);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b["choices"][i]["message"], a["choices"][i]["message"]) << i;
  EXPECT_EQ(b["usage"]["completion_tokens"], completion);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply r = request("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  auto data = sse_data(r.body);
  ASSERT_EQ(data.back(), "[DONE]");
  std::map<int, std::string> streamed, finish;
  for (size_t i = 0; i + 2 < data.size(); ++i) {
    json c = json::parse(data[i]);
    ASSERT_EQ(c["choices"].size(), 1u);
    const int idx = c["choices"][0]["index"];
    streamed[idx] += c["choices"][0]["delta"].value("content", "");
    if (!c["choices"][0]["finish_reason"].is_null()) finish[idx] = c["choices"][0]["finish_reason"];
  }
  ASSERT_EQ(streamed.size(), 3u);
  ASSERT_EQ(finish.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(streamed[i], a["choices"][size_t(i)]["message"]["content"]) << i;
    EXPECT_EQ(finish[i], a["choices"][size_t(i)]["finish_reason"]) << i;
  }
  json usage = json::parse(data[data.size() - 2])["usage"];
  EXPECT_EQ(usage["completion_tokens"], completion);
  EXPECT_EQ(usage["prompt_tokens"], prompt);
}

TEST_F(ServerFixture, ClientDisconnectCancelsItsGeneration) {
  ASSERT_EQ(state_->running_generations(), 0);
  const int64_t tokens_before = generated_tokens_total(*state_);
  net::io_context ioc;
  {
    tcp::socket sock(ioc);
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "localhost");
    req.set("x-api-key", kKey);
    req.body() = R"({"prompt":"Once upon a time","max_tokens":490,"stream":true,"logit_bias":{"2":-100}})";
    req.prepare_payload();
    http::write(sock, req);
    char buf[256];
    sock.read_some(net::buffer(buf));  // the stream has started
    EXPECT_EQ(state_->running_generations(), 1);
  }  // closed here
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (state_->running_generations() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(state_->running_generations(), 0);
  // Cut short: far fewer than the 490 tokens asked for were generated.
  EXPECT_LT(generated_tokens_total(*state_) - tokens_before, 400);
  expect_good_request_still_works();
}

TEST_F(ServerFixture, WebSocketJsonRpc) {
  namespace websocket = beast::websocket;
  net::io_context ioc;
  websocket::stream<tcp::socket> ws(ioc);
  ws.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
  ws.set_option(websocket::stream_base::decorator([](websocket::request_type& req) {
    req.set(http::field::authorization, std::string("Bearer ") + kKey);
    req.set(http::field::sec_websocket_protocol, "exlagent.v1");
  }));
  websocket::response_type res;
  ws.handshake(res, "127.0.0.1", "/v1/ws");
  EXPECT_EQ(res[http::field::sec_websocket_protocol], "exlagent.v1");
  auto rpc = [&](const std::string& text) {
    ws.text(true);
    ws.write(net::buffer(text));
    beast::flat_buffer b;
    ws.read(b);
    return json::parse(beast::buffers_to_string(b.data()));
  };
  EXPECT_EQ(rpc(R"({"jsonrpc":"2.0","id":1,"method":"server/info"})")["result"]["model"], "stories260K-hf");
  EXPECT_EQ(rpc("not json")["error"]["code"], -32700);
  EXPECT_EQ(rpc(R"({"jsonrpc":"2.0","id":2,"method":"nope"})")["error"]["code"], -32601);
  EXPECT_EQ(rpc(R"({"jsonrpc":"2.0","id":3,"method":"models/list"})")["result"]["data"][0]["id"], "stories260K-hf");
  ws.binary(true);
  ws.write(net::buffer(std::string("\x01\x02")));
  beast::flat_buffer b;
  beast::error_code ec;
  ws.read(b, ec);
  EXPECT_EQ(ec, websocket::error::closed);
  EXPECT_EQ(ws.reason().code, websocket::close_code::bad_payload);

  // Refused handshakes: wrong subprotocol, bad Origin, no key. A good request still works after.
  auto refused = [&](const char* protocol, const char* origin, const char* key) {
    websocket::stream<tcp::socket> w(ioc);
    w.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    w.set_option(websocket::stream_base::decorator([=](websocket::request_type& req) {
      if (*key) req.set(http::field::authorization, std::string("Bearer ") + key);
      if (*protocol) req.set(http::field::sec_websocket_protocol, protocol);
      if (*origin) req.set(http::field::origin, origin);
    }));
    websocket::response_type r;
    beast::error_code e;
    w.handshake(r, "127.0.0.1", "/v1/ws", e);
    EXPECT_TRUE(e);
    return r.result_int();
  };
  EXPECT_EQ(refused("graphql-ws", "", kKey), 400);  // "mcp" is served (runtime/server/ws_mcp.h)
  EXPECT_EQ(refused("exlagent.v1", "https://evil.example", kKey), 403);
  EXPECT_EQ(refused("exlagent.v1", "", ""), 401);
  expect_good_request_still_works();
}

// Issue 28: `serve --host 0.0.0.0` without a key is a usage error (exit 2), found before the
// model is loaded; with a key it gets as far as loading the model.
TEST(ServerCli, NonLoopbackBindWithoutKeyExits2) {
  const std::string missing = (test::temp_dir("ServerCli") / "no-model").string();
  for (const char* host : {"0.0.0.0", "192.168.1.5", "::"}) {
    auto r = test::run_cli(cli_serve, {"--model", missing, "--host", host});
    EXPECT_EQ(r.code, 2) << host << ": " << r.err << r.error;
    EXPECT_NE(r.err.find("refusing to listen on non-loopback address"), std::string::npos) << r.err;
  }
  auto bad = test::run_cli(cli_serve, {"--model", missing, "--host", "example.com"});
  EXPECT_EQ(bad.code, 2) << bad.err << bad.error;
  EXPECT_NE(bad.err.find("is not an IP address"), std::string::npos) << bad.err;
  auto keyed = test::run_cli(cli_serve, {"--model", missing, "--host", "0.0.0.0", "--api-key", "k"});
  EXPECT_EQ(keyed.code, -1) << "expected the missing model to be the error: " << keyed.err;
}

// Issue 28: a page on any web origin could POST text/plain (no CORS preflight) to a keyless server.
TEST(ServerOrigin, KeylessServerRefusesForeignOriginsOnHttp) {
  const auto dir = test::shared_dir() / "models/stories260K-hf";
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << "shared asset missing: " << dir;
  ServerOptions o;
  o.model_dir = dir.string();
  o.port = 0;
  o.cpu_threads = 1;
  o.allowed_origins = {"https://app.example"};
  auto st = std::make_shared<ServerState>(o);
  Server server(st);
  server.start();
  const uint16_t port = server.port();
  auto post = [port](const std::string& origin) {
    net::io_context ioc;
    tcp::socket sock(ioc);
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "127.0.0.1:" + std::to_string(port));
    req.set(http::field::content_type, "text/plain");
    if (!origin.empty()) req.set(http::field::origin, origin);
    req.body() = R"({"prompt":"Once upon a time","max_tokens":2})";
    req.prepare_payload();
    http::write(sock, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(sock, buf, res);
    return std::make_pair(res.result_int(), res.body());
  };
  auto [status, body] = post("http://evil.example");
  EXPECT_EQ(status, 403) << body;
  EXPECT_EQ(json::parse(body)["error"]["code"], "origin_not_allowed") << body;
  EXPECT_EQ(post("http://localhost:" + std::to_string(port + 1)).first, 403);
  EXPECT_EQ(post("http://localhost:" + std::to_string(port)).first, 200);
  EXPECT_EQ(post("https://app.example").first, 200);
  EXPECT_EQ(post("").first, 200);
}

TEST(ServerLifecycle, RefusesNonLoopbackWithoutKeyAndDrainsOnShutdown) {
  const auto dir = test::shared_dir() / "models/stories260K-hf";
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << "shared asset missing: " << dir;
  ServerOptions o;
  o.model_dir = dir.string();
  o.port = 0;
  o.host = "0.0.0.0";
  auto st = std::make_shared<ServerState>(o);
  EXPECT_THROW({ Server refused(st); }, exl::Error);
  o.host = "127.0.0.1";
  o.cpu_threads = 1;
  st = std::make_shared<ServerState>(o);
  Server server(st);
  server.start();
  const uint16_t port = server.port();
  auto pending = std::async(std::launch::async, [port] {
    net::io_context ioc;
    tcp::socket sock(ioc);
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, "localhost");
    req.body() = R"({"prompt":"Once upon a time","max_tokens":300,"temperature":0})";
    req.prepare_payload();
    http::write(sock, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(sock, buf, res);
    return std::make_pair(res.result_int(), res.body());
  });
  while (st->running_generations() == 0 && pending.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
  }
  server.shutdown(std::chrono::seconds(30));
  auto [status, body] = pending.get();
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(json::parse(body)["usage"]["completion_tokens"].get<int64_t>() > 0, true);
  net::io_context ioc;
  tcp::socket sock(ioc);
  beast::error_code ec;
  sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  EXPECT_TRUE(ec) << "still accepting after shutdown";
}

}  // namespace server_test
}  // namespace exl
