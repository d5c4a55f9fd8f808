// The HTTP server: a listener on options.host:port, an io_context run by options.io_threads
// threads, and the Generator's engine thread. Graceful shutdown stops accepting, refuses new
// generations (503) and new WebSocket requests (-32017), waits for running generations and agent
// runs to finish (up to a deadline), sends WebSocket clients their queued frames (a run's done
// event included) and a 1001 close frame (up to 2 s more), then stops.
// Thread-safety: construct, start and shut down from one thread; port() from any.
#pragma once
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/server/server_state.h"

namespace exl {

class Listener;

// Why options.host may not be listened on, or "" when it may: it must be an IP address (or
// "localhost"), and a non-loopback one needs an API key. `serve` checks this before loading the
// model and exits 2; the Server constructor enforces it too.
std::string bind_address_problem(const ServerOptions& options);

class Server {
 public:
  // Binds (port 0 picks a free port). Refuses a non-loopback host without an API key and
  // throws exl::Error for that and for bind failures.
  explicit Server(std::shared_ptr<ServerState> state);
  ~Server();

  uint16_t port() const;
  void start();
  // Blocks until SIGINT or SIGTERM, then shuts down.
  void run_until_signal(std::chrono::seconds drain_timeout = std::chrono::seconds(30));
  // Drains and stops; idempotent.
  void shutdown(std::chrono::seconds drain_timeout = std::chrono::seconds(30));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace exl
