#include "runtime/server/router.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <ctime>
#include <random>

#include "engine/generate/grammar_constraint.h"
#include "runtime/openai/api_error.h"
#include "runtime/openai/openai_request.h"
#include "runtime/openai/output_constraint.h"
#include "runtime/openai/responses_request.h"

namespace exl {

namespace {

using json = nlohmann::json;

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

}  // namespace

bool keys_equal(std::string_view given, std::string_view expected) {
  const size_t n = std::max(given.size(), expected.size());
  volatile uint64_t diff = uint64_t(given.size() ^ expected.size());
  for (size_t i = 0; i < n; ++i) {
    const uint8_t a = i < given.size() ? uint8_t(given[i]) : 0;
    const uint8_t b = i < expected.size() ? uint8_t(expected[i]) : 0;
    diff = diff | uint64_t(a ^ b);
  }
  return diff == 0 && !expected.empty();
}

void check_api_key(const HttpRequest& req, const ServerOptions& opts) {
  if (opts.api_key.empty()) return;
  std::string key = req.header("x-api-key");
  const std::string auth = req.header("authorization");
  if (auth.size() > 7 && std::equal(auth.begin(), auth.begin() + 7, "bearer ", [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) == b;
      }))
    key = auth.substr(7);
  if (key.empty())
    throw ApiError(401, "invalid_request_error",
                   "You didn't provide an API key. Send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.", {},
                   "missing_api_key");
  if (!keys_equal(key, opts.api_key))
    throw ApiError(401, "invalid_request_error", "Incorrect API key provided.", {}, "invalid_api_key");
}

namespace {

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char hex[] = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[rng() % 16];
  return s;
}

HttpResponse json_response(const json& j, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = j.dump();
  return r;
}

void require_method(const HttpRequest& req, const char* method) {
  if (req.method != method)
    throw ApiError(405, "invalid_request_error", cat("Method ", req.method, " is not allowed on ", req.path(), "; use ",
                                                     method, "."), {}, "method_not_allowed");
}

// Prompt limits, checked before the expensive steps: the text's bytes before it is tokenized,
// then its tokens before a grammar is compiled or the generation admitted.
void check_prompt_bytes(const ServerState& state, size_t bytes, const char* param) {
  const size_t limit = state.options().max_prompt_bytes;
  if (bytes > limit)
    bad_request(cat("The prompt has ", bytes, " bytes of text; this server accepts at most ", limit,
                    " (--max-prompt-bytes)."),
                param, "context_length_exceeded");
}

void check_prompt_tokens(const ServerState& state, size_t n_prompt, const char* param) {
  const int64_t ctx = state.context_length();
  const int64_t limit = state.max_prompt_tokens();
  if (int64_t(n_prompt) >= ctx)
    bad_request(cat("This model's maximum context length is ", ctx, " tokens; the prompt has ", n_prompt, " tokens."),
                param, "context_length_exceeded");
  if (int64_t(n_prompt) > limit)
    bad_request(cat("The prompt has ", n_prompt, " tokens; this server accepts at most ", limit,
                    " (--max-prompt-tokens)."),
                param, "context_length_exceeded");
}

size_t chat_prompt_bytes(const ChatRequest& cr) {
  size_t n = 0;
  for (const auto& m : cr.messages) {
    n += m.content.size();
    for (const auto& c : m.tool_calls) n += c.name.size() + c.arguments.size();
  }
  return n;
}

GenerationPlan plan_generation(ServerState& state, const GenerationRequest& g, std::vector<int32_t> prompt,
                               CompletionMeta meta) {
  const int64_t ctx = state.context_length();
  const int64_t n_prompt = int64_t(prompt.size());
  const int64_t room = ctx - n_prompt;
  if (g.max_tokens && *g.max_tokens > room)
    bad_request(cat("This model's maximum context length is ", ctx, " tokens; the prompt has ", n_prompt,
                    " tokens and max_tokens asks for ", *g.max_tokens, "."),
                "max_tokens", "context_length_exceeded");
  GenerationPlan plan;
  plan.admission = state.admit_generation();
  if (!plan.admission)
    throw ApiError(503, state.draining() ? "unavailable_error" : "rate_limit_error",
                   state.draining() ? "The server is shutting down." : "Too many generations in flight; retry later.",
                   {}, state.draining() ? "server_shutting_down" : "server_overloaded");
  GenerationJob job;
  job.prompt = std::move(prompt);
  job.sampling = g.sampling;
  job.max_new_tokens = int32_t(g.max_tokens.value_or(room));
  job.stop_tokens.assign(state.tokenizer().eos_ids().begin(), state.tokenizer().eos_ids().end());
  job.stop_strings = g.stop;
  job.top_logprobs = g.top_logprobs;
  job.speculate = g.speculate;
  if (g.speculate == Speculation::draft && state.options().draft_model.empty())
    bad_request("'speculate': 'draft' needs a server started with --draft-model.", "speculate");
  if (g.top_logprobs >= 0) {
    meta.top_logprobs = g.top_logprobs;
    meta.vocab = shared_token_index(state.tokenizer());
    meta.hidden_tokens = job.stop_tokens;
  }
  meta.n = g.n;
  plan.jobs.assign(size_t(g.n), job);
  for (int32_t i = 0; i < g.n; ++i) plan.jobs[size_t(i)].sampling.seed = choice_seed(g.sampling.seed, i);
  meta.stream = g.stream;
  meta.include_usage = g.include_usage;
  meta.created = int64_t(std::time(nullptr));
  meta.model = state.model_id();
  plan.meta = std::move(meta);
  return plan;
}

// A chat request's generation (chat completions and the Responses API): the prompt rendered by
// the chat template, one output constraint per choice, the template's stop strings.
RouteResult chat_plan(const HttpRequest& req, ServerState& state, const ChatRequest& cr, CompletionMeta meta) {
  check_prompt_bytes(state, chat_prompt_bytes(cr), "messages");
  RenderedPrompt prompt;
  try {
    prompt = state.chat_template()->render(cr.messages, cr.tools, true);
  } catch (const Error& e) {
    bad_request(e.what(), "messages");
  }
  std::vector<int32_t> tokens = state.encode_prompt(prompt);
  check_prompt_tokens(state, tokens.size(), "messages");
  GrammarBudget budget = state.options().grammar_budget;
  budget.cancelled = req.client_gone;
  std::vector<std::shared_ptr<LogitsMaskHook>> masks;
  for (int32_t i = 0; i < cr.gen.n; ++i)
    masks.push_back(make_output_constraint(cr, state.tokenizer(), state.chat_template()->tool_format(), budget));
  meta.chat = true;
  meta.tools_enabled = cr.tool_choice != ToolChoice::none;
  RouteResult r;
  r.plan = plan_generation(state, cr.gen, std::move(tokens), std::move(meta));
  for (size_t i = 0; i < r.plan->jobs.size(); ++i) {
    GenerationJob& job = r.plan->jobs[i];
    job.mask = std::move(masks[i]);
    for (const auto& s : state.chat_template()->stop_strings())
      if (!s.empty()) job.stop_strings.push_back(s);
  }
  return r;
}

RouteResult chat_completions(const HttpRequest& req, ServerState& state) {
  const ChatRequest cr = parse_chat_request(req.body, state.tokenizer().vocab_size());
  CompletionMeta meta;
  meta.id = random_id("chatcmpl-");
  return chat_plan(req, state, cr, std::move(meta));
}

RouteResult responses(const HttpRequest& req, ServerState& state) {
  const ResponsesRequest rr = parse_responses_request(req.body, state.tokenizer().vocab_size());
  CompletionMeta meta;
  meta.id = random_id("resp_");
  meta.responses = true;
  meta.response_echo = json::parse(rr.echo.dump());
  return chat_plan(req, state, rr.chat, std::move(meta));
}

RouteResult completions(const HttpRequest& req, ServerState& state) {
  CompletionRequest cr = parse_completion_request(req.body, state.tokenizer().vocab_size());
  check_prompt_bytes(state, cr.prompt.size(), "prompt");
  std::vector<int32_t> prompt = state.encode_raw_prompt(cr.prompt);
  check_prompt_tokens(state, prompt.size(), "prompt");
  if (prompt.empty()) {
    if (!state.tokenizer().bos_id()) bad_request("'prompt' is empty and the model has no BOS token.", "prompt");
    prompt.push_back(*state.tokenizer().bos_id());
  }
  CompletionMeta meta;
  meta.chat = false;
  meta.id = random_id("cmpl-");
  if (cr.echo) meta.echo = cr.prompt;
  RouteResult r;
  r.plan = plan_generation(state, cr.gen, std::move(prompt), std::move(meta));
  return r;
}

constexpr std::string_view kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models",
                                        "/health", "/metrics"};
constexpr std::string_view kModelPrefix = "/v1/models/";

json model_object(const ServerState& state) {
  return {{"id", state.model_id()}, {"object", "model"}, {"created", state.created()}, {"owned_by", "exlagent"}};
}

// A path segment with its %XX escapes decoded (clients encode the id as encodeURIComponent does);
// nullopt when an escape is malformed.
std::optional<std::string> decode_path_segment(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    unsigned v = 0;
    if (i + 2 >= s.size() || std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16).ptr != s.data() + i + 3)
      return std::nullopt;
    out += char(v);
    i += 2;
  }
  return out;
}

RouteResult retrieve_model(std::string_view encoded_id, const ServerState& state) {
  const std::optional<std::string> id = decode_path_segment(encoded_id);
  if (!id || *id != state.model_id())
    throw ApiError(404, "invalid_request_error",
                   cat("The model '", id ? *id : std::string(encoded_id),
                       "' does not exist; this server serves '", state.model_id(), "'."),
                   {}, "model_not_found");
  RouteResult r;
  r.response = json_response(model_object(state));
  return r;
}

RouteResult dispatch(const HttpRequest& req, ServerState& state, std::string& endpoint) {
  const std::string_view path = req.path();
  for (std::string_view known : kRoutes)
    if (path == known) endpoint = std::string(known);
  const bool model_path = path.size() > kModelPrefix.size() && path.substr(0, kModelPrefix.size()) == kModelPrefix;
  if (model_path) endpoint = "/v1/models/{id}";
  RouteResult r;
  check_request_source(req, state);
  if (path == "/health") {
    require_method(req, "GET");
    r.response = json_response(state.draining() ? json{{"status", "draining"}} : json{{"status", "ok"}},
                               state.draining() ? 503 : 200);
    return r;
  }
  if (path != "/metrics" || !state.options().metrics_public) check_api_key(req, state.options());
  if (path == "/v1/chat/completions") {
    require_method(req, "POST");
    return chat_completions(req, state);
  }
  if (path == "/v1/completions") {
    require_method(req, "POST");
    return completions(req, state);
  }
  if (path == "/v1/responses") {
    require_method(req, "POST");
    return responses(req, state);
  }
  if (path == "/v1/models") {
    require_method(req, "GET");
    r.response = json_response({{"object", "list"}, {"data", json::array({model_object(state)})}});
    return r;
  }
  if (model_path) {
    require_method(req, "GET");
    return retrieve_model(path.substr(kModelPrefix.size()), state);
  }
  if (path == "/metrics") {
    require_method(req, "GET");
    r.response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.response.body = state.metrics().render(state.running_generations());
    return r;
  }
  throw ApiError(404, "invalid_request_error", cat("Unknown route ", req.method, " ", path, "."), {}, "unknown_url");
}

}  // namespace

bool host_allowed(std::string_view host_header, const ServerOptions& opts) {
  std::string h(host_header);
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (h.empty()) return false;
  if (h.front() == '[') {
    const size_t close = h.find(']');
    if (close == std::string::npos) return false;
    h = h.substr(1, close - 1);
  } else if (size_t colon = h.find(':'); colon != std::string::npos && h.find(':', colon + 1) == std::string::npos) {
    h.resize(colon);
  }
  if (h == "localhost" || h == "127.0.0.1" || h == "::1" ||
      (h.size() > 10 && h.compare(h.size() - 10, 10, ".localhost") == 0))
    return true;
  for (const auto& a : opts.allowed_hosts)
    if (a == "*" || a == h) return true;
  if (is_loopback_host(opts.host)) return false;
  if (h == opts.host) return true;
  return opts.allowed_hosts.empty();
}

bool origin_allowed(std::string_view origin_header, const ServerOptions& opts, uint16_t port) {
  std::string origin = lower_ascii(origin_header);
  while (!origin.empty() && (origin.back() == ' ' || origin.back() == '\t')) origin.pop_back();
  if (origin.empty()) return false;
  const std::string p = std::to_string(port);
  if (port != 0 &&
      (origin == "http://127.0.0.1:" + p || origin == "http://localhost:" + p || origin == "http://[::1]:" + p))
    return true;
  for (const auto& a : opts.allowed_origins) {
    std::string allowed = lower_ascii(a);
    while (!allowed.empty() && allowed.back() == '/') allowed.pop_back();
    if (allowed == "*" || allowed == origin) return true;
  }
  return false;
}

void check_request_source(const HttpRequest& req, const ServerState& state) {
  if (!host_allowed(req.header("host"), state.options()))
    throw ApiError(403, "invalid_request_error",
                   cat("Host '", req.header("host"), "' is not allowed; use a loopback address or --allow-host."), {},
                   "host_not_allowed");
  const auto origin = req.headers.find("origin");
  if (origin != req.headers.end() && !origin_allowed(origin->second, state.options(), state.bound_port()))
    throw ApiError(403, "invalid_request_error",
                   cat("Origin '", origin->second, "' is not allowed; a web page may call this server only from an "
                       "origin given with --allow-origin."), {}, "origin_not_allowed");
}

RouteResult route(const HttpRequest& req, ServerState& state) {
  std::string endpoint = "other";
  RouteResult r;
  try {
    r = dispatch(req, state, endpoint);
  } catch (const ApiError& e) {
    r = RouteResult{};
    r.response = error_response(e);
  } catch (const Error& e) {
    r = RouteResult{};
    r.response = error_response(ApiError(400, "invalid_request_error", e.what()));
  } catch (const std::exception& e) {
    r = RouteResult{};
    r.response = error_response(ApiError(500, "server_error", cat("runtime: router: ", e.what())));
  }
  r.endpoint = endpoint;
  if (r.plan) r.plan->endpoint = endpoint;
  else state.metrics().count_request(endpoint, r.response.status);
  return r;
}

}  // namespace exl
