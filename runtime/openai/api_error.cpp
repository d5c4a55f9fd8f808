#include "runtime/openai/api_error.h"

#include <nlohmann/json.hpp>

namespace exl {

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
