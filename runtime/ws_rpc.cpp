#include "runtime/ws_rpc.h"

#include <nlohmann/json.hpp>

#include "runtime/api_error.h"
#include "runtime/json_depth.h"
#include "runtime/router.h"

namespace exl {

namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string rpc_error(const json& id, int code, const std::string& message) {
  return dump({{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}});
}

std::string rpc_result(const json& id, json result) {
  return dump({{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
}

// Origin "scheme://host[:port]" -> the host:port part for host_allowed.
std::string origin_authority(const std::string& origin) {
  const size_t p = origin.find("://");
  if (p == std::string::npos) return {};
  return origin.substr(p + 3, origin.find('/', p + 3) - (p + 3));
}

bool offers_subprotocol(const std::string& header) {
  size_t pos = 0;
  while (pos <= header.size()) {
    size_t end = header.find(',', pos);
    if (end == std::string::npos) end = header.size();
    std::string_view item(header.data() + pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item == kWsSubprotocol) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace

std::optional<std::string> handle_rpc_message(std::string_view text, ServerState& state) {
  json msg = json::parse(text.begin(), text.end(), nullptr, false);
  if (msg.is_discarded()) return rpc_error(nullptr, rpc_code::parse_error, "Parse error: the frame is not valid JSON");
  if (json_too_deep(msg))
    return rpc_error(nullptr, rpc_code::invalid_request, cat("Invalid Request: nested deeper than ", kMaxJsonDepth, " levels"));
  if (msg.is_array())
    return rpc_error(nullptr, rpc_code::invalid_request, "Invalid Request: JSON-RPC batches are not supported");
  if (!msg.is_object() || msg.value("jsonrpc", "") != "2.0")
    return rpc_error(nullptr, rpc_code::invalid_request, "Invalid Request: expected a JSON-RPC 2.0 object");
  const bool has_id = msg.contains("id");
  const json id = has_id ? msg["id"] : json(nullptr);
  if (has_id && !id.is_string() && !id.is_number_integer() && !id.is_null())
    return rpc_error(nullptr, rpc_code::invalid_request, "Invalid Request: id must be a string or an integer");
  if (!msg.contains("method")) return std::nullopt;  // a response to one of our requests; none are pending yet
  if (!msg["method"].is_string())
    return rpc_error(id, rpc_code::invalid_request, "Invalid Request: method must be a string");
  const std::string method = msg["method"];
  if (msg.contains("params") && !msg["params"].is_object() && !msg["params"].is_array())
    return has_id ? std::optional(rpc_error(id, rpc_code::invalid_params, "Invalid params: must be an object"))
                  : std::nullopt;
  if (!has_id) return std::nullopt;  // notifications: none are acted on yet

  if (method == "server/info")
    return rpc_result(id, {{"name", "exlagent"},
                           {"version", "0.1.0"},
                           {"protocol", kWsSubprotocol},
                           {"model", state.model_id()},
                           {"chatTemplate", to_string(state.chat_template()->family())}});
  if (method == "models/list") {
    json m = {{"id", state.model_id()}, {"object", "model"}, {"created", state.created()}, {"owned_by", "exlagent"}};
    return rpc_result(id, {{"data", json::array({m})}});
  }
  return rpc_error(id, rpc_code::method_not_found, "Method not found: '" + method + "'");
}

std::optional<HttpResponse> check_ws_upgrade(const HttpRequest& req, ServerState& state) {
  auto reject = [](int status, const char* code, const std::string& message) {
    return error_response(ApiError(status, "invalid_request_error", message, {}, code));
  };
  if (req.path() != kWsPath) return reject(404, "unknown_url", cat("No WebSocket endpoint at ", req.path(), "."));
  if (!host_allowed(req.header("host"), state.options()))
    return reject(403, "host_not_allowed", cat("Host '", req.header("host"), "' is not allowed."));
  const std::string origin = req.header("origin");
  if (!origin.empty() && !host_allowed(origin_authority(origin), state.options()))
    return reject(403, "origin_not_allowed", cat("Origin '", origin, "' is not allowed."));
  try {
    check_api_key(req, state.options());
  } catch (const ApiError& e) {
    return error_response(e);
  }
  if (!offers_subprotocol(req.header("sec-websocket-protocol")))
    return reject(400, "subprotocol_required", cat("WebSocket subprotocol '", kWsSubprotocol, "' is required."));
  return std::nullopt;
}

}  // namespace exl
