// Accepts TCP connections on one endpoint and starts an HttpSession for each, on its own strand.
// Lifetime: shared_ptr held by its pending accept; stop() closes the acceptor (any thread).
#pragma once
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "runtime/server/server_state.h"

namespace exl {

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  // Binds and listens; throws exl::Error naming the endpoint when that fails.
  Listener(boost::asio::io_context& ioc, const boost::asio::ip::tcp::endpoint& endpoint,
           std::shared_ptr<ServerState> state);
  void run();
  void stop();
  uint16_t port() const { return port_; }

 private:
  void do_accept();
  void on_accept(boost::system::error_code ec, boost::asio::ip::tcp::socket socket);

  boost::asio::io_context& ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::shared_ptr<ServerState> state_;
  uint16_t port_ = 0;
};

}  // namespace exl
