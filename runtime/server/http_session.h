// One HTTP/1.1 connection: reads requests (body size limit, read timeout), routes them, writes
// responses, and runs generation plans on the Generator: non-streaming requests get one response
// when the job is done; streaming ones get an SSE body in chunked transfer encoding as tokens
// arrive. While a job runs the connection watches its socket, and a client that goes away
// cancels its generation. Writes are queued per connection and bounded: a client more than
// kMaxPending bytes behind is cancelled and closed.
//
// Lifetime and threads: owned by shared_ptrs held in pending completion handlers (Beast's
// enable_shared_from_this pattern); every member is touched only on the connection's strand.
// Generation events arrive on the engine thread and are posted onto the strand.
#pragma once
#include <memory>

#include <boost/asio/ip/tcp.hpp>

#include "runtime/server/server_state.h"

namespace exl {

class HttpSession;

// Starts serving an accepted socket (whose executor is its own strand).
void start_http_session(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerState> state);

}  // namespace exl
