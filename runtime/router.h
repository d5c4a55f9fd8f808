// The HTTP API as a pure function: request -> immediate response, or a generation plan that the
// connection then runs on the Generator. Host allowlist, API key, JSON validation, admission and
// error objects all happen here, so every rule is testable without sockets.
//
// Routes (every one but /health needs the API key when one is configured):
//   POST /v1/chat/completions   POST /v1/completions   GET /v1/models   GET /health   GET /metrics
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "engine/generator.h"
#include "runtime/completion_writer.h"
#include "runtime/http_message.h"
#include "runtime/server_state.h"

namespace exl {

struct GenerationPlan {
  CompletionMeta meta;
  GenerationJob job;               // on_event is left for the connection to set
  std::shared_ptr<void> admission;  // releases the generation slot when dropped
  std::string endpoint;             // for metrics
};

struct RouteResult {
  HttpResponse response;               // when plan is empty
  std::optional<GenerationPlan> plan;  // a generation to run
  std::string endpoint;                // metrics label of the matched route
};

RouteResult route(const HttpRequest& request, ServerState& state);

// Throws ApiError 401 unless the request carries options.api_key (Authorization: Bearer or
// x-api-key, compared in constant time); a server without a key accepts everything.
void check_api_key(const HttpRequest& request, const ServerOptions& options);

// The Host header check alone (anti DNS-rebinding): loopback names always pass; when the server
// is bound to a loopback address nothing else does unless listed in allowed_hosts; a server bound
// to a non-loopback address (which requires an API key) accepts its bind address and any listed
// host, or every host when none is listed.
bool host_allowed(std::string_view host_header, const ServerOptions& options);

}  // namespace exl
