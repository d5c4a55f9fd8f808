// Plain HTTP request and response values, independent of the network library, so routing and
// response building can be tested without sockets. Header names are stored lower-case.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace exl {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // "/v1/models?x=1"
  std::map<std::string, std::string> headers;
  std::string body;
  // True once the client has gone away (set by the connection; callable only while the request
  // is being routed). Long work polls it, e.g. grammar compilation. Empty = never.
  std::function<bool()> client_gone;

  // The value of a header (name in any case), "" when absent.
  std::string header(std::string_view name) const;
  // target without the query string.
  std::string_view path() const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

}  // namespace exl
