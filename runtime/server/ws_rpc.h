// JSON-RPC 2.0 over the /v1/ws WebSocket (subprotocol exlagent.v1; see docs/websocket-api.md):
// one message per text frame, no batches. This part has no sockets: one incoming frame -> the
// reply frame (nullopt for notifications and responses), plus the handshake checks. Session and
// tool methods act through a WsPeer (the connection's outgoing channel and identity); without
// one they answer -32601. Any thread; one connection's frames are handled one at a time.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/http_message.h"
#include "runtime/server/remote_tool.h"
#include "runtime/server/rpc_error.h"
#include "runtime/server/server_state.h"

namespace exl {

inline constexpr std::string_view kWsSubprotocol = "exlagent.v1";
inline constexpr std::string_view kWsPath = "/v1/ws";

// Per-message limits of one connection: at most kWsMaxMessagesPerSecond frames in any one-second
// window (more are answered -32012 and dropped), and sessions/send content up to
// kWsMaxContentBytes or the server's max_prompt_bytes, whichever is smaller (-32013).
inline constexpr int kWsMaxMessagesPerSecond = 256;
inline constexpr size_t kWsMaxContentBytes = 1u << 20;

// One connection as the RPC layer sees it.
struct WsPeer {
  uint64_t id = 0;                                 // owner id of its sessions and tools
  std::function<void(std::string frame)> send;     // thread-safe, non-blocking
  std::shared_ptr<ToolClientLink> link;            // made by the first tools/register
  bool mcp = false;                                // chose the "mcp" subprotocol (runtime/server/ws_mcp.h)
  bool mcp_initialized = false;
  std::chrono::steady_clock::time_point window_start{};
  int window_count = 0;
};

// The reply to one text frame, or nullopt when the frame is a notification (no id) or a response.
std::optional<std::string> handle_rpc_message(std::string_view text, ServerState& state, WsPeer* peer = nullptr);
// The connection is gone: closes its sessions, fails its tools' pending calls, drops its tools.
void close_ws_peer(WsPeer& peer, ServerState& state);

// Checks a WebSocket upgrade request for /v1/ws: Host and Origin (check_request_source, as for
// every HTTP route), API key, and the exlagent.v1 or mcp subprotocol. nullopt = accept.
std::optional<HttpResponse> check_ws_upgrade(const HttpRequest& request, ServerState& state);
// The subprotocol to answer a Sec-WebSocket-Protocol header with: exlagent.v1 when offered, else
// mcp when offered, else "".
std::string_view choose_ws_subprotocol(std::string_view header);

}  // namespace exl
