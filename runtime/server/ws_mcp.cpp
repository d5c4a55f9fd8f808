#include "runtime/server/ws_mcp.h"

#include <algorithm>

#include "runtime/server/session_hub.h"
#include "runtime/server/ws_rpc.h"

namespace exl {

namespace {

using Json = nlohmann::ordered_json;

std::string ws_mcp_frame(Json frame) {
  frame["jsonrpc"] = "2.0";
  return frame.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ws_mcp_error(const Json& id, int code, const std::string& message) {
  return ws_mcp_frame({{"id", id}, {"error", {{"code", code}, {"message", message}}}});
}

}  // namespace

std::optional<std::string> handle_ws_mcp_message(const std::string& method, const Json& id, bool has_id,
                                                 const Json& params, ServerState& state, WsPeer& peer) {
  if (!has_id) return std::nullopt;  // notifications/initialized, notifications/cancelled, ...
  if (method == "ping") return ws_mcp_frame({{"id", id}, {"result", Json::object()}});
  if (method == "initialize") {
    static const char* const versions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};
    std::string version = versions[0];
    if (auto v = params.find("protocolVersion"); v != params.end() && v->is_string() &&
                                                   std::find(std::begin(versions), std::end(versions), *v) != std::end(versions))
      version = v->get<std::string>();
    peer.mcp_initialized = true;
    return ws_mcp_frame({{"id", id},
                         {"result",
                          {{"protocolVersion", version},
                           {"capabilities", {{"tools", {{"listChanged", false}}}}},
                           {"serverInfo", {{"name", "exlagent"}, {"version", "0.1.0"}}},
                           {"instructions", "The tools of this exlagent server: its built-ins and its --mcp servers' tools."}}}});
  }
  if (!peer.mcp_initialized)
    return ws_mcp_error(id, rpc_code::invalid_request, cat("Invalid Request: '", method, "' before initialize"));
  if (method == "tools/list") {
    Json tools = Json::array();
    for (const auto& t : state.sessions().server_tools())
      tools.push_back({{"name", t.name}, {"description", t.description}, {"inputSchema", t.input_schema}});
    return ws_mcp_frame({{"id", id}, {"result", {{"tools", std::move(tools)}}}});
  }
  if (method == "tools/call") {
    if (!params.contains("name") || !params["name"].is_string())
      return ws_mcp_error(id, rpc_code::invalid_params, "Invalid params: 'name' (a string) is required");
    const nlohmann::json args = nlohmann::json::parse(params.value("arguments", Json::object()).dump());
    if (!args.is_object()) return ws_mcp_error(id, rpc_code::invalid_params, "Invalid params: 'arguments' must be an object");
    const std::string name = params["name"];
    const bool known = state.sessions().call_server_tool(name, args, kWsMcpCallTimeout, [send = peer.send, id](ToolResult r) {
      send(ws_mcp_frame({{"id", id},
                         {"result", {{"content", Json::array({{{"type", "text"}, {"text", r.content}}})}, {"isError", r.is_error}}}}));
    });
    if (!known) return ws_mcp_error(id, rpc_code::invalid_params, cat("Unknown tool: ", name));
    return std::nullopt;
  }
  return ws_mcp_error(id, rpc_code::method_not_found, cat("Method not found: '", method, "'"));
}

}  // namespace exl
