#include "runtime/api_error.h"
#include "runtime/http_message.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

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

void bad_request(const std::string& message, const std::string& param, const std::string& code) {
  throw ApiError(400, "invalid_request_error", message, param, code);
}

std::string error_json(const ApiError& e) {
  nlohmann::json j;
  j["error"] = {{"message", e.what()},
                {"type", e.type},
                {"param", e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param)},
                {"code", e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status;
  r.body = error_json(e);
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

}  // namespace exl
