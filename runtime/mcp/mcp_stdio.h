// The MCP stdio transport of the server side: JSON-RPC messages one per line on `in`, replies one
// per line on `out` (flushed after each); nothing else is ever written to `out`.
// A thin loop around McpServerProtocol: the reading thread handles each line and writes the
// replies; tools/call runs on one worker thread, one call at a time in arrival order (the model
// runs one job at a time anyway), and its reply is written when it ends. notifications/cancelled
// drops a queued call and sets the running call's cancel flag; neither is answered (MCP: a
// cancelled request gets no response). A line longer than max_line_bytes is answered -32600
// (id null) and skipped. At the end of `in` the calls already received run to their end and are
// answered (so `printf ... | exlagent mcp-serve` works; a host that wants them stopped cancels
// them or kills the process), then the function returns. The caller ignores SIGPIPE, so a host
// that is gone makes writes fail quietly instead of killing the process.
#pragma once
#include <cstddef>
#include <istream>
#include <ostream>

#include "runtime/mcp/mcp_server.h"

namespace exl {

struct McpStdioOptions {
  size_t max_line_bytes = size_t(16) << 20;
  size_t max_queued_calls = 64;  // a tools/call beyond it is answered -32600 at once
};

void serve_mcp_stdio(McpServerProtocol& protocol, std::istream& in, std::ostream& out,
                     const McpStdioOptions& options = {});

}  // namespace exl
