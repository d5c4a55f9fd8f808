#include "runtime/server/ws_rpc.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "runtime/openai/api_error.h"
#include "runtime/json_depth.h"
#include "runtime/server/router.h"
#include "runtime/server/session_hub.h"
#include "runtime/server/ws_mcp.h"

namespace exl {

namespace {

using Json = nlohmann::ordered_json;  // keeps a finalAnswerSchema's property order

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string rpc_error(const Json& id, int code, const std::string& message) {
  return dump({{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}});
}

std::string rpc_result(const Json& id, Json result) {
  return dump({{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
}

bool offers_subprotocol(std::string_view header, std::string_view wanted) {
  size_t pos = 0;
  while (pos <= header.size()) {
    size_t end = header.find(',', pos);
    if (end == std::string::npos) end = header.size();
    std::string_view item(header.data() + pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item == wanted) return true;
    pos = end + 1;
  }
  return false;
}

std::string session_param(const Json& params) {
  if (!params.is_object() || !params.contains("sessionId") || !params["sessionId"].is_string())
    throw RpcError(rpc_code::invalid_params, "Invalid params: 'sessionId' (a string) is required");
  return params["sessionId"];
}

AgentSink event_sink(WsPeer& peer, std::shared_ptr<std::string> sid) {
  return [send = peer.send, sid](const AgentEvent& e) {
    Json params = e.data;
    params["sessionId"] = *sid;
    params["type"] = e.type;
    send(dump({{"jsonrpc", "2.0"}, {"method", "sessions/event"}, {"params", std::move(params)}}));
  };
}

Json create_session(const Json& params, ServerState& state, WsPeer& peer) {
  AgentConfig config;
  try {
    config = agent_config_from_json(params);
  } catch (const Error& e) {
    throw RpcError(rpc_code::invalid_params, cat("Invalid params: ", e.what()));
  }
  std::vector<std::string> mcp_servers;
  if (params.contains("mcpServers") && !params["mcpServers"].is_null()) {
    const Json& m = params["mcpServers"];
    const bool ok = m.is_array() && std::all_of(m.begin(), m.end(), [](const Json& n) { return n.is_string(); });
    if (!ok) throw RpcError(rpc_code::invalid_params, "Invalid params: 'mcpServers' must be an array of names");
    for (const auto& n : m) mcp_servers.push_back(n.get<std::string>());
  }
  auto sid = std::make_shared<std::string>();
  auto session = state.sessions().create(std::move(config), event_sink(peer, sid), peer.id, mcp_servers);
  *sid = session->id();
  return {{"sessionId", session->id()}, {"tools", session->config().tools}};
}

Json send_message(const Json& params, ServerState& state, WsPeer& peer) {
  const std::string id = session_param(params);
  if (!params.contains("content") || !params["content"].is_string())
    throw RpcError(rpc_code::invalid_params, "Invalid params: 'content' (a string) is required");
  const size_t limit = std::min(kWsMaxContentBytes, state.options().max_prompt_bytes);
  if (params["content"].get_ref<const std::string&>().size() > limit)
    throw RpcError(rpc_code::payload_too_large, cat("Payload too large: 'content' exceeds ", limit, " bytes"));
  auto session = state.sessions().find(id, peer.id);
  if (!session->send(params["content"].get<std::string>()))
    throw RpcError(rpc_code::session_busy, cat("Session '", id, "' is still running; wait for its done event or cancel it"));
  return {{"accepted", true}};
}

Json register_tools(const Json& params, ServerState& state, WsPeer& peer) {
  if (!params.is_object() || !params.contains("tools") || !params["tools"].is_array())
    throw RpcError(rpc_code::invalid_params, "Invalid params: 'tools' (an array of MCP Tool objects) is required");
  std::vector<ToolSpec> specs;
  Json names = Json::array();
  for (const auto& t : params["tools"]) {
    try {
      specs.push_back(parse_remote_tool_spec(t));
    } catch (const Error& e) {
      throw RpcError(rpc_code::invalid_params, cat("Invalid params: ", e.what()));
    }
    names.push_back(specs.back().name);
  }
  if (!peer.link) peer.link = std::make_shared<ToolClientLink>(peer.send, state.sessions().executor());
  state.sessions().register_tools(std::move(specs), peer.link, peer.id);
  return {{"tools", names}};
}

std::optional<Json> peer_method(const std::string& method, const Json& params, ServerState& state, WsPeer& peer) {
  if (method == "sessions/create") return create_session(params, state, peer);
  if (method == "sessions/send") return send_message(params, state, peer);
  if (method == "sessions/cancel") {
    auto session = state.sessions().find(session_param(params), peer.id);
    const bool running = session->running();
    session->cancel();
    return Json{{"cancelled", running}};
  }
  if (method == "sessions/close") {
    state.sessions().close(session_param(params), peer.id);
    return Json::object();
  }
  if (method == "sessions/resume") {
    auto sid = std::make_shared<std::string>(session_param(params));
    auto session = state.sessions().resume(*sid, event_sink(peer, sid), peer.id);
    return Json{{"sessionId", session->id()}, {"messages", messages_to_json(session->messages())}};
  }
  if (method == "tools/register") return register_tools(params, state, peer);
  if (method == "tools/list") {
    Json names = state.sessions().tool_names();
    Json mcp = Json::array();
    for (const auto& t : state.sessions().mcp_tools())
      mcp.push_back({{"name", t.name}, {"description", t.description}, {"inputSchema", t.input_schema}});
    return Json{{"tools", names}, {"mcp", std::move(mcp)}, {"mcpSession", state.sessions().session_mcp_servers()}};
  }
  return std::nullopt;
}

bool over_rate(WsPeer& peer) {
  const auto now = std::chrono::steady_clock::now();
  if (now - peer.window_start >= std::chrono::seconds(1)) {
    peer.window_start = now;
    peer.window_count = 0;
  }
  return ++peer.window_count > kWsMaxMessagesPerSecond;
}

// The id to answer a request frame with: its own when it is a request with a valid id, else null.
Json request_id(const Json& msg) {
  if (!msg.is_object() || !msg.contains("method") || !msg.contains("id")) return nullptr;
  const Json& id = msg["id"];
  return id.is_string() || id.is_number_integer() ? id : Json(nullptr);
}

}  // namespace

std::optional<std::string> handle_rpc_message(std::string_view text, ServerState& state, WsPeer* peer) {
  Json msg = Json::parse(text.begin(), text.end(), nullptr, false);
  if (peer && over_rate(*peer))
    return rpc_error(msg.is_discarded() ? Json(nullptr) : request_id(msg), rpc_code::rate_limited,
                     cat("Rate limited: more than ", kWsMaxMessagesPerSecond, " messages in one second; message dropped"));
  if (msg.is_discarded()) return rpc_error(nullptr, rpc_code::parse_error, "Parse error: the frame is not valid JSON");
  if (json_too_deep(msg))
    return rpc_error(nullptr, rpc_code::invalid_request, cat("Invalid Request: nested deeper than ", kMaxJsonDepth, " levels"));
  if (msg.is_array())
    return rpc_error(nullptr, rpc_code::invalid_request, "Invalid Request: JSON-RPC batches are not supported");
  if (!msg.is_object() || !msg.contains("jsonrpc") || msg["jsonrpc"] != "2.0")
    return rpc_error(nullptr, rpc_code::invalid_request, "Invalid Request: expected a JSON-RPC 2.0 object");
  const bool has_id = msg.contains("id");
  const Json id = has_id ? msg["id"] : Json(nullptr);
  if (has_id && !id.is_string() && !id.is_number_integer() && !id.is_null())
    return rpc_error(nullptr, rpc_code::invalid_request, "Invalid Request: id must be a string or an integer");
  if (!msg.contains("method")) {  // a response to one of our tools/call requests
    if (peer && peer->link) peer->link->on_response(msg);
    return std::nullopt;
  }

  if (state.draining() && has_id)
    return rpc_error(id, rpc_code::shutting_down, "Server shutting down: running sessions finish, no new requests");
  if (!msg["method"].is_string())
    return rpc_error(id, rpc_code::invalid_request, "Invalid Request: method must be a string");
  const std::string method = msg["method"];
  if (msg.contains("params") && !msg["params"].is_object() && !msg["params"].is_array())
    return has_id ? std::optional(rpc_error(id, rpc_code::invalid_params, "Invalid params: must be an object"))
                  : std::nullopt;
  const Json params = msg.value("params", Json::object());
  if (peer && peer->mcp) {
    if (!params.is_object())
      return has_id ? std::optional(rpc_error(id, rpc_code::invalid_params, "Invalid params: must be an object"))
                    : std::nullopt;
    return handle_ws_mcp_message(method, id, has_id, params, state, *peer);
  }
  if (!has_id) {
    if (method == "notifications/progress" && peer && peer->link) peer->link->on_progress(params);
    return std::nullopt;
  }

  if (method == "server/info")
    return rpc_result(id, {{"name", "exlagent"},
                           {"version", "0.1.0"},
                           {"protocol", kWsSubprotocol},
                           {"model", state.model_id()},
                           {"chatTemplate", to_string(state.chat_template()->family())}});
  if (method == "models/list") {
    Json m = {{"id", state.model_id()}, {"object", "model"}, {"created", state.created()}, {"owned_by", "exlagent"}};
    return rpc_result(id, {{"data", Json::array({m})}});
  }
  if (peer) {
    try {
      if (auto r = peer_method(method, params, state, *peer)) return rpc_result(id, std::move(*r));
    } catch (const RpcError& e) {
      return rpc_error(id, e.code, e.what());
    } catch (const std::exception& e) {
      return rpc_error(id, rpc_code::internal_error, cat("Internal error: ", e.what()));
    }
  }
  return rpc_error(id, rpc_code::method_not_found, "Method not found: '" + method + "'");
}

void close_ws_peer(WsPeer& peer, ServerState& state) {
  state.sessions().close_owner(peer.id);
  if (peer.link) peer.link->disconnect();
}

std::string_view choose_ws_subprotocol(std::string_view header) {
  if (offers_subprotocol(header, kWsSubprotocol)) return kWsSubprotocol;
  if (offers_subprotocol(header, kWsMcpSubprotocol)) return kWsMcpSubprotocol;
  return {};
}

std::optional<HttpResponse> check_ws_upgrade(const HttpRequest& req, ServerState& state) {
  auto reject = [](int status, const char* code, const std::string& message) {
    return error_response(ApiError(status, "invalid_request_error", message, {}, code));
  };
  if (req.path() != kWsPath) return reject(404, "unknown_url", cat("No WebSocket endpoint at ", req.path(), "."));
  try {
    check_request_source(req, state);
    check_api_key(req, state.options());
  } catch (const ApiError& e) {
    return error_response(e);
  }
  if (choose_ws_subprotocol(req.header("sec-websocket-protocol")).empty())
    return reject(400, "subprotocol_required",
                  cat("WebSocket subprotocol '", kWsSubprotocol, "' (or '", kWsMcpSubprotocol, "') is required."));
  return std::nullopt;
}

}  // namespace exl
