// The server side of the Model Context Protocol as a pure state machine: one JSON-RPC 2.0 message
// in (a line of the stdio transport, a WebSocket text frame), the messages to send back out.
// No I/O and no threads here: a transport (runtime/mcp/mcp_stdio.h) feeds handle() and runs the
// tools/call it hands back wherever it likes, then sends mcp_call_reply().
//
// Lifecycle: `initialize` answers with the protocol version the client asked for when it is one we
// speak ("2025-06-18", "2025-03-26", "2024-11-05"), else the newest; `notifications/initialized`
// is noted; `ping` answers {} at any time; `tools/list` (no pagination: the list is short) and
// `tools/call` need a successful `initialize` first (-32600 before it); a second `initialize` is
// -32600. `notifications/cancelled` hands its requestId to the transport. Other notifications and
// the client's responses (we send no requests) are ignored.
// Errors (runtime/server/rpc_error.h codes), never an exception: a line that is not JSON -32700;
// not a JSON-RPC 2.0 request object, an id that is not a string or integer, a batch array (MCP
// 2025-06-18 has none), nesting deeper than kMaxJsonDepth -32600; an unknown method -32601; params
// that are not an object, tools/call without a string `name`, an unknown tool, `arguments` that is
// not an object -32602. A bad message whose id cannot be read is answered with id null.
// Not thread-safe: one transport thread calls handle().
#pragma once
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl {

// Ordered: a client's JSON Schema keeps its property order (the order the grammar writes them in).
using McpJson = nlohmann::ordered_json;

inline constexpr const char* kMcpServerProtocolVersion = "2025-06-18";

// One tool offered to MCP clients. `run` gets the call's arguments (an object, not yet checked
// against input_schema) and a flag set when the client cancels the call; it returns a
// CallToolResult ({content:[...], structuredContent?, isError?}: mcp_text_result builds one) and
// reports a failure of the tool as isError, not as an exception (one is turned into isError).
struct McpServedTool {
  std::string name;         // [a-zA-Z0-9_-]{1,64}
  std::string description;
  McpJson input_schema;                   // JSON Schema of `arguments` (type object)
  std::optional<McpJson> output_schema;   // of structuredContent, when the tool has one
  std::function<McpJson(const McpJson& arguments, const std::atomic<bool>& cancelled)> run;
};

struct McpServerInfo {
  std::string name = "exlagent";
  std::string version;
  std::string instructions;  // empty = not sent
};

// A tools/call the transport should run: tool->run(arguments, ...), then send
// mcp_call_reply(id, result) unless the call was cancelled.
struct McpCall {
  McpJson id;
  const McpServedTool* tool = nullptr;  // points into the McpServerProtocol's list
  McpJson arguments;
};

// What one incoming message asks of the transport.
struct McpStep {
  std::vector<std::string> replies;      // compact JSON texts (no newline), to send in order now
  std::optional<McpCall> call;           // run this
  std::optional<McpJson> cancel;  // the requestId of a notifications/cancelled
};

class McpServerProtocol {
 public:
  McpServerProtocol(std::vector<McpServedTool> tools, McpServerInfo info);

  McpStep handle(std::string_view message);

  bool initialized() const { return initialized_; }
  const std::string& protocol_version() const { return protocol_; }  // empty before initialize
  const std::vector<McpServedTool>& tools() const { return tools_; }

 private:
  std::vector<McpServedTool> tools_;
  McpServerInfo info_;
  bool initialized_ = false;
  bool client_ready_ = false;  // notifications/initialized seen
  std::string protocol_;
};

// {"jsonrpc":"2.0","id":id,"result":result} as compact JSON text.
std::string mcp_call_reply(const McpJson& id, const McpJson& result);
// {"jsonrpc":"2.0","id":id,"error":{"code":code,"message":message}} as compact JSON text.
std::string mcp_error_reply(const McpJson& id, int code, std::string_view message);
// A CallToolResult of one text block.
McpJson mcp_text_result(std::string text, bool is_error);
// Runs call.tool->run, turning an exception into an isError result naming the tool.
McpJson run_mcp_call(const McpCall& call, const std::atomic<bool>& cancelled);

}  // namespace exl
