#include "runtime/server/http_request_reader.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace exl {

void limit_request_parser(BeastRequestParser& parser, size_t max_body_bytes) {
  parser.body_limit(max_body_bytes);
  parser.header_limit(k_http_header_limit);
}

HttpRequest to_http_request(const BeastRequest& r) {
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

}  // namespace exl
