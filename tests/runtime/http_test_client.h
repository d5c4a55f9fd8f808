// A blocking Beast HTTP/1.1 client for the server tests: one request per connection to
// 127.0.0.1:port, the whole response read (bodies up to 16 MiB).
#pragma once
#include <string>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace exl::test {

struct HttpReply {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string retry_after;  // the Retry-After header, "" when absent
};

inline HttpReply http_request(uint16_t port, const std::string& method, const std::string& target,
                              const std::string& body = {}, const std::string& key = {},
                              const std::string& host = "127.0.0.1") {
  namespace http = boost::beast::http;
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket sock(ioc);
  sock.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req(method == "GET" ? http::verb::get : http::verb::post, target, 11);
  req.set(http::field::host, host);
  if (!key.empty()) req.set(http::field::authorization, "Bearer " + key);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  http::write(sock, req);
  boost::beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(16u << 20);
  http::read(sock, buf, p);
  HttpReply r;
  r.status = p.get().result_int();
  r.body = p.get().body();
  r.content_type = std::string(p.get()[http::field::content_type]);
  r.retry_after = std::string(p.get()[http::field::retry_after]);
  return r;
}

}  // namespace exl::test
