#include "runtime/server/ws_session.h"

#include <atomic>
#include <deque>
#include <string>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include "runtime/server/ws_mcp.h"
#include "runtime/server/ws_rpc.h"

namespace exl {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

std::atomic<uint64_t> g_next_peer{1};

class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(tcp::socket&& socket, std::shared_ptr<ServerState> state)
      : ws_(std::move(socket)), message_timer_(ws_.get_executor()), state_(std::move(state)) {
    ++state_->metrics().open_connections;
    peer_.id = g_next_peer++;
  }
  ~WsSession() {
    if (closer_id_) state_->remove_closer(closer_id_);
    end_peer();
    --state_->metrics().open_connections;
  }

  void run(http::request<http::string_body> upgrade) {
    net::dispatch(ws_.get_executor(), [self = shared_from_this(), req = std::move(upgrade)]() mutable {
      self->do_accept(std::move(req));
    });
  }

 private:
  void end_peer() {
    if (peer_ended_) return;
    peer_ended_ = true;
    close_ws_peer(peer_, *state_);
  }

  void do_accept(http::request<http::string_body> req) {
    std::weak_ptr<WsSession> weak = shared_from_this();
    peer_.send = [weak, ex = ws_.get_executor()](std::string frame) {
      net::post(ex, [weak, f = std::move(frame)]() mutable {
        if (auto self = weak.lock()) self->enqueue(std::move(f));
      });
    };
    beast::get_lowest_layer(ws_).expires_never();
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.read_message_max(kMaxWsMessage);
    const std::string_view protocol = choose_ws_subprotocol(req[http::field::sec_websocket_protocol]);
    peer_.mcp = protocol == kWsMcpSubprotocol;
    ws_.set_option(websocket::stream_base::decorator([protocol](websocket::response_type& res) {
      res.set(http::field::server, "exlagent");
      res.set(http::field::sec_websocket_protocol, std::string(protocol));
    }));
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->end_peer();
      std::weak_ptr<WsSession> w = self;
      self->closer_id_ = self->state_->add_closer([w, ex = self->ws_.get_executor()] {
        net::post(ex, [w] {
          if (auto s = w.lock()) s->go_away();
        });
      });
      if (self->state_->draining()) return self->go_away();
      self->do_read();
    });
  }

  // A message is read in two steps so that its deadline starts at its first frame, not while the
  // connection idles between messages: read_some returns with the first part, then the rest must
  // arrive before message_timer_ closes the socket (a client trickling a frame holds it no longer).
  void do_read() {
    buffer_.clear();
    ws_.async_read_some(buffer_, 0, beast::bind_front_handler(&WsSession::on_first_part, shared_from_this()));
  }

  void on_first_part(beast::error_code ec, size_t n) {
    if (ec || ws_.is_message_done()) return on_read(ec, n);
    message_timer_.expires_after(state_->options().ws_message_timeout);
    message_timer_.async_wait([w = weak_from_this()](beast::error_code timer_ec) {
      auto self = w.lock();
      if (!self || timer_ec || self->message_timer_.expiry() > net::steady_timer::clock_type::now()) return;
      beast::get_lowest_layer(self->ws_).close();
    });
    ws_.async_read(buffer_, [self = shared_from_this()](beast::error_code read_ec, size_t read_n) {
      self->message_timer_.expires_at(net::steady_timer::time_point::max());  // a wait already due sees this
      self->on_read(read_ec, read_n);
    });
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec) return end_peer();  // closed, too big (Beast closes with 1009) or broken: the session ends
    if (!ws_.got_text()) return close(websocket::close_code::bad_payload, "binary frames are not supported");
    if (auto reply = handle_rpc_message(beast::buffers_to_string(buffer_.data()), *state_, &peer_))
      enqueue(std::move(*reply));
    if (!closing_) do_read();
  }

  void enqueue(std::string frame) {
    if (closing_ || peer_ended_) return;
    queued_bytes_ += frame.size();
    if (queued_bytes_ > kMaxWsQueueBytes) return close(websocket::close_code::policy_error, "client too slow");
    queue_.push_back(std::move(frame));
    if (queue_.size() == 1) do_write();
  }

  void do_write() {
    ws_.text(true);
    ws_.async_write(net::buffer(queue_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->end_peer();
      self->queued_bytes_ -= self->queue_.front().size();
      self->queue_.pop_front();
      if (!self->queue_.empty()) return self->do_write();
      if (self->going_away_) self->close(websocket::close_code::going_away, "server shutting down");
    });
  }

  // Server shutdown: the frames already queued go out, then a 1001 close frame.
  void go_away() {
    going_away_ = true;
    if (queue_.empty()) close(websocket::close_code::going_away, "server shutting down");
  }

  void close(websocket::close_code code, const char* reason) {
    if (closing_) return;
    closing_ = true;
    end_peer();
    ws_.async_close(websocket::close_reason(code, reason), [self = shared_from_this()](beast::error_code) {});
  }

  websocket::stream<beast::tcp_stream> ws_;
  net::steady_timer message_timer_;  // the deadline of the message being read
  beast::flat_buffer buffer_;
  std::shared_ptr<ServerState> state_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  WsPeer peer_;
  bool peer_ended_ = false;
  bool closing_ = false;
  bool going_away_ = false;
  uint64_t closer_id_ = 0;
};

}  // namespace

void start_ws_session(tcp::socket socket, http::request<http::string_body> upgrade, std::shared_ptr<ServerState> state) {
  std::make_shared<WsSession>(std::move(socket), std::move(state))->run(std::move(upgrade));
}

}  // namespace exl
