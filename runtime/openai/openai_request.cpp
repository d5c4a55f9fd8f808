#include "runtime/openai/openai_request.h"

#include <cmath>
#include <cctype>
#include <cstdlib>

#include "runtime/openai/api_error.h"
#include "runtime/json_depth.h"

namespace exl {

namespace {

using ojson = nlohmann::ordered_json;


const ojson* field(const ojson& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

double number(const ojson& v, const char* name, double lo, double hi) {
  if (!v.is_number()) bad_request(cat("'", name, "' must be a number."), name);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad_request(cat("'", name, "' must be between ", lo, " and ", hi, ", got ", d, "."), name);
  return d;
}

int64_t integer(const ojson& v, const char* name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad_request(cat("'", name, "' must be an integer."), name);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    bad_request(cat("'", name, "' is too large."), name);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad_request(cat("'", name, "' must be between ", lo, " and ", hi, ", got ", x, "."), name);
  return x;
}

bool boolean(const ojson& v, const char* name) {
  if (!v.is_boolean()) bad_request(cat("'", name, "' must be a boolean."), name);
  return v.get<bool>();
}

GenerationRequest parse_common(const ojson& j, int64_t vocab_size) {
  GenerationRequest g;
  if (auto* v = field(j, "model")) {
    if (!v->is_string()) bad_request("'model' must be a string.", "model");
    g.model = v->get<std::string>();
  }
  if (auto* v = field(j, "stream")) g.stream = boolean(*v, "stream");
  if (auto* v = field(j, "stream_options")) {
    if (!v->is_object()) bad_request("'stream_options' must be an object.", "stream_options");
    if (!g.stream) bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options");
    if (auto* u = field(*v, "include_usage")) g.include_usage = boolean(*u, "stream_options.include_usage");
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (auto* v = field(j, name)) g.max_tokens = integer(*v, name, 1, INT32_MAX);
  if (auto* v = field(j, "stop")) {
    if (v->is_string()) g.stop.push_back(v->get<std::string>());
    else if (v->is_array() && v->size() <= 4) {
      for (const auto& s : *v) {
        if (!s.is_string()) bad_request("'stop' must be a string or an array of up to 4 strings.", "stop");
        g.stop.push_back(s.get<std::string>());
      }
    } else bad_request("'stop' must be a string or an array of up to 4 strings.", "stop");
    for (const auto& s : g.stop)
      if (s.empty()) bad_request("'stop' strings must not be empty.", "stop");
  }
  auto& s = g.sampling;
  if (auto* v = field(j, "temperature")) s.temperature = float(number(*v, "temperature", 0, 2));
  if (auto* v = field(j, "top_p")) s.top_p = float(number(*v, "top_p", 0, 1));
  if (auto* v = field(j, "top_k")) s.top_k = int32_t(integer(*v, "top_k", 0, INT32_MAX));
  if (auto* v = field(j, "min_p")) s.min_p = float(number(*v, "min_p", 0, 1));
  if (auto* v = field(j, "frequency_penalty")) s.frequency_penalty = float(number(*v, "frequency_penalty", -2, 2));
  if (auto* v = field(j, "presence_penalty")) s.presence_penalty = float(number(*v, "presence_penalty", -2, 2));
  if (auto* v = field(j, "repetition_penalty")) s.repetition_penalty = float(number(*v, "repetition_penalty", 0.01, 100));
  if (s.frequency_penalty != 0 || s.presence_penalty != 0) s.penalty_last_n = -1;
  if (auto* v = field(j, "seed")) s.seed = uint64_t(integer(*v, "seed", INT64_MIN, INT64_MAX));
  if (auto* v = field(j, "logit_bias")) {
    if (!v->is_object()) bad_request("'logit_bias' must be an object mapping token ids to biases.", "logit_bias");
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string& key = it.key();
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id >= vocab_size)
        bad_request(cat("'logit_bias' key '", key, "' is not a token id in [0, ", vocab_size, ")."), "logit_bias");
      s.logit_bias[int32_t(id)] = float(number(*it, "logit_bias", -100, 100));
    }
  }
  if (auto* v = field(j, "n")) g.n = int32_t(integer(*v, "n", 1, kMaxChoices));
  if (auto* v = field(j, "speculate")) {
    g.speculate = v->is_string() ? parse_speculation(v->get<std::string>()) : std::nullopt;
    if (!g.speculate) bad_request("'speculate' must be one of none, ngram, draft, auto.", "speculate");
  }
  return g;
}

std::string content_text(const ojson& c, const std::string& where) {
  if (c.is_null()) return {};
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (const auto& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        bad_request(cat("'", where, "' may only hold text parts ({\"type\":\"text\",\"text\":...})."), where);
      out += part["text"].get<std::string>();
    }
    return out;
  }
  bad_request(cat("'", where, "' must be a string or an array of text parts."), where);
}

bool valid_function_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (unsigned char c : n)
    if (!std::isalnum(c) && c != '_' && c != '-') return false;
  return true;
}

ChatMessage parse_message(const ojson& m, size_t i) {
  const std::string where = cat("messages[", i, "]");
  if (!m.is_object()) bad_request(cat("'", where, "' must be an object."), where);
  auto* role = field(m, "role");
  if (!role || !role->is_string()) bad_request(cat("'", where, ".role' is required."), where + ".role");
  ChatMessage out;
  out.role = role->get<std::string>();
  if (out.role == "developer") out.role = "system";
  if (out.role != "system" && out.role != "user" && out.role != "assistant" && out.role != "tool")
    bad_request(cat("'", where, ".role' must be one of system, developer, user, assistant, tool; got '", out.role, "'."),
                where + ".role");
  out.content = content_text(m.contains("content") ? m["content"] : ojson(), where + ".content");
  if (out.role == "tool") {
    auto* id = field(m, "tool_call_id");
    if (!id || !id->is_string()) bad_request(cat("'", where, ".tool_call_id' is required for tool messages."), where + ".tool_call_id");
    out.tool_call_id = id->get<std::string>();
  }
  if (auto* calls = field(m, "tool_calls"); calls && out.role == "assistant") {
    if (!calls->is_array()) bad_request(cat("'", where, ".tool_calls' must be an array."), where + ".tool_calls");
    for (size_t k = 0; k < calls->size(); ++k) {
      const auto& c = (*calls)[k];
      const std::string cw = cat(where, ".tool_calls[", k, "]");
      const ojson* fn = c.is_object() ? field(c, "function") : nullptr;
      if (!fn || !fn->is_object() || !field(*fn, "name") || !(*fn)["name"].is_string())
        bad_request(cat("'", cw, ".function.name' is required."), cw);
      ToolCall tc;
      tc.name = (*fn)["name"].get<std::string>();
      if (auto* id = field(c, "id"); id && id->is_string()) tc.id = id->get<std::string>();
      const ojson* args = field(*fn, "arguments");
      if (!args) tc.arguments = "{}";
      else if (args->is_string()) tc.arguments = args->get<std::string>();
      else if (args->is_object()) tc.arguments = args->dump();
      else bad_request(cat("'", cw, ".function.arguments' must be a JSON string."), cw);
      out.tool_calls.push_back(std::move(tc));
    }
  }
  return out;
}

}  // namespace

std::optional<uint64_t> choice_seed(std::optional<uint64_t> seed, int32_t index) {
  if (!seed || *seed == 0 || index == 0) return seed;
  uint64_t z = *seed + 0x9e3779b97f4a7c15ull * uint64_t(index);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z == 0 ? 1 : z;
}

ojson parse_request_body(std::string_view body) {
  ojson j = ojson::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded())
    throw ApiError(400, "invalid_request_error", "We could not parse the JSON body of your request: it is not valid JSON.",
                   {}, "invalid_json");
  if (!j.is_object()) bad_request("The request body must be a JSON object.", {}, "invalid_json");
  if (json_too_deep(j)) bad_request(cat("The request body nests deeper than ", kMaxJsonDepth, " levels."), {}, "invalid_json");
  return j;
}

ChatRequest parse_chat_request(std::string_view body, int64_t vocab_size) {
  const ojson j = parse_request_body(body);
  ChatRequest r;
  r.gen = parse_common(j, vocab_size);
  auto* msgs = field(j, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty())
    bad_request("'messages' must be a non-empty array.", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) r.messages.push_back(parse_message((*msgs)[i], i));

  if (auto* t = field(j, "tools")) {
    if (!t->is_array()) bad_request("'tools' must be an array.", "tools");
    for (size_t i = 0; i < t->size(); ++i) {
      const auto& tool = (*t)[i];
      const std::string where = cat("tools[", i, "]");
      if (!tool.is_object() || tool.value("type", "") != "function" || !field(tool, "function") ||
          !tool["function"].is_object())
        bad_request(cat("'", where, "' must be {\"type\":\"function\",\"function\":{...}}."), where);
      const auto& fn = tool["function"];
      if (!field(fn, "name") || !fn["name"].is_string() || !valid_function_name(fn["name"].get<std::string>()))
        bad_request(cat("'", where, ".function.name' must match [a-zA-Z0-9_-]{1,64}."), where + ".function.name");
      if (auto* p = field(fn, "parameters"); p && !p->is_object())
        bad_request(cat("'", where, ".function.parameters' must be a JSON Schema object."), where + ".function.parameters");
    }
    r.tools = *t;
  }
  const bool logprobs = field(j, "logprobs") && boolean(j["logprobs"], "logprobs");
  if (auto* v = field(j, "top_logprobs")) {
    const int64_t n = integer(*v, "top_logprobs", 0, kMaxTopLogprobs);
    if (!logprobs) bad_request("'top_logprobs' needs 'logprobs' set to true.", "top_logprobs");
    r.gen.top_logprobs = int32_t(n);
  } else if (logprobs) {
    r.gen.top_logprobs = 0;
  }
  r.tool_choice = r.tools.empty() ? ToolChoice::none : ToolChoice::auto_;
  if (auto* tc = field(j, "tool_choice")) {
    if (tc->is_string()) {
      const auto s = tc->get<std::string>();
      if (s == "none") r.tool_choice = ToolChoice::none;
      else if (s == "auto") r.tool_choice = ToolChoice::auto_;
      else if (s == "required") r.tool_choice = ToolChoice::required;
      else bad_request("'tool_choice' must be none, auto, required or {\"type\":\"function\",...}.", "tool_choice");
    } else if (tc->is_object() && tc->value("type", "") == "function" && tc->contains("function") &&
               (*tc)["function"].is_object() && (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string()) {
      r.tool_choice = ToolChoice::named;
      r.tool_choice_name = (*tc)["function"]["name"].get<std::string>();
      bool known = false;
      for (const auto& t : r.tools) known |= t["function"]["name"] == r.tool_choice_name;
      if (!known) bad_request(cat("'tool_choice' names function '", r.tool_choice_name, "', which is not in 'tools'."), "tool_choice");
    } else {
      bad_request("'tool_choice' must be none, auto, required or {\"type\":\"function\",...}.", "tool_choice");
    }
    if (r.tool_choice != ToolChoice::none && r.tools.empty())
      bad_request("'tool_choice' is set but 'tools' is empty.", "tool_choice");
  }
  if (auto* p = field(j, "parallel_tool_calls")) r.parallel_tool_calls = boolean(*p, "parallel_tool_calls");
  if (auto* rf = field(j, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad_request("'response_format' must be an object with a 'type'.", "response_format");
    r.response_format = (*rf)["type"].get<std::string>();
    if (r.response_format == "json_schema") {
      const ojson* js = field(*rf, "json_schema");
      if (!js || !js->is_object() || !field(*js, "name") || !(*js)["name"].is_string() ||
          !valid_function_name((*js)["name"].get<std::string>()))
        bad_request("'response_format.json_schema.name' is required and must match [a-zA-Z0-9_-]{1,64}.",
                    "response_format.json_schema");
      if (auto* sc = field(*js, "schema")) {
        if (!sc->is_object() && !sc->is_boolean())
          bad_request("'response_format.json_schema.schema' must be a JSON Schema.", "response_format.json_schema.schema");
        r.json_schema = *sc;
      }
    } else if (r.response_format != "text" && r.response_format != "json_object") {
      bad_request("'response_format.type' must be text, json_object or json_schema.", "response_format.type");
    }
  }
  return r;
}

CompletionRequest parse_completion_request(std::string_view body, int64_t vocab_size) {
  const ojson j = parse_request_body(body);
  CompletionRequest r;
  r.gen = parse_common(j, vocab_size);
  auto* p = field(j, "prompt");
  if (p && p->is_string()) r.prompt = p->get<std::string>();
  else if (p && p->is_array() && p->size() == 1 && (*p)[0].is_string()) r.prompt = (*p)[0].get<std::string>();
  else bad_request("'prompt' must be a string (or an array holding one string).", "prompt");
  if (auto* e = field(j, "echo")) r.echo = boolean(*e, "echo");
  if (auto* v = field(j, "logprobs")) r.gen.top_logprobs = int32_t(integer(*v, "logprobs", 0, kMaxCompletionLogprobs));
  return r;
}

}  // namespace exl
