// JSON-RPC 2.0 over the /v1/ws WebSocket (subprotocol exlagent.v1; see docs/websocket-api.md):
// one message per text frame, no batches. This is the pure part: one incoming frame -> the reply
// frame (nullopt for notifications), plus the handshake checks. Any thread.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "runtime/http_message.h"
#include "runtime/server_state.h"

namespace exl {

inline constexpr std::string_view kWsSubprotocol = "exlagent.v1";
inline constexpr std::string_view kWsPath = "/v1/ws";

// JSON-RPC error codes: the standard ones and ours, in MCP's implementation-defined band.
namespace rpc_code {
inline constexpr int parse_error = -32700;
inline constexpr int invalid_request = -32600;
inline constexpr int method_not_found = -32601;
inline constexpr int invalid_params = -32602;
inline constexpr int internal_error = -32603;
inline constexpr int payload_too_large = -32013;
}  // namespace rpc_code

// The reply to one text frame, or nullopt when the frame is a notification (no id) or a response.
std::optional<std::string> handle_rpc_message(std::string_view text, ServerState& state);

// Checks a WebSocket upgrade request for /v1/ws: Host allowlist, Origin (absent, or a loopback or
// allowed host), API key, and the exlagent.v1 subprotocol. nullopt = accept.
std::optional<HttpResponse> check_ws_upgrade(const HttpRequest& request, ServerState& state);

}  // namespace exl
