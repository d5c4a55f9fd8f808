// The MCP server side of /v1/ws: a connection that chose the WebSocket subprotocol "mcp" (what the
// MCP TypeScript SDK's WebSocketClientTransport asks for) speaks the MCP lifecycle instead of
// exlagent.v1 — initialize (protocol "2025-06-18"; "2025-03-26" and "2024-11-05" are answered as
// asked), notifications/initialized, ping, tools/list and tools/call over the server's own tools
// (the built-ins and the --mcp servers' NAME__tool), each call under kWsMcpCallTimeout. Before
// initialize only ping is served (-32600 otherwise); an unknown tool is -32602; a tool's failure
// is an isError result. Calls are answered when they finish, through the peer's send; a client's
// notifications/cancelled is not acted on (the call runs to its end or its timeout).
#pragma once
#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/server/server_state.h"

namespace exl {

struct WsPeer;

inline constexpr std::string_view kWsMcpSubprotocol = "mcp";
inline constexpr std::chrono::milliseconds kWsMcpCallTimeout{60000};

// One request or notification of an MCP peer (a JSON-RPC 2.0 object already checked by
// handle_rpc_message); the reply frame, or nullopt for notifications and for tools/call, whose
// reply is sent later.
std::optional<std::string> handle_ws_mcp_message(const std::string& method, const nlohmann::ordered_json& id, bool has_id,
                                                 const nlohmann::ordered_json& params, ServerState& state, WsPeer& peer);

}  // namespace exl
