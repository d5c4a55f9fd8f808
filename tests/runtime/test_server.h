// A server for a runtime test: its ServerState and a Server listening on 127.0.0.1 at an
// ephemeral port (the options' port is forced to 0), started at construction and stopped (the
// listener closed, work drained) at destruction. test_server_options() holds what the runtime
// tests' servers share, so a test sets only what it is about.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "runtime/server/server.h"
#include "runtime/server/server_state.h"

namespace exl::test {

// `model`, API key `key` (empty: none), 256 cache pages, one CPU thread, port 0.
inline ServerOptions test_server_options(const std::filesystem::path& model, const std::string& key = {}) {
  ServerOptions o;
  o.model_dir = model.string();
  o.port = 0;
  o.api_key = key;
  o.cache_pages = 256;
  o.cpu_threads = 1;
  return o;
}

struct TestServer {
  explicit TestServer(ServerOptions o, std::unique_ptr<Backend> backend = nullptr)
      : state(std::make_shared<ServerState>(with_port_zero(std::move(o)), std::move(backend))), server(state) {
    server.start();
  }
  uint16_t port() const { return server.port(); }

  std::shared_ptr<ServerState> state;
  Server server;

 private:
  static ServerOptions with_port_zero(ServerOptions o) {
    o.port = 0;
    return o;
  }
};

}  // namespace exl::test
