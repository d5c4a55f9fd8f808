// A WebSocket tool client for exlagent in C++ (Boost.Beast + nlohmann/json, no exlagent headers):
// the same conversation as client.mjs. It registers a `get_weather` tool, opens an agent session
// that may call it, asks a question, answers the runtime's tools/call requests and prints the
// session's tool calls and final answer.
//
//   ws_tool_client [--host 127.0.0.1] [--port 8421] [--key KEY] [--question TEXT]
//
// Exit status 0 when the session ends with a final answer, 1 otherwise.
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>

namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = boost::asio::ip::tcp;
using json = nlohmann::json;

namespace {

struct Options {
  std::string host = "127.0.0.1";
  std::string port = "8421";
  std::string key;
  std::string question = "What is the weather like in Oslo?";
};

Options parse_options(int argc, char** argv) {
  Options o;
  if (const char* k = std::getenv("EXLAGENT_API_KEY")) o.key = k;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--host") o.host = value;
    else if (flag == "--port") o.port = value;
    else if (flag == "--key") o.key = value;
    else if (flag == "--question") o.question = value;
    else throw std::runtime_error("unknown option " + flag);
  }
  return o;
}

// The tool's data: a fixed table, so the example's output is reproducible.
json get_weather(const json& arguments) {
  static const std::map<std::string, std::pair<int, std::string>> table = {
      {"Oslo", {4, "cloudy"}}, {"Lisbon", {21, "sunny"}}, {"Tokyo", {12, "rainy"}}};
  const std::string city = arguments.value("city", "");
  const auto it = table.find(city);
  if (it == table.end())
    return {{"content", {{{"type", "text"}, {"text", "no weather data for '" + city + "'"}}}}, {"isError", true}};
  const std::string text = "{\"city\": \"" + city + "\", \"temperature_c\": " + std::to_string(it->second.first) +
                           ", \"sky\": \"" + it->second.second + "\"}";
  return {{"content", {{{"type", "text"}, {"text", text}}}}, {"isError", false}};
}

// A JSON-RPC peer over one WebSocket: call() sends a request and reads until its response,
// answering the runtime's tools/call requests and handing notifications to on_event meanwhile.
class Peer {
 public:
  Peer(const Options& o) : ws_(ioc_) {
    tcp::resolver resolver(ioc_);
    boost::asio::connect(ws_.next_layer(), resolver.resolve(o.host, o.port));
    ws_.set_option(websocket::stream_base::decorator([&o](websocket::request_type& req) {
      req.set(beast::http::field::sec_websocket_protocol, "exlagent.v1");
      if (!o.key.empty()) req.set(beast::http::field::authorization, "Bearer " + o.key);
    }));
    ws_.handshake(o.host + ":" + o.port, "/v1/ws");
  }

  json call(const std::string& method, json params) {
    const int id = next_id_++;
    send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}});
    for (;;) {
      json msg = read();
      if (!msg.contains("method") && msg.value("id", -1) == id) {
        if (msg.contains("error")) throw std::runtime_error(method + ": " + msg["error"].value("message", ""));
        return msg["result"];
      }
      dispatch(msg);
    }
  }

  // Handles incoming messages until on_event returns false.
  template <class F>
  void run(F on_event) {
    for (;;) {
      json msg = read();
      if (msg.value("method", "") == "sessions/event" && !on_event(msg["params"])) return;
      dispatch(msg);
    }
  }

  void close() { ws_.close(websocket::close_code::normal); }

 private:
  void send(const json& j) { ws_.write(boost::asio::buffer(j.dump())); }

  json read() {
    beast::flat_buffer buf;
    ws_.read(buf);
    return json::parse(beast::buffers_to_string(buf.data()));
  }

  void dispatch(const json& msg) {
    if (msg.value("method", "") != "tools/call") return;
    const json& p = msg["params"];
    json result = p.value("name", "") == "get_weather"
                      ? get_weather(p.value("arguments", json::object()))
                      : json{{"content", {{{"type", "text"}, {"text", "unknown tool"}}}}, {"isError", true}};
    send({{"jsonrpc", "2.0"}, {"id", msg["id"]}, {"result", std::move(result)}});
  }

  boost::asio::io_context ioc_;
  websocket::stream<tcp::socket> ws_;
  int next_id_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse_options(argc, argv);
    Peer peer(o);
    const json tool = {{"name", "get_weather"},
                       {"description", "Current weather in a city"},
                       {"inputSchema",
                        {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}};
    peer.call("tools/register", {{"tools", {tool}}});
    const json session = peer.call("sessions/create", {{"system", "You are a helpful assistant."},
                                                       {"tools", {"get_weather"}},
                                                       {"maxTokens", 96},
                                                       {"sampling", {{"temperature", 0}}}});
    const std::string sid = session["sessionId"];
    peer.call("sessions/send", {{"sessionId", sid}, {"content", o.question}});
    int status = 1;
    peer.run([&](const json& e) {
      if (e.value("sessionId", "") != sid) return true;
      const std::string type = e.value("type", "");
      if (type == "tool_call") std::cout << "tool_call " << e["name"].get<std::string>() << " " << e["arguments"].dump() << "\n";
      if (type == "tool_result")
        std::cout << "tool_result " << (e.value("isError", false) ? "(error) " : "") << e.value("content", "") << "\n";
      if (type == "error") std::cerr << "error: " << e.value("message", "") << "\n";
      if (type != "done") return true;
      if (e.value("reason", "") == "final") {
        std::cout << "answer: " << e.value("content", "") << "\n";
        status = 0;
      } else {
        std::cerr << "session ended: " << e.value("reason", "") << "\n";
      }
      return false;
    });
    peer.close();
    return status;
  } catch (const std::exception& e) {
    std::cerr << "client: " << e.what() << "\n";
    return 1;
  }
}
