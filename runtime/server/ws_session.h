// One /v1/ws WebSocket connection (subprotocol exlagent.v1): accepts the upgrade that
// http_session checked, then reads text frames and answers each with handle_rpc_message; session
// events and tools/call requests from other threads are queued onto the same strand.
// Limits: frames and messages up to kMaxWsMessage bytes (bigger ones close with 1009), binary
// frames close with 1003, a message not whole within options().ws_message_timeout of its first
// frame closes the socket (no close frame: the client is still inside a frame), and a client
// more than kMaxWsQueueBytes of outgoing frames behind is closed with 1008. When the connection ends its sessions close and its tools go (close_ws_peer).
// Lifetime: shared_ptr held by pending handlers; members touched only on the connection's strand.
#pragma once
#include <memory>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "runtime/server/server_state.h"

namespace exl {

inline constexpr size_t kMaxWsMessage = 4u << 20;
inline constexpr size_t kMaxWsQueueBytes = 16u << 20;

void start_ws_session(boost::asio::ip::tcp::socket socket,
                      boost::beast::http::request<boost::beast::http::string_body> upgrade,
                      std::shared_ptr<ServerState> state);

}  // namespace exl
