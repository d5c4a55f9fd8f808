#include "runtime/ws_session.h"

#include <deque>
#include <string>

#include <boost/asio/dispatch.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include "runtime/ws_rpc.h"

namespace exl {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(tcp::socket&& socket, std::shared_ptr<ServerState> state) : ws_(std::move(socket)), state_(std::move(state)) {
    ++state_->metrics().open_connections;
  }
  ~WsSession() { --state_->metrics().open_connections; }

  void run(http::request<http::string_body> upgrade) {
    net::dispatch(ws_.get_executor(), [self = shared_from_this(), req = std::move(upgrade)]() mutable {
      self->do_accept(std::move(req));
    });
  }

 private:
  void do_accept(http::request<http::string_body> req) {
    beast::get_lowest_layer(ws_).expires_never();
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.read_message_max(kMaxWsMessage);
    ws_.set_option(websocket::stream_base::decorator([](websocket::response_type& res) {
      res.set(http::field::server, "exlagent");
      res.set(http::field::sec_websocket_protocol, std::string(kWsSubprotocol));
    }));
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->do_read();
    });
  }

  void do_read() {
    buffer_.clear();
    ws_.async_read(buffer_, beast::bind_front_handler(&WsSession::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec) return;  // closed, too big (Beast closes with 1009) or broken: the session ends
    if (!ws_.got_text()) return close(websocket::close_code::bad_payload, "binary frames are not supported");
    if (state_->draining()) return close(websocket::close_code::going_away, "server shutting down");
    if (auto reply = handle_rpc_message(beast::buffers_to_string(buffer_.data()), *state_)) {
      if (queue_.size() >= kMaxWsQueue) return close(websocket::close_code::policy_error, "client too slow");
      queue_.push_back(std::move(*reply));
      if (queue_.size() == 1) do_write();
    }
    do_read();
  }

  void do_write() {
    ws_.text(true);
    ws_.async_write(net::buffer(queue_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return;
      self->queue_.pop_front();
      if (!self->queue_.empty()) self->do_write();
    });
  }

  void close(websocket::close_code code, const char* reason) {
    ws_.async_close(websocket::close_reason(code, reason), [self = shared_from_this()](beast::error_code) {});
  }

  websocket::stream<beast::tcp_stream> ws_;
  beast::flat_buffer buffer_;
  std::shared_ptr<ServerState> state_;
  std::deque<std::string> queue_;
};

}  // namespace

void start_ws_session(tcp::socket socket, http::request<http::string_body> upgrade, std::shared_ptr<ServerState> state) {
  std::make_shared<WsSession>(std::move(socket), std::move(state))->run(std::move(upgrade));
}

}  // namespace exl
