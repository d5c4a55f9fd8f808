#include "runtime/openai/completion_writer.h"

#include <algorithm>

#include "runtime/openai/api_error.h"

namespace exl {

namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace

std::string finish_reason_name(FinishReason r, bool has_tool_calls) {
  if (has_tool_calls) return "tool_calls";
  return r == FinishReason::max_tokens ? "length" : "stop";
}

CompletionWriter::CompletionWriter(CompletionMeta meta, std::shared_ptr<const ChatTemplate> tmpl)
    : meta_(std::move(meta)), tmpl_(std::move(tmpl)), rng_(std::random_device{}()) {
  choices_.resize(size_t(std::max<int32_t>(1, meta_.n)));
}

GenerationStats CompletionWriter::stats() const {
  GenerationStats s = choices_[0].stats;
  s.n_generated = 0;
  for (const Choice& c : choices_) s.n_generated += c.stats.n_generated;
  return s;
}

json CompletionWriter::usage() const {
  const GenerationStats s = stats();
  return {{"prompt_tokens", s.n_prompt_tokens},
          {"completion_tokens", s.n_generated},
          {"total_tokens", s.n_prompt_tokens + s.n_generated},
          {"prompt_tokens_details", {{"cached_tokens", s.n_cached_tokens}, {"audio_tokens", 0}}},
          {"completion_tokens_details",
           {{"reasoning_tokens", 0}, {"audio_tokens", 0}, {"accepted_prediction_tokens", 0},
            {"rejected_prediction_tokens", 0}}}};
}

const ParsedReply& CompletionWriter::parsed(size_t choice) const {
  Choice& c = choices_[choice];
  if (!c.parsed) {
    if (meta_.chat && meta_.tools_enabled && tmpl_) {
      c.parsed = tmpl_->parse_reply(c.text, true);
      for (auto& call : c.parsed->tool_calls)
        if (call.id.empty()) call.id = tmpl_->make_tool_call_id(rng_());
    } else {
      c.parsed = ParsedReply{c.text, {}};
    }
  }
  return *c.parsed;
}

json CompletionWriter::logprobs_json(const Choice& c, size_t from, size_t to) const {
  if (meta_.top_logprobs < 0) return nullptr;
  auto text = [&](int32_t t) {
    return meta_.vocab && t >= 0 && size_t(t) < meta_.vocab->vocab_size() ? meta_.vocab->bytes(t) : std::string();
  };
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(int(ch));
    return b;
  };
  if (meta_.chat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      const LogprobEntry& e = c.logprobs[i];
      json top = json::array();
      for (const auto& [t, lp] : e.top) top.push_back({{"token", text(t)}, {"logprob", lp}, {"bytes", bytes(text(t))}});
      content.push_back(
          {{"token", text(e.token)}, {"logprob", e.logprob}, {"bytes", bytes(text(e.token))}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  size_t offset = meta_.echo.size();
  for (size_t i = 0; i < to; ++i) {
    const LogprobEntry& e = c.logprobs[i];
    if (i >= from) {
      tokens.push_back(text(e.token));
      token_logprobs.push_back(e.logprob);
      json top = json::object();
      for (const auto& [t, lp] : e.top)
        if (!top.contains(text(t))) top[text(t)] = lp;
      top_logprobs.push_back(top);
      offsets.push_back(offset);
    }
    offset += text(e.token).size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", offsets}};
}

std::string CompletionWriter::chunk(size_t choice, const json& delta, const json& finish, size_t lp_end) {
  Choice& c = choices_[choice];
  json j = {{"id", meta_.id}, {"created", meta_.created}, {"model", meta_.model}, {"system_fingerprint", "exlagent"}};
  lp_end = std::min(lp_end, c.logprobs.size());
  const json lp = lp_end > c.lp_sent ? logprobs_json(c, c.lp_sent, lp_end) : json(nullptr);
  c.lp_sent = std::max(c.lp_sent, lp_end);
  if (meta_.chat) {
    j["object"] = "chat.completion.chunk";
    j["choices"] = json::array({{{"index", choice}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", finish}}});
  } else {
    j["object"] = "text_completion";
    j["choices"] = json::array({{{"index", choice}, {"text", delta}, {"logprobs", lp}, {"finish_reason", finish}}});
  }
  if (meta_.include_usage) j["usage"] = nullptr;
  return sse(j);
}

std::string CompletionWriter::begin() {
  if (!meta_.stream) return {};
  if (meta_.responses) return responses_begin();
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (meta_.chat) out += chunk(i, {{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}}, nullptr, 0);
    else if (!meta_.echo.empty()) out += chunk(i, meta_.echo, nullptr, 0);
  }
  return out;
}

std::string CompletionWriter::finish_events(size_t choice) {
  std::string out;
  const Choice& ch = choices_[choice];
  const ParsedReply& r = parsed(choice);
  if (meta_.chat && meta_.tools_enabled) {
    if (!r.content.empty()) out += chunk(choice, {{"content", r.content}}, nullptr);
    for (size_t i = 0; i < r.tool_calls.size(); ++i) {
      const auto& c = r.tool_calls[i];
      out += chunk(choice,
                   {{"tool_calls", json::array({{{"index", i},
                                                 {"id", c.id},
                                                 {"type", "function"},
                                                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}}})}},
                   nullptr);
    }
  }
  const std::string fr = finish_reason_name(ch.reason, !r.tool_calls.empty());
  out += chunk(choice, meta_.chat ? json::object() : json(""), fr);
  return out;
}

std::string CompletionWriter::end_events() {
  std::string out;
  if (!error_.empty()) {
    if (meta_.responses)
      return response_event("error", {{"code", "server_error"}, {"message", error_}, {"param", nullptr}});
    ApiError e(500, "server_error", error_);
    out += "data: " + error_json(e) + "\n\n";
    return out + "data: [DONE]\n\n";
  }
  if (meta_.include_usage) {
    json j = {{"id", meta_.id},
              {"object", meta_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", meta_.created},
              {"model", meta_.model},
              {"system_fingerprint", "exlagent"},
              {"choices", json::array()},
              {"usage", usage()}};
    out += sse(j);
  }
  return out + "data: [DONE]\n\n";
}

std::string CompletionWriter::on_event(size_t choice, const GenerationEvent& e) {
  if (done_ || choice >= choices_.size() || choices_[choice].done) return {};
  Choice& c = choices_[choice];
  if (e.type == GenerationEvent::Type::token) {
    c.text += e.text;
    if (meta_.top_logprobs >= 0 && e.logprobs &&
        std::find(meta_.hidden_tokens.begin(), meta_.hidden_tokens.end(), e.token) == meta_.hidden_tokens.end())
      c.logprobs.push_back({e.token, e.logprobs->logprob, e.logprobs->top});
    if (!meta_.stream || e.text.empty() || (meta_.chat && meta_.tools_enabled)) return {};
    if (meta_.responses)
      return response_event("response.output_text.delta", {{"item_id", message_item_id()},
                                                           {"output_index", 0},
                                                           {"content_index", 0},
                                                           {"delta", e.text},
                                                           {"logprobs", json::array()}});
    return meta_.chat ? chunk(choice, {{"content", e.text}}, nullptr) : chunk(choice, e.text, nullptr);
  }
  c.done = true;
  c.reason = e.reason;
  c.error = e.error;
  c.stats = e.stats;
  if (e.reason == FinishReason::error) {
    error_ = e.error.empty() ? "generation failed" : e.error;
    done_ = true;
    return meta_.stream ? end_events() : std::string();
  }
  done_ = std::all_of(choices_.begin(), choices_.end(), [](const Choice& x) { return x.done; });
  if (!meta_.stream) return {};
  if (meta_.responses) return responses_done();
  std::string out = finish_events(choice);
  if (done_) out += end_events();
  return out;
}

HttpResponse CompletionWriter::response() const {
  if (!error_.empty()) return error_response(ApiError(500, "server_error", error_));
  if (meta_.responses) {
    HttpResponse resp;
    resp.body = dump(response_object(true));
    return resp;
  }
  json j = {{"id", meta_.id}, {"created", meta_.created}, {"model", meta_.model}, {"system_fingerprint", "exlagent"}};
  json out = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const ParsedReply& r = parsed(i);
    const std::string fr = finish_reason_name(c.reason, !r.tool_calls.empty());
    if (meta_.chat) {
      json msg = {{"role", "assistant"},
                  {"content", r.content.empty() && !r.tool_calls.empty() ? json(nullptr) : json(r.content)},
                  {"refusal", nullptr}};
      if (!r.tool_calls.empty()) {
        json calls = json::array();
        for (const auto& call : r.tool_calls)
          calls.push_back(
              {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        msg["tool_calls"] = calls;
      }
      out.push_back(
          {{"index", i}, {"message", msg}, {"logprobs", logprobs_json(c, 0, c.logprobs.size())}, {"finish_reason", fr}});
    } else {
      out.push_back({{"index", i},
                     {"text", meta_.echo + r.content},
                     {"logprobs", logprobs_json(c, 0, c.logprobs.size())},
                     {"finish_reason", fr}});
    }
  }
  j["object"] = meta_.chat ? "chat.completion" : "text_completion";
  j["choices"] = std::move(out);
  j["usage"] = usage();
  HttpResponse resp;
  resp.body = dump(j);
  return resp;
}

// --- Responses API ---------------------------------------------------------------------------

std::string CompletionWriter::response_event(const std::string& type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence_++;
  return "event: " + type + "\ndata: " + dump(fields) + "\n\n";
}

std::string CompletionWriter::message_item_id() const { return "msg_" + meta_.id.substr(meta_.id.find('_') + 1); }

json CompletionWriter::output_items() const {
  json items = json::array();
  const Choice& c = choices_[0];
  const ParsedReply& r = parsed(0);
  const bool incomplete = c.done && c.reason == FinishReason::max_tokens;
  if (!r.content.empty() || r.tool_calls.empty())
    items.push_back({{"type", "message"},
                     {"id", message_item_id()},
                     {"status", incomplete ? "incomplete" : "completed"},
                     {"role", "assistant"},
                     {"content", json::array({{{"type", "output_text"},
                                               {"text", r.content},
                                               {"annotations", json::array()},
                                               {"logprobs", json::array()}}})}});
  for (size_t k = 0; k < r.tool_calls.size(); ++k) {
    const ToolCall& call = r.tool_calls[k];
    items.push_back({{"type", "function_call"},
                     {"id", cat("fc_", meta_.id.substr(meta_.id.find('_') + 1), "_", k)},
                     {"call_id", call.id},
                     {"name", call.name},
                     {"arguments", call.arguments},
                     {"status", "completed"}});
  }
  return items;
}

json CompletionWriter::response_object(bool final) const {
  const Choice& c = choices_[0];
  const bool incomplete = final && c.reason == FinishReason::max_tokens;
  json j = {{"id", meta_.id},
            {"object", "response"},
            {"created_at", meta_.created},
            {"status", !final ? "in_progress" : incomplete ? "incomplete" : "completed"},
            {"error", nullptr},
            {"incomplete_details", incomplete ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
            {"model", meta_.model},
            {"output", final ? output_items() : json::array()},
            {"previous_response_id", nullptr},
            {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
            {"store", false},
            {"truncation", "disabled"},
            {"user", nullptr},
            {"metadata", json::object()},
            {"usage", nullptr}};
  if (meta_.response_echo.is_object())
    for (auto it = meta_.response_echo.begin(); it != meta_.response_echo.end(); ++it) j[it.key()] = it.value();
  if (final) {
    const GenerationStats s = stats();
    j["usage"] = {{"input_tokens", s.n_prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", s.n_cached_tokens}}},
                  {"output_tokens", s.n_generated},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", s.n_prompt_tokens + s.n_generated}};
  }
  return j;
}

std::string CompletionWriter::responses_begin() {
  std::string out = response_event("response.created", {{"response", response_object(false)}});
  out += response_event("response.in_progress", {{"response", response_object(false)}});
  if (meta_.tools_enabled) return out;
  json item = {{"type", "message"}, {"id", message_item_id()}, {"status", "in_progress"}, {"role", "assistant"},
               {"content", json::array()}};
  out += response_event("response.output_item.added", {{"output_index", 0}, {"item", item}});
  out += response_event("response.content_part.added",
                        {{"item_id", message_item_id()},
                         {"output_index", 0},
                         {"content_index", 0},
                         {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  return out;
}

std::string CompletionWriter::responses_done() {
  std::string out;
  const json items = output_items();
  for (size_t i = 0; i < items.size(); ++i) {
    const json& item = items[i];
    if (item["type"] == "message") {
      const json& part = item["content"][0];
      if (meta_.tools_enabled) {
        json opening = item;
        opening["status"] = "in_progress";
        opening["content"] = json::array();
        out += response_event("response.output_item.added", {{"output_index", i}, {"item", opening}});
        out += response_event("response.content_part.added",
                              {{"item_id", item["id"]},
                               {"output_index", i},
                               {"content_index", 0},
                               {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
        if (!part["text"].get<std::string>().empty())
          out += response_event("response.output_text.delta", {{"item_id", item["id"]},
                                                               {"output_index", i},
                                                               {"content_index", 0},
                                                               {"delta", part["text"]},
                                                               {"logprobs", json::array()}});
      }
      out += response_event("response.output_text.done", {{"item_id", item["id"]},
                                                          {"output_index", i},
                                                          {"content_index", 0},
                                                          {"text", part["text"]},
                                                          {"logprobs", json::array()}});
      out += response_event("response.content_part.done",
                            {{"item_id", item["id"]}, {"output_index", i}, {"content_index", 0}, {"part", part}});
    } else {
      json opening = item;
      opening["arguments"] = "";
      opening["status"] = "in_progress";
      out += response_event("response.output_item.added", {{"output_index", i}, {"item", opening}});
      out += response_event("response.function_call_arguments.delta",
                            {{"item_id", item["id"]}, {"output_index", i}, {"delta", item["arguments"]}});
      out += response_event("response.function_call_arguments.done",
                            {{"item_id", item["id"]}, {"output_index", i}, {"name", item["name"]},
                             {"arguments", item["arguments"]}});
    }
    out += response_event("response.output_item.done", {{"output_index", i}, {"item", item}});
  }
  const json final = response_object(true);
  out += response_event(final["status"] == "incomplete" ? "response.incomplete" : "response.completed",
                        {{"response", final}});
  return out;
}

}  // namespace exl
