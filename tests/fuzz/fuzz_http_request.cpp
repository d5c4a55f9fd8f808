// Fuzz target: HTTP requests as the server reads them. The bytes go through Beast's request parser
// with the server's limits (body and header size, runtime/server/http_session.cpp); a request that parses
// is routed (runtime/server/router.h) against a model whose generator never starts. Whatever the bytes,
// parsing fails with an error code or routing answers a response or a plan; nothing throws.
#include <algorithm>
#include <cctype>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "fuzz/fuzz_server.h"
#include "runtime/server/router.h"

namespace exl::fuzz_http_request {

namespace http = boost::beast::http;

HttpRequest http_fuzz_to_request(const http::request<http::string_body>& r) {
  HttpRequest out;
  out.method = std::string(r.method_string());
  out.target = std::string(r.target());
  for (const auto& f : r) {
    std::string name(f.name_string());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    out.headers[name] = std::string(f.value());
  }
  out.body = r.body();
  return out;
}

}  // namespace exl::fuzz_http_request

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace http = boost::beast::http;
  exl::ServerState* state = exl::fuzz::fuzz_server_state();
  http::request_parser<http::string_body> parser;
  parser.body_limit(state ? state->options().max_body_bytes : 64u << 10);
  parser.header_limit(64 * 1024);
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
  exl::HttpRequest request = exl::fuzz_http_request::http_fuzz_to_request(parser.get());
  exl::RouteResult r = exl::route(request, *state);
  (void)r;
  return 0;
}
