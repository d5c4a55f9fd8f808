// A request failure in OpenAI's error shape: {"error":{"message","type","param","code"}} with an
// HTTP status. Thrown by request parsing and routing, turned into a response by the router.
#pragma once
#include <string>

#include "kernels/error.h"
#include "runtime/http_message.h"

namespace exl {

struct ApiError : Error {
  ApiError(int status, std::string type, const std::string& message, std::string param = {}, std::string code = {})
      : Error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_supported_error, ...
  std::string param;  // the offending request field, "" = null
  std::string code;   // machine-readable code, "" = null
};

// 400 invalid_request_error naming `param`.
[[noreturn]] void bad_request(const std::string& message, const std::string& param = {}, const std::string& code = {});

std::string error_json(const ApiError& e);
// The error as a response; 401 carries WWW-Authenticate, 503 (overloaded, out of KV cache, shutting
// down) carries Retry-After: 1.
HttpResponse error_response(const ApiError& e);

}  // namespace exl
