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
    : meta_(std::move(meta)), tmpl_(std::move(tmpl)), rng_(std::random_device{}()) {}

json CompletionWriter::usage() const {
  return {{"prompt_tokens", stats_.n_prompt_tokens},
          {"completion_tokens", stats_.n_generated},
          {"total_tokens", stats_.n_prompt_tokens + stats_.n_generated},
          {"prompt_tokens_details", {{"cached_tokens", stats_.n_cached_tokens}, {"audio_tokens", 0}}},
          {"completion_tokens_details",
           {{"reasoning_tokens", 0}, {"audio_tokens", 0}, {"accepted_prediction_tokens", 0},
            {"rejected_prediction_tokens", 0}}}};
}

ParsedReply CompletionWriter::parsed() const {
  if (!parsed_) {
    if (meta_.chat && meta_.tools_enabled && tmpl_) {
      parsed_ = tmpl_->parse_reply(text_, true);
      for (auto& c : parsed_->tool_calls)
        if (c.id.empty()) c.id = tmpl_->make_tool_call_id(rng_());
    } else {
      parsed_ = ParsedReply{text_, {}};
    }
  }
  return *parsed_;
}

json CompletionWriter::logprobs_json(size_t from, size_t to) const {
  if (meta_.top_logprobs < 0) return nullptr;
  auto text = [&](int32_t t) {
    return meta_.vocab && t >= 0 && size_t(t) < meta_.vocab->vocab_size() ? meta_.vocab->bytes(t) : std::string();
  };
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
  };
  if (meta_.chat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      const LogprobEntry& e = logprobs_[i];
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
    const LogprobEntry& e = logprobs_[i];
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

std::string CompletionWriter::chunk(const json& delta, const json& finish, size_t lp_end) {
  json j = {{"id", meta_.id}, {"created", meta_.created}, {"model", meta_.model}, {"system_fingerprint", "exlagent"}};
  lp_end = std::min(lp_end, logprobs_.size());
  const json lp = lp_end > lp_sent_ ? logprobs_json(lp_sent_, lp_end) : json(nullptr);
  lp_sent_ = std::max(lp_sent_, lp_end);
  if (meta_.chat) {
    j["object"] = "chat.completion.chunk";
    j["choices"] = json::array({{{"index", 0}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", finish}}});
  } else {
    j["object"] = "text_completion";
    j["choices"] = json::array({{{"index", 0}, {"text", delta}, {"logprobs", lp}, {"finish_reason", finish}}});
  }
  if (meta_.include_usage) j["usage"] = nullptr;
  return sse(j);
}

std::string CompletionWriter::begin() {
  if (!meta_.stream) return {};
  std::string out;
  if (meta_.chat) out += chunk({{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}}, nullptr, 0);
  else if (!meta_.echo.empty()) out += chunk(meta_.echo, nullptr, 0);
  return out;
}

std::string CompletionWriter::finish_events() {
  std::string out;
  if (reason_ == FinishReason::error) {
    ApiError e(500, "server_error", error_);
    out += "data: " + error_json(e) + "\n\n";
    return out + "data: [DONE]\n\n";
  }
  const ParsedReply r = parsed();
  if (meta_.chat && meta_.tools_enabled) {
    if (!r.content.empty()) out += chunk({{"content", r.content}}, nullptr);
    for (size_t i = 0; i < r.tool_calls.size(); ++i) {
      const auto& c = r.tool_calls[i];
      out += chunk({{"tool_calls", json::array({{{"index", i},
                                                {"id", c.id},
                                                {"type", "function"},
                                                {"function", {{"name", c.name}, {"arguments", c.arguments}}}}})}},
                   nullptr);
    }
  }
  const std::string fr = finish_reason_name(reason_, !r.tool_calls.empty());
  out += chunk(meta_.chat ? json::object() : json(""), fr);
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

std::string CompletionWriter::on_event(const GenerationEvent& e) {
  if (done_) return {};
  if (e.type == GenerationEvent::Type::token) {
    text_ += e.text;
    if (meta_.top_logprobs >= 0 && e.logprobs &&
        std::find(meta_.hidden_tokens.begin(), meta_.hidden_tokens.end(), e.token) == meta_.hidden_tokens.end())
      logprobs_.push_back({e.token, e.logprobs->logprob, e.logprobs->top});
    if (!meta_.stream || e.text.empty() || (meta_.chat && meta_.tools_enabled)) return {};
    return meta_.chat ? chunk({{"content", e.text}}, nullptr) : chunk(e.text, nullptr);
  }
  done_ = true;
  reason_ = e.reason;
  error_ = e.error;
  stats_ = e.stats;
  return meta_.stream ? finish_events() : std::string();
}

HttpResponse CompletionWriter::response() const {
  if (reason_ == FinishReason::error) return error_response(ApiError(500, "server_error", error_));
  const ParsedReply r = parsed();
  const std::string fr = finish_reason_name(reason_, !r.tool_calls.empty());
  json j = {{"id", meta_.id}, {"created", meta_.created}, {"model", meta_.model}, {"system_fingerprint", "exlagent"}};
  if (meta_.chat) {
    json msg = {{"role", "assistant"},
                {"content", r.content.empty() && !r.tool_calls.empty() ? json(nullptr) : json(r.content)},
                {"refusal", nullptr}};
    if (!r.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& c : r.tool_calls)
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      msg["tool_calls"] = calls;
    }
    j["object"] = "chat.completion";
    j["choices"] = json::array({{{"index", 0},
                                 {"message", msg},
                                 {"logprobs", logprobs_json(0, logprobs_.size())},
                                 {"finish_reason", fr}}});
  } else {
    j["object"] = "text_completion";
    j["choices"] =
        json::array({{{"index", 0}, {"text", meta_.echo + r.content}, {"logprobs", logprobs_json(0, logprobs_.size())},
                      {"finish_reason", fr}}});
  }
  j["usage"] = usage();
  HttpResponse resp;
  resp.body = dump(j);
  return resp;
}

}  // namespace exl
