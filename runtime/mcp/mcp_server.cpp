#include "runtime/mcp/mcp_server.h"

#include <array>

#include "kernels/error.h"
#include "runtime/json_depth.h"
#include "runtime/server/rpc_error.h"

namespace exl {

namespace {


constexpr std::array<const char*, 3> kMcpServerProtocols = {"2025-06-18", "2025-03-26", "2024-11-05"};

std::string mcp_dump(const McpJson& j) { return j.dump(-1, ' ', false, McpJson::error_handler_t::replace); }

bool valid_rpc_id(const McpJson& id) { return id.is_string() || id.is_number_integer() || id.is_number_unsigned(); }

McpJson mcp_tool_listing(const McpServedTool& t) {
  McpJson j = {{"name", t.name}, {"description", t.description}, {"inputSchema", t.input_schema}};
  if (t.output_schema) j["outputSchema"] = *t.output_schema;
  return j;
}

}  // namespace

std::string mcp_call_reply(const McpJson& id, const McpJson& result) {
  return mcp_dump({{"jsonrpc", "2.0"}, {"id", id}, {"result", result}});
}

std::string mcp_error_reply(const McpJson& id, int code, std::string_view message) {
  return mcp_dump({{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", std::string(message)}}}});
}

McpJson mcp_text_result(std::string text, bool is_error) {
  return {{"content", McpJson::array({{{"type", "text"}, {"text", std::move(text)}}})}, {"isError", is_error}};
}

McpJson run_mcp_call(const McpCall& call, const std::atomic<bool>& cancelled) {
  try {
    return call.tool->run(call.arguments, cancelled);
  } catch (const std::exception& e) {
    return mcp_text_result(cat("runtime: mcp: tool '", call.tool->name, "' failed: ", e.what()), true);
  }
}

McpServerProtocol::McpServerProtocol(std::vector<McpServedTool> tools, McpServerInfo info)
    : tools_(std::move(tools)), info_(std::move(info)) {}

McpStep McpServerProtocol::handle(std::string_view message) {
  McpStep step;
  auto error = [&step](const McpJson& id, int code, std::string_view text) {
    step.replies.push_back(mcp_error_reply(id, code, text));
    return std::move(step);
  };
  McpJson msg;
  try {
    msg = McpJson::parse(message);
  } catch (const McpJson::exception& e) {
    return error(nullptr, rpc_code::parse_error, cat("parse error: the message is not JSON: ", e.what()));
  }
  if (json_too_deep(msg)) return error(nullptr, rpc_code::invalid_request, cat("invalid request: JSON nested deeper than ", kMaxJsonDepth));
  if (msg.is_array()) return error(nullptr, rpc_code::invalid_request, "invalid request: JSON-RPC batches are not supported (MCP 2025-06-18 has none)");
  if (!msg.is_object()) return error(nullptr, rpc_code::invalid_request, "invalid request: a JSON-RPC message is an object");
  const bool has_id = msg.contains("id");
  const McpJson id = has_id && valid_rpc_id(msg["id"]) ? msg["id"] : McpJson(nullptr);
  const auto version = msg.find("jsonrpc");
  if (version == msg.end() || *version != "2.0") return error(id, rpc_code::invalid_request, "invalid request: \"jsonrpc\" must be \"2.0\"");
  if (has_id && !valid_rpc_id(msg["id"])) return error(nullptr, rpc_code::invalid_request, "invalid request: \"id\" must be a string or an integer");
  const auto method_it = msg.find("method");
  if (method_it == msg.end()) {
    if (has_id && (msg.contains("result") || msg.contains("error"))) return step;  // a response: we sent no requests
    return error(id, rpc_code::invalid_request, "invalid request: no \"method\"");
  }
  if (!method_it->is_string()) return error(id, rpc_code::invalid_request, "invalid request: \"method\" must be a string");
  const std::string method = *method_it;
  const McpJson params = msg.contains("params") ? msg["params"] : McpJson::object();
  if (!params.is_object()) return error(id, rpc_code::invalid_params, cat("invalid params: ", method, ": \"params\" must be an object"));

  if (!has_id) {  // a notification: never answered
    if (method == "notifications/initialized") {
      client_ready_ = true;
    } else if (method == "notifications/cancelled") {
      const auto rid = params.find("requestId");
      if (rid != params.end() && valid_rpc_id(*rid)) step.cancel = *rid;
    }
    return step;
  }

  if (method == "ping") {
    step.replies.push_back(mcp_call_reply(id, McpJson::object()));
    return step;
  }
  if (method == "initialize") {
    if (initialized_) return error(id, rpc_code::invalid_request, "invalid request: initialize: the session is already initialized");
    const auto asked = params.find("protocolVersion");
    if (asked == params.end() || !asked->is_string())
      return error(id, rpc_code::invalid_params, "invalid params: initialize: \"protocolVersion\" must be a string");
    protocol_ = kMcpServerProtocolVersion;
    for (const char* v : kMcpServerProtocols)
      if (*asked == v) protocol_ = v;
    initialized_ = true;
    McpJson info = {{"name", info_.name}, {"version", info_.version}};
    McpJson result = {{"protocolVersion", protocol_},
                   {"capabilities", {{"tools", {{"listChanged", false}}}}},
                   {"serverInfo", std::move(info)}};
    if (!info_.instructions.empty()) result["instructions"] = info_.instructions;
    step.replies.push_back(mcp_call_reply(id, result));
    return step;
  }
  if (method != "tools/list" && method != "tools/call")
    return error(id, rpc_code::method_not_found, cat("method not found: '", method, "'"));
  if (!initialized_) return error(id, rpc_code::invalid_request, cat("invalid request: ", method, " before initialize"));
  if (method == "tools/list") {
    McpJson list = McpJson::array();
    for (const auto& t : tools_) list.push_back(mcp_tool_listing(t));
    step.replies.push_back(mcp_call_reply(id, {{"tools", std::move(list)}}));
    return step;
  }
  const auto name = params.find("name");
  if (name == params.end() || !name->is_string())
    return error(id, rpc_code::invalid_params, "invalid params: tools/call: \"name\" must be a string");
  const McpServedTool* tool = nullptr;
  for (const auto& t : tools_)
    if (t.name == *name) tool = &t;
  if (!tool) return error(id, rpc_code::invalid_params, cat("invalid params: tools/call: unknown tool '", name->get<std::string>(), "'"));
  McpJson arguments = params.contains("arguments") ? params["arguments"] : McpJson::object();
  if (arguments.is_null()) arguments = McpJson::object();
  if (!arguments.is_object())
    return error(id, rpc_code::invalid_params, cat("invalid params: tools/call '", tool->name, "': \"arguments\" must be an object"));
  step.call = McpCall{id, tool, std::move(arguments)};
  return step;
}

}  // namespace exl
