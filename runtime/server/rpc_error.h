// The JSON-RPC errors of /v1/ws (docs/websocket-api.md): every code the server answers with, the
// standard ones and ours (in MCP's implementation-defined band), and RpcError, which carries one
// from where a client's request failed (the session hub, the RPC methods) to the reply.
#pragma once
#include <stdexcept>
#include <string>

namespace exl {

struct RpcError : std::runtime_error {
  RpcError(int code_, const std::string& message) : std::runtime_error(message), code(code_) {}
  int code;
};

namespace rpc_code {
inline constexpr int parse_error = -32700;
inline constexpr int invalid_request = -32600;
inline constexpr int method_not_found = -32601;
inline constexpr int invalid_params = -32602;
inline constexpr int internal_error = -32603;
inline constexpr int session_gone = -32011;
inline constexpr int rate_limited = -32012;
inline constexpr int payload_too_large = -32013;
inline constexpr int session_limit = -32014;
inline constexpr int session_busy = -32015;
inline constexpr int tool_conflict = -32016;
inline constexpr int shutting_down = -32017;
}  // namespace rpc_code

}  // namespace exl
