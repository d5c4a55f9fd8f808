// Fuzz target: HTTP requests as the server reads them. The bytes go through Beast's request parser
// with the server's limits (runtime/server/http_request_reader.h); a request that parses
// is routed (runtime/server/router.h) against a model whose generator never starts. Whatever the bytes,
// parsing fails with an error code or routing answers a response or a plan; nothing throws.
#include <boost/beast/http.hpp>

#include "fuzz/fuzz_server.h"
#include "runtime/server/http_request_reader.h"
#include "runtime/server/router.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace http = boost::beast::http;
  exl::ServerState* state = exl::fuzz::fuzz_server_state();
  exl::BeastRequestParser parser;
  exl::limit_request_parser(parser, state ? state->options().max_body_bytes : 64u << 10);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (used < size && !parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    if (ec == http::error::need_more) {
      ec = {};
      if (n == 0) break;
    }
    if (ec) return 0;
    used += n;
  }
  if (!parser.is_done()) {
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return 0;
  }
  if (!state) return 0;
  exl::HttpRequest request = exl::to_http_request(parser.get());
  exl::RouteResult r = exl::route(request, *state);
  (void)r;
  return 0;
}
