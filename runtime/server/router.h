// The HTTP API as a pure function: request -> immediate response, or a generation plan that the
// connection then runs on the Generator. Host and Origin allowlists, API key, JSON validation,
// admission and error objects all happen here, so every rule is testable without sockets.
//
// Every route checks Host and Origin (check_request_source). Every route but /health needs the
// API key when one is configured; /metrics too unless options.metrics_public.
//   POST /v1/chat/completions   POST /v1/completions   POST /v1/responses   GET /v1/models
//   GET /v1/models/{id}   GET /health   GET /metrics
// /v1/responses is a chat request (runtime/openai/responses_request.h) written in the Responses
// API's shape (CompletionMeta::responses).
// An unknown model id (percent-decoded from the path) is a 404 with code model_not_found naming it.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "engine/generate/generator.h"
#include "runtime/openai/completion_writer.h"
#include "runtime/http_message.h"
#include "runtime/server/server_state.h"

namespace exl {

// A request's generation: one job per choice (meta.n), identical but for their seeds
// (choice_seed) and their own mask hooks. The connection submits jobs[0] first and the others
// once it has prefilled (its first event), so they take the prompt's full KV pages from the
// prefix cache instead of prefilling them again; only the prompt's last, partial page is
// recomputed per choice.
struct GenerationPlan {
  CompletionMeta meta;
  std::vector<GenerationJob> jobs;  // on_event is left for the connection to set
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
// x-api-key, compared with keys_equal); a server without a key accepts everything.
void check_api_key(const HttpRequest& request, const ServerOptions& options);

// Constant-time comparison of a presented secret with the expected one: every byte up to the
// longer length is visited and the lengths are folded into the result, with no early exit.
// False when expected is empty.
bool keys_equal(std::string_view given, std::string_view expected);

// The Host header check alone (anti DNS-rebinding): loopback names always pass; when the server
// is bound to a loopback address nothing else does unless listed in allowed_hosts; a server bound
// to a non-loopback address (which requires an API key) accepts its bind address and any listed
// host, or every host when none is listed.
bool host_allowed(std::string_view host_header, const ServerOptions& options);

// The Origin header check alone (browsers send it on cross-site requests, including the plain
// "simple" POSTs that need no CORS preflight): the origin, compared case-insensitively and
// exactly (scheme, host and port), must be http://127.0.0.1:PORT, http://localhost:PORT,
// http://[::1]:PORT for the bound port, or one of allowed_origins ("*" = any).
bool origin_allowed(std::string_view origin_header, const ServerOptions& options, uint16_t port);

// Where a request comes from, for every HTTP route and the WebSocket upgrade: throws ApiError 403
// host_not_allowed (Host fails host_allowed) or origin_not_allowed (an Origin header is present
// and fails origin_allowed). A request without Origin (curl, SDKs) passes the Origin check.
void check_request_source(const HttpRequest& request, const ServerState& state);

}  // namespace exl
