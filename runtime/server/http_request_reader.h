// How the server reads an HTTP request with Beast: the parser's limits and the parsed request as
// the router's HttpRequest (runtime/http_message.h). The connection (http_session.cpp) and the
// fuzz target that feeds the same parser arbitrary bytes (tests/fuzz/fuzz_http_request.cpp) share
// them, so that what is fuzzed is what is served.
#pragma once
#include <cstddef>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "runtime/http_message.h"

namespace exl {

using BeastRequest = boost::beast::http::request<boost::beast::http::string_body>;
using BeastRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// The most bytes of a request's start line and header fields together.
inline constexpr size_t k_http_header_limit = 64 * 1024;

// Sets a fresh parser's limits: a body of at most `max_body_bytes`, k_http_header_limit of header.
void limit_request_parser(BeastRequestParser& parser, size_t max_body_bytes);

// The request with header names lower-cased (a repeated field keeps its last value).
HttpRequest to_http_request(const BeastRequest& r);

}  // namespace exl
