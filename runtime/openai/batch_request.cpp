#include "runtime/openai/batch_request.h"

#include <ctime>
#include <random>

#include "runtime/openai/api_error.h"
#include "runtime/openai/completion_writer.h"
#include "runtime/openai/openai_request.h"

namespace exl {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string random_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 24; ++i) s += digits[rng() % 16];
  return s;
}

void line_error(BatchItem& it, std::string code, std::string message) {
  it.key = cat("#", it.line);
  it.error = std::move(message);
  it.error_code = std::move(code);
  it.error_status = 0;
}

void request_error(BatchItem& it, std::string code, std::string message) {
  it.error = std::move(message);
  it.error_code = std::move(code);
  it.error_status = 400;
}

// Fills spec from a chat completion body; false (with item.error set) when it is invalid.
bool fill_from_body(BatchItem& it, const ojson& body, const std::optional<ojson>& default_schema, int64_t vocab) {
  ChatRequest cr;
  try {
    cr = parse_chat_request(body.dump(), vocab);
  } catch (const ApiError& e) {
    request_error(it, e.code.empty() ? "invalid_request" : e.code, e.what());
    return false;
  }
  if (cr.tool_choice == ToolChoice::required || cr.tool_choice == ToolChoice::named) {
    request_error(it, "unsupported_tool_choice", "tool_choice 'required' and named functions are not supported in batch jobs");
    return false;
  }
  if (cr.gen.top_logprobs >= 0) {
    request_error(it, "unsupported_logprobs", "'logprobs' is not supported in batch jobs");
    return false;
  }
  if (cr.gen.n != 1) {
    request_error(it, "unsupported_n", "'n' other than 1 is not supported in batch jobs");
    return false;
  }
  it.spec.messages = std::move(cr.messages);
  if (cr.tool_choice != ToolChoice::none) {
    it.spec.tools = std::move(cr.tools);
    it.tools_enabled = !it.spec.tools.empty();
  }
  if (cr.response_format == "json_schema") it.spec.schema = std::move(cr.json_schema);
  else if (cr.response_format == "json_object") it.spec.schema = ojson{{"type", "object"}};
  else it.spec.schema = default_schema;
  it.spec.max_tokens = cr.gen.max_tokens;
  it.spec.sampling = std::move(cr.gen.sampling);
  it.spec.stop = std::move(cr.gen.stop);
  return true;
}

void parse_openai(BatchItem& it, const ojson& j, const std::optional<ojson>& default_schema, int64_t vocab) {
  const auto cid = j.find("custom_id");
  if (cid == j.end() || !cid->is_string() || cid->get<std::string>().empty())
    return line_error(it, "missing_custom_id", "'custom_id' is missing or not a non-empty string");
  it.id = *cid;
  it.key = it.id.dump();
  if (auto m = j.find("method"); m != j.end() && *m != "POST")
    return request_error(it, "invalid_method", "'method' must be \"POST\"");
  const auto url = j.find("url");
  if (url == j.end() || *url != "/v1/chat/completions")
    return request_error(it, "invalid_url", "'url' must be \"/v1/chat/completions\" (the only endpoint batch jobs run)");
  const auto body = j.find("body");
  if (body == j.end() || !body->is_object()) return request_error(it, "invalid_body", "'body' must be a JSON object");
  fill_from_body(it, *body, default_schema, vocab);
}

void parse_simple(BatchItem& it, const ojson& j, const std::optional<ojson>& default_schema, int64_t vocab) {
  const auto id = j.find("id");
  if (id == j.end() || !(id->is_string() || id->is_number_integer()) || (id->is_string() && id->get<std::string>().empty()))
    return line_error(it, "missing_id", "'id' is missing or not a non-empty string or an integer");
  it.id = *id;
  it.key = it.id.dump();
  const auto prompt = j.find("prompt");
  const auto messages = j.find("messages");
  if ((prompt == j.end()) == (messages == j.end()))
    return request_error(it, "invalid_request", "give exactly one of 'prompt' (a string) and 'messages' (an array)");
  ojson body = ojson::object();
  if (prompt != j.end()) {
    if (!prompt->is_string()) return request_error(it, "invalid_request", "'prompt' must be a string");
    body["messages"] = ojson::array();
    if (auto s = j.find("system"); s != j.end()) body["messages"].push_back({{"role", "system"}, {"content", *s}});
    body["messages"].push_back({{"role", "user"}, {"content", *prompt}});
  } else {
    body["messages"] = *messages;
    if (auto s = j.find("system"); s != j.end())
      return request_error(it, "invalid_request", "'system' goes with 'prompt'; put a system message in 'messages'");
  }
  body["temperature"] = 0;
  for (const char* k : {"max_tokens", "temperature", "seed", "top_p", "stop"})
    if (auto v = j.find(k); v != j.end()) body[k] = *v;
  std::optional<ojson> schema = default_schema;
  if (auto s = j.find("schema"); s != j.end()) {
    if (!s->is_object()) return request_error(it, "invalid_schema", "'schema' must be a JSON object");
    schema = *s;
  }
  if (!fill_from_body(it, body, std::nullopt, vocab)) return;
  it.spec.schema = std::move(schema);
}

std::string finish(ojson j, const BatchItem& it) {
  if (it.key.starts_with("#")) j["line"] = it.line;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

ojson error_object(const std::string& code, const std::string& message) {
  return {{"code", code}, {"message", message}};
}

ojson openai_envelope(const BatchItem& it, ojson response, ojson error) {
  return {{"id", "batch_req_" + random_suffix()}, {"custom_id", it.id}, {"response", std::move(response)},
          {"error", std::move(error)}};
}

ojson openai_response(int status, ojson body) {
  return {{"status_code", status}, {"request_id", "req_" + random_suffix()}, {"body", std::move(body)}};
}

}  // namespace

BatchItem parse_batch_line(std::string_view text, size_t line, BatchForm fallback_form,
                           const std::optional<ojson>& default_schema, int64_t vocab_size) {
  BatchItem it;
  it.line = line;
  it.form = fallback_form;
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const json::exception& e) {
    line_error(it, "invalid_json_line", cat("line ", line, " is not valid JSON: ", e.what()));
    return it;
  }
  if (!j.is_object()) {
    line_error(it, "invalid_json_line", cat("line ", line, " is not a JSON object"));
    return it;
  }
  it.form = j.contains("custom_id") || j.contains("body") || j.contains("url") ? BatchForm::openai : BatchForm::simple;
  if (it.form == BatchForm::openai) parse_openai(it, j, default_schema, vocab_size);
  else parse_simple(it, j, default_schema, vocab_size);
  return it;
}

void mark_duplicate(BatchItem& it) {
  const std::string id = it.id.dump();
  line_error(it, "duplicate_id", cat("line ", it.line, ": id ", id, " already appears on an earlier line"));
}

std::string batch_error_line(const BatchItem& it) {
  const std::string msg = it.error.value_or("unknown error");
  if (it.form == BatchForm::simple) return finish({{"id", it.id}, {"error", error_object(it.error_code, msg)}}, it);
  if (it.error_status == 0) return finish(openai_envelope(it, nullptr, error_object(it.error_code, msg)), it);
  ojson body = {{"error", {{"message", msg}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", it.error_code}}}};
  return finish(openai_envelope(it, openai_response(it.error_status, std::move(body)), nullptr), it);
}

std::string batch_result_line(const BatchItem& it, const JobOutcome& o, const std::string& model_id,
                              std::shared_ptr<const ChatTemplate> tmpl) {
  if (!o.ok) {
    BatchItem e = it;
    e.error = o.error;
    e.error_code = o.rejected ? "invalid_request" : "generation_failed";
    e.error_status = 400;
    if (it.form == BatchForm::simple) return batch_error_line(e);
    const int status = o.rejected ? 400 : 500;
    ojson body = {{"error", {{"message", o.error}, {"type", o.rejected ? "invalid_request_error" : "server_error"},
                             {"param", nullptr}, {"code", e.error_code}}}};
    return finish(openai_envelope(it, openai_response(status, std::move(body)), nullptr), it);
  }
  const ojson usage = {{"prompt_tokens", o.stats.n_prompt_tokens},
                       {"completion_tokens", o.stats.n_generated},
                       {"total_tokens", o.stats.n_prompt_tokens + o.stats.n_generated}};
  if (it.form == BatchForm::simple) {
    ojson out = it.spec.schema ? o.json : ojson(o.text);
    return finish({{"id", it.id}, {"output", std::move(out)}, {"finish_reason", finish_reason_name(o.reason, false)},
                   {"usage", usage}},
                  it);
  }
  CompletionMeta meta;
  meta.chat = true;
  meta.tools_enabled = it.tools_enabled;
  meta.id = "chatcmpl-" + random_suffix();
  meta.created = int64_t(std::time(nullptr));
  meta.model = model_id;
  CompletionWriter w(std::move(meta), std::move(tmpl));
  GenerationEvent tok;
  tok.text = o.text;
  w.on_event(tok);
  GenerationEvent done;
  done.type = GenerationEvent::Type::done;
  done.reason = o.reason;
  done.stats = o.stats;
  w.on_event(done);
  const HttpResponse r = w.response();
  return finish(openai_envelope(it, openai_response(r.status, ojson::parse(r.body)), nullptr), it);
}

std::optional<std::string> batch_result_key(std::string_view result_line) {
  ojson j;
  try {
    j = ojson::parse(result_line);
  } catch (const json::exception&) {
    return std::nullopt;
  }
  if (!j.is_object()) return std::nullopt;
  if (auto l = j.find("line"); l != j.end() && l->is_number_unsigned()) return cat("#", l->get<size_t>());
  const auto id = j.contains("custom_id") ? j.find("custom_id") : j.find("id");
  if (id == j.end() || id->is_null()) return std::nullopt;
  return id->dump();
}

}  // namespace exl
