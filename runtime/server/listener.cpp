#include "runtime/server/listener.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include "kernels/error.h"
#include "runtime/server/http_session.h"

namespace exl {

namespace net = boost::asio;
using tcp = net::ip::tcp;

Listener::Listener(net::io_context& ioc, const tcp::endpoint& endpoint, std::shared_ptr<ServerState> state)
    : ioc_(ioc), acceptor_(net::make_strand(ioc)), state_(std::move(state)) {
  boost::system::error_code ec;
  auto check = [&](const char* what) {
    if (ec)
      fail("runtime: server: cannot ", what, " ", endpoint.address().to_string(), ":", endpoint.port(), ": ",
           ec.message());
  };
  acceptor_.open(endpoint.protocol(), ec);
  check("open");
  acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  check("configure");
  acceptor_.bind(endpoint, ec);
  check("bind");
  acceptor_.listen(net::socket_base::max_listen_connections, ec);
  check("listen on");
  port_ = acceptor_.local_endpoint().port();
}

void Listener::run() { net::dispatch(acceptor_.get_executor(), [self = shared_from_this()] { self->do_accept(); }); }

void Listener::stop() {
  net::post(acceptor_.get_executor(), [self = shared_from_this()] {
    boost::system::error_code ignored;
    self->acceptor_.close(ignored);
  });
}

void Listener::do_accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [self = shared_from_this()](boost::system::error_code ec, tcp::socket s) {
    self->on_accept(ec, std::move(s));
  });
}

void Listener::on_accept(boost::system::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
  if (!ec) start_http_session(std::move(socket), state_);
  do_accept();
}

}  // namespace exl
