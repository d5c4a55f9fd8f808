// A blocking Beast WebSocket JSON-RPC client for the /v1/ws tests: requests wait for their
// response while notifications and server requests (tools/call) are kept in arrival order.
#pragma once
#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>

namespace exl::test {

class WsTestClient {
 public:
  using json = nlohmann::json;
  using ms = std::chrono::milliseconds;

  WsTestClient(uint16_t port, const std::string& key) : ws_(ioc_) {
    boost::beast::get_lowest_layer(ws_).connect(
        boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
    ws_.set_option(boost::beast::websocket::stream_base::decorator([key](boost::beast::websocket::request_type& r) {
      r.set(boost::beast::http::field::sec_websocket_protocol, "exlagent.v1");
      r.set(boost::beast::http::field::authorization, "Bearer " + key);
    }));
    ws_.handshake("127.0.0.1", "/v1/ws");
  }

  void send_text(const std::string& text) {
    ws_.text(true);
    ws_.write(boost::asio::buffer(text));
  }
  void send(const json& j) { send_text(j.dump()); }

  // The next frame, or nullopt after `timeout` (the stream is then unusable) or on close.
  std::optional<json> read(ms timeout = ms(20000)) {
    if (broken_) return std::nullopt;
    boost::beast::flat_buffer b;
    bool done = false;
    boost::beast::error_code ec;
    ws_.async_read(b, [&](boost::beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
    ioc_.restart();
    ioc_.run_for(timeout);
    if (!done) {
      broken_ = true;
      boost::beast::get_lowest_layer(ws_).cancel();
      ioc_.restart();
      ioc_.run();
      return std::nullopt;
    }
    if (ec) {
      broken_ = true;
      last_error_ = ec;
      return std::nullopt;
    }
    return json::parse(boost::beast::buffers_to_string(b.data()));
  }

  // Sends a request and returns its response; other frames are kept for next().
  json call(const std::string& method, const json& params = json::object()) {
    const int id = next_id_++;
    send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
    for (;;) {
      auto f = read();
      if (!f) return json{{"transport_error", last_error_.message()}};
      if (f->contains("id") && (*f)["id"] == id && !f->contains("method")) return *f;
      kept_.push_back(std::move(*f));
    }
  }

  // Sends a request frame verbatim (its id must be an integer) and returns its response.
  json call_raw(const std::string& frame) {
    const json id = json::parse(frame)["id"];
    send_text(frame);
    for (;;) {
      auto f = read();
      if (!f) return json{{"transport_error", last_error_.message()}};
      if (f->contains("id") && (*f)["id"] == id && !f->contains("method")) return *f;
      kept_.push_back(std::move(*f));
    }
  }

  // The next notification or server request (kept ones first).
  std::optional<json> next(ms timeout = ms(20000)) {
    if (!kept_.empty()) {
      json j = std::move(kept_.front());
      kept_.pop_front();
      return j;
    }
    return read(timeout);
  }

  // The next frame whose method is `method` (and, for session events, whose type is `type`),
  // skipping others; nullopt on timeout.
  std::optional<json> next_of(const std::string& method, const std::string& type = {}, ms timeout = ms(20000)) {
    for (;;) {
      auto f = next(timeout);
      if (!f) return std::nullopt;
      seen_.push_back(*f);
      if (f->value("method", "") != method) continue;
      if (!type.empty() && (*f)["params"].value("type", "") != type) continue;
      return f;
    }
  }

  void close() {
    boost::beast::error_code ec;
    ws_.close(boost::beast::websocket::close_code::normal, ec);
  }
  // Writes bytes straight to the TCP socket, under the WebSocket framing (a slow or broken peer).
  void write_raw(std::string_view bytes) {
    boost::asio::write(boost::beast::get_lowest_layer(ws_).socket(), boost::asio::buffer(bytes.data(), bytes.size()));
  }
  // Drops the TCP connection without a close handshake.
  void drop() {
    boost::beast::error_code ec;
    boost::beast::get_lowest_layer(ws_).socket().close(ec);
  }
  boost::beast::error_code last_error() const { return last_error_; }
  boost::beast::websocket::close_reason close_reason() const { return ws_.reason(); }
  const std::deque<json>& seen() const { return seen_; }
  void clear_seen() { seen_.clear(); }

 private:
  boost::asio::io_context ioc_;
  boost::beast::websocket::stream<boost::beast::tcp_stream> ws_;
  std::deque<json> kept_, seen_;
  int next_id_ = 1;
  bool broken_ = false;
  boost::beast::error_code last_error_;
};

}  // namespace exl::test
