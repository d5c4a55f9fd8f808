#include "runtime/http_message.h"

#include <algorithm>
#include <cctype>

namespace exl {

std::string HttpRequest::header(std::string_view name) const {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  auto it = headers.find(key);
  return it == headers.end() ? std::string() : it->second;
}

std::string_view HttpRequest::path() const {
  std::string_view t = target;
  return t.substr(0, t.find('?'));
}

}  // namespace exl
