#include "runtime/server/server.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/signal_set.hpp>

#include "kernels/error.h"
#include "runtime/server/listener.h"
#include "runtime/server/session_hub.h"

namespace exl {

namespace net = boost::asio;

constexpr auto kCloseTimeout = std::chrono::seconds(2);

struct Server::Impl {
  std::shared_ptr<ServerState> state;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::shared_ptr<Listener> listener;
  std::vector<std::thread> threads;
  bool stopped = false;
};

namespace {

net::ip::address bind_address(const ServerOptions& o, boost::system::error_code& ec) {
  return net::ip::make_address(o.host == "localhost" ? "127.0.0.1" : o.host, ec);
}

}  // namespace

std::string bind_address_problem(const ServerOptions& o) {
  boost::system::error_code ec;
  const auto addr = bind_address(o, ec);
  if (ec) return cat("runtime: server: --host '", o.host, "' is not an IP address");
  if (!addr.is_loopback() && o.api_key.empty())
    return cat("runtime: server: refusing to listen on non-loopback address '", o.host,
               "' without an API key: anyone who can reach it could use the model and its tools "
               "(give --api-key or --api-key-file, or listen on 127.0.0.1)");
  return {};
}

Server::Server(std::shared_ptr<ServerState> state) : impl_(std::make_unique<Impl>()) {
  impl_->state = std::move(state);
  const auto& o = impl_->state->options();
  const std::string problem = bind_address_problem(o);
  EXL_CHECK(problem.empty(), problem);
  boost::system::error_code ec;
  const auto addr = bind_address(o, ec);
  impl_->listener = std::make_shared<Listener>(impl_->ioc, net::ip::tcp::endpoint(addr, o.port), impl_->state);
  impl_->state->set_bound_port(impl_->listener->port());
}

Server::~Server() { shutdown(std::chrono::seconds(0)); }

uint16_t Server::port() const { return impl_->listener->port(); }

void Server::start() {
  impl_->state->generator().start();
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->listener->run();
  const int n = std::max(1, impl_->state->options().io_threads);
  for (int i = 0; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void Server::run_until_signal(std::chrono::seconds drain_timeout) {
  net::io_context sig_ioc;
  net::signal_set signals(sig_ioc, SIGINT, SIGTERM);
  signals.async_wait([](boost::system::error_code, int) {});
  sig_ioc.run();
  shutdown(drain_timeout);
}

void Server::shutdown(std::chrono::seconds drain_timeout) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->listener->stop();
  impl_->state->begin_drain();
  const auto deadline = std::chrono::steady_clock::now() + drain_timeout;
  auto busy = [&] { return impl_->state->running_generations() > 0 || impl_->state->sessions().running_sessions() > 0; };
  while (busy() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  impl_->state->sessions().settle();
  impl_->state->close_connections();
  const auto close_deadline = std::chrono::steady_clock::now() + kCloseTimeout;
  while (impl_->state->open_closers() > 0 && std::chrono::steady_clock::now() < close_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the last responses go out
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  impl_->state->generator().stop();
  impl_->state->sessions().shutdown();
}

}  // namespace exl
