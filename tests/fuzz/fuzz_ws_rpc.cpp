// Fuzz target: WebSocket JSON-RPC frames (runtime/server/ws_rpc.h). Each input is one text frame from a
// fresh connection (a WsPeer whose outgoing frames are dropped), handled against a model whose
// generator never starts, then the connection closes. handle_rpc_message answers every frame
// with a reply or nothing; it never throws.
#include "fuzz/fuzz_server.h"
#include "runtime/server/ws_rpc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  exl::ServerState* state = exl::fuzz::fuzz_server_state();
  if (!state) return 0;
  static uint64_t next_peer = 1;
  exl::WsPeer peer;
  peer.id = next_peer++;
  peer.send = [](std::string) {};
  auto reply = exl::handle_rpc_message(exl::fuzz::as_text(data, size), *state, &peer);
  (void)reply;
  exl::close_ws_peer(peer, *state);
  return 0;
}
