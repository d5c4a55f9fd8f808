#include "runtime/openai/responses_request.h"

#include "runtime/json_depth.h"
#include "runtime/openai/api_error.h"
#include "runtime/openai/openai_request.h"

namespace exl {

namespace {

using ojson = nlohmann::ordered_json;

const ojson* responses_field(const ojson& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

// Content as a string or parts of input_text / output_text, joined.
std::string responses_content(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_request(cat("'", where, "' must be a string or an array of input_text parts."), where);
  std::string out;
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& part = c[k];
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if ((type != "input_text" && type != "output_text") || !part.contains("text") || !part["text"].is_string())
      bad_request(cat("'", where, "[", k, "]' must be {\"type\":\"input_text\",\"text\":...}; this server reads text only",
                      type.empty() ? std::string(".") : cat(", not '", type, "'.")),
                  cat(where, "[", k, "]"));
    out += part["text"].get<std::string>();
  }
  return out;
}

std::string string_field(const ojson& item, const char* name, const std::string& where) {
  const ojson* v = responses_field(item, name);
  if (!v || !v->is_string()) bad_request(cat("'", where, ".", name, "' must be a string."), cat(where, ".", name));
  return v->get<std::string>();
}

ojson responses_messages(const ojson& input) {
  ojson messages = ojson::array();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return messages;
  }
  if (!input.is_array() || input.empty()) bad_request("'input' must be a string or a non-empty array of items.", "input");
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string where = cat("input[", i, "]");
    if (!item.is_object()) bad_request(cat("'", where, "' must be an object."), where);
    const std::string type = item.value("type", "message");
    if (type == "message") {
      const ojson* role = responses_field(item, "role");
      if (!role || !role->is_string()) bad_request(cat("'", where, ".role' is required."), where + ".role");
      const ojson* content = responses_field(item, "content");
      if (!content) bad_request(cat("'", where, ".content' is required."), where + ".content");
      messages.push_back({{"role", *role}, {"content", responses_content(*content, where + ".content")}});
    } else if (type == "function_call") {
      ojson call = {{"id", string_field(item, "call_id", where)},
                    {"type", "function"},
                    {"function", {{"name", string_field(item, "name", where)},
                                  {"arguments", string_field(item, "arguments", where)}}}};
      if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls"))
        messages.back()["tool_calls"].push_back(std::move(call));
      else
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({std::move(call)})}});
    } else if (type == "function_call_output") {
      const ojson* output = responses_field(item, "output");
      if (!output) bad_request(cat("'", where, ".output' is required."), where + ".output");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", string_field(item, "call_id", where)},
                          {"content", responses_content(*output, where + ".output")}});
    } else {
      bad_request(cat("'", where, ".type' is '", type,
                      "'; this server reads message, function_call and function_call_output items."),
                  where + ".type");
    }
  }
  return messages;
}

ojson responses_tools(const ojson& tools) {
  if (!tools.is_array()) bad_request("'tools' must be an array.", "tools");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string where = cat("tools[", i, "]");
    if (!t.is_object() || t.value("type", "") != "function")
      bad_request(cat("'", where, ".type' must be 'function'; this server has no built-in tools."), where + ".type");
    ojson fn = {{"name", t.contains("name") ? t["name"] : ojson()}};
    if (const ojson* d = responses_field(t, "description")) fn["description"] = *d;
    if (const ojson* p = responses_field(t, "parameters")) fn["parameters"] = *p;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

ojson responses_format(const ojson& text) {
  if (!text.is_object()) bad_request("'text' must be an object.", "text");
  const ojson* format = responses_field(text, "format");
  if (!format) return {{"type", "text"}};
  if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string())
    bad_request("'text.format' must be an object with a 'type'.", "text.format");
  const std::string type = (*format)["type"].get<std::string>();
  if (type == "text" || type == "json_object") return {{"type", type}};
  if (type != "json_schema")
    bad_request("'text.format.type' must be text, json_object or json_schema.", "text.format.type");
  ojson js = {{"name", format->contains("name") ? (*format)["name"] : ojson()}};
  if (const ojson* s = responses_field(*format, "schema")) js["schema"] = *s;
  if (const ojson* s = responses_field(*format, "strict")) js["strict"] = *s;
  return {{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

}  // namespace

ResponsesRequest parse_responses_request(std::string_view body, int64_t vocab_size) {
  ojson j = parse_request_body(body);
  for (const char* name : {"previous_response_id", "conversation"})
    if (responses_field(j, name))
      bad_request(cat("'", name, "' is not supported: this server keeps no responses; send the whole conversation as 'input'."),
                  name);
  if (const ojson* b = responses_field(j, "background"); b && *b != false)
    bad_request("'background' is not supported: this server keeps no responses.", "background");
  if (const ojson* s = responses_field(j, "store"); s && *s != false)
    bad_request("'store' must be false: this server keeps no responses.", "store");
  const ojson* input = responses_field(j, "input");
  if (!input) bad_request("'input' is required.", "input");

  ojson chat = ojson::object();
  ojson messages = ojson::array();
  std::string instructions;
  if (const ojson* ins = responses_field(j, "instructions")) {
    if (!ins->is_string()) bad_request("'instructions' must be a string.", "instructions");
    instructions = ins->get<std::string>();
    messages.push_back({{"role", "system"}, {"content", instructions}});
  }
  for (auto& m : responses_messages(*input)) messages.push_back(std::move(m));
  chat["messages"] = std::move(messages);
  for (const char* name : {"model", "stream", "temperature", "top_p", "parallel_tool_calls", "seed"})
    if (const ojson* v = responses_field(j, name)) chat[name] = *v;
  if (const ojson* v = responses_field(j, "max_output_tokens")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 1)
      bad_request("'max_output_tokens' must be a positive integer.", "max_output_tokens");
    chat["max_tokens"] = *v;
  }
  if (const ojson* t = responses_field(j, "tools")) chat["tools"] = responses_tools(*t);
  if (const ojson* tc = responses_field(j, "tool_choice")) {
    if (tc->is_object() && tc->value("type", "") == "function")
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc->contains("name") ? (*tc)["name"] : ojson()}}}};
    else
      chat["tool_choice"] = *tc;
  }
  ojson format = {{"type", "text"}};
  if (const ojson* t = responses_field(j, "text")) {
    format = responses_format(*t);
    chat["response_format"] = format;
  }

  ResponsesRequest r;
  r.chat = parse_chat_request(chat.dump(), vocab_size);
  ojson text_format = format;
  if (format["type"] == "json_schema") {
    text_format = format["json_schema"];
    text_format["type"] = "json_schema";
  }
  r.echo = {{"instructions", instructions.empty() ? ojson() : ojson(instructions)},
            {"max_output_tokens", r.chat.gen.max_tokens ? ojson(*r.chat.gen.max_tokens) : ojson()},
            {"parallel_tool_calls", r.chat.parallel_tool_calls},
            {"temperature", r.chat.gen.sampling.temperature},
            {"top_p", r.chat.gen.sampling.top_p},
            {"tool_choice", j.contains("tool_choice") && !j["tool_choice"].is_null() ? j["tool_choice"] : ojson("auto")},
            {"tools", j.contains("tools") && j["tools"].is_array() ? j["tools"] : ojson::array()},
            {"text", {{"format", text_format}}}};
  return r;
}

}  // namespace exl
