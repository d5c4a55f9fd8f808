// McpLink: one connection to an MCP server, the transport under McpClient (mcp_client.h) — a child
// process on stdio (mcp_stdio_link.cpp) or a Streamable HTTP session (mcp_http_link.cpp). It
// numbers requests, matches answers, fails a request at its deadline or when its CancelToken fires
// (sending `notifications/cancelled`), answers the server's `ping`, and reports the server's
// notifications and its own end to its owner. Internal to tools/mcp.
//
// Every request's reply runs exactly once: the answer, or a `failure` text that reads after
// "the server " ("exited (exit status 3)", "timed out after 300 ms ..."). Once the link has ended
// (the server exited, broke the protocol, ended the HTTP session, or stop() was called) requests
// fail at once with the reason, and `ended` has run once.
// Thread-safe; callbacks run on the link's own thread and must not block.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tools/mcp/mcp_client.h"
#include "tools/tool.h"

namespace exl {

// The server's stderr and the client's notes, the last `cap` bytes. Thread-safe.
struct McpLog {
  explicit McpLog(size_t cap) : cap(std::max<size_t>(cap, 256)) {}
  void append(std::string_view s);
  void note(std::string_view s);
  std::string all() const;
  std::string tail(size_t n) const;
  const size_t cap;
  mutable std::mutex mu;
  std::string text;
};

// A request's outcome: `result`, or the JSON-RPC `error` object, or a `failure` text (no answer).
struct McpAnswer {
  nlohmann::json result;
  nlohmann::json error;
  std::string failure;
};
using McpReply = std::function<void(McpAnswer)>;

class McpLink;
struct McpLinkEvents {
  std::function<void(const McpLink* link, const nlohmann::json& notification)> notification;
  std::function<void(const McpLink* link, const std::string& reason)> ended;
};

class McpLink {
 public:
  virtual ~McpLink() = default;
  // Connects (spawns the process); "" or why it could not.
  virtual std::string start() = 0;
  // `cancel` may be null.
  virtual void request(const std::string& method, nlohmann::json params, ToolClock::time_point deadline,
                       std::shared_ptr<CancelToken> cancel, McpReply reply) = 0;
  virtual void notify(const std::string& method, nlohmann::json params) = 0;
  // Ends the link (the process is stopped, the HTTP session deleted); pending requests fail.
  virtual void stop() = 0;
  // Waits for the link's thread (stop() first).
  virtual void join() = 0;
};

std::shared_ptr<McpLink> make_mcp_stdio_link(const McpServerConfig& config, std::shared_ptr<McpLog> log,
                                             McpLinkEvents events);
std::shared_ptr<McpLink> make_mcp_http_link(const McpServerConfig& config, std::shared_ptr<McpLog> log,
                                            McpLinkEvents events);

// An http:// URL as the HTTP link connects to it.
struct McpHttpTarget {
  std::string host, port;  // for the resolver (an IPv6 address without brackets)
  std::string target;      // path and query, "/" at least
  std::string host_header; // host[:port] as the URL writes it
};
// Throws exl::Error naming what is wrong: not a URL, not http://, no host, user information.
McpHttpTarget parse_mcp_http_url(std::string_view url);

// How often a pending request looks at its CancelToken.
inline constexpr std::chrono::milliseconds kMcpCancelPoll{50};
// Parses a JSON-RPC message line, refusing nesting deeper than 128; throws nlohmann's parse error
// or exl::Error.
nlohmann::json mcp_parse_message(std::string_view text);
// The first 120 bytes of `s`, control characters blanked, for error messages.
std::string mcp_excerpt(std::string_view s);

}  // namespace exl
