#include "runtime/server/remote_tool.h"

#include "kernels/error.h"

namespace exl {

using json = nlohmann::json;

namespace {

std::string wire_dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string seconds_text(ToolClock::duration d) {
  return cat(double(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) / 1000.0, " s");
}

}  // namespace

ToolSpec parse_remote_tool_spec(const json& t) {
  EXL_CHECK(t.is_object(), "runtime: remote tool: a tool must be an object {name, description, inputSchema}");
  EXL_CHECK(t.contains("name") && t["name"].is_string(), "runtime: remote tool: 'name' must be a string");
  ToolSpec s;
  s.name = t["name"];
  bool ok = !s.name.empty() && s.name.size() <= 64;
  for (char c : s.name) ok &= std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  EXL_CHECK(ok, "runtime: remote tool: name '", s.name, "' must match ^[a-zA-Z0-9_-]{1,64}$");
  if (t.contains("description")) {
    EXL_CHECK(t["description"].is_string(), "runtime: remote tool '", s.name, "': 'description' must be a string");
    s.description = t["description"];
  }
  EXL_CHECK(t.contains("inputSchema") && t["inputSchema"].is_object(), "runtime: remote tool '", s.name,
            "': 'inputSchema' must be a JSON Schema object");
  const json& schema = t["inputSchema"];
  EXL_CHECK(!schema.contains("type") || schema["type"] == "object", "runtime: remote tool '", s.name,
            "': inputSchema must describe an object (type \"object\")");
  s.input_schema = schema;
  return s;
}

ToolResult tool_result_from_mcp(const json& r) {
  ToolResult out;
  if (!r.is_object()) return {"Error: the tool client sent a malformed result", true};
  if (r.contains("isError") && !r["isError"].is_boolean())
    return {"Error: the tool client sent a malformed result (isError is not a boolean)", true};
  out.is_error = r.value("isError", false);
  std::string text;
  if (r.contains("content") && r["content"].is_array())
    for (const auto& part : r["content"])
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string()) {
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
  if (text.empty() && r.contains("structuredContent")) text = wire_dump(r["structuredContent"]);
  out.content = std::move(text);
  return out;
}

ToolClientLink::ToolClientLink(Send send, boost::asio::any_io_executor timers, std::chrono::milliseconds poll)
    : send_(std::move(send)), timers_(std::move(timers)), poll_(poll) {}

bool ToolClientLink::connected() const {
  std::lock_guard lk(mu_);
  return connected_;
}

size_t ToolClientLink::pending() const {
  std::lock_guard lk(mu_);
  return pending_.size();
}

void ToolClientLink::call(const ToolSpec& spec, const json& arguments, ToolClock::time_point deadline,
                          std::shared_ptr<CancelToken> cancel, ToolDone done) {
  std::string id;
  {
    std::lock_guard lk(mu_);
    if (!connected_) {
      id.clear();
    } else {
      id = "tc-" + std::to_string(next_id_++);
      Pending p;
      p.tool = spec.name;
      p.start = ToolClock::now();
      p.deadline = deadline;
      p.cancel = cancel ? std::move(cancel) : std::make_shared<CancelToken>();
      p.done = std::move(done);
      p.timer = std::make_unique<boost::asio::steady_timer>(timers_);
      pending_.emplace(id, std::move(p));
    }
  }
  if (id.empty()) return done({cat("Error: tool '", spec.name, "' is unavailable: tool client disconnected"), true});
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - ToolClock::now()).count();
  send_(wire_dump({{"jsonrpc", "2.0"},
              {"id", id},
              {"method", "tools/call"},
              {"params",
               {{"name", spec.name},
                {"arguments", arguments},
                {"_meta", {{"progressToken", id}, {"exlagent/deadlineMs", std::max<int64_t>(ms, 0)}}}}}}));
  watch(id);
}

void ToolClientLink::watch(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  it->second.timer->expires_after(poll_);
  it->second.timer->async_wait([weak = weak_from_this(), id](boost::system::error_code ec) {
    auto self = weak.lock();
    if (ec || !self) return;
    std::string reason;
    ToolClock::duration waited{};
    {
      std::lock_guard lk(self->mu_);
      auto it = self->pending_.find(id);
      if (it == self->pending_.end()) return;
      if (ToolClock::now() >= it->second.deadline) reason = "deadline";
      else if (it->second.cancel->cancelled()) reason = "cancelled";
      waited = it->second.deadline - it->second.start;
    }
    if (reason.empty()) return self->watch(id);
    std::string tool;
    ToolDone done = self->take(id, &tool);
    if (!done) return;
    self->send_(wire_dump({{"jsonrpc", "2.0"},
                      {"method", "notifications/cancelled"},
                      {"params", {{"requestId", id}, {"reason", reason}}}}));
    done(reason == "deadline" ? ToolResult{cat("Error: Tool '", tool, "' timed out after ", seconds_text(waited)), true}
                              : ToolResult{cat("Error: tool '", tool, "' was cancelled"), true});
  });
}

ToolDone ToolClientLink::take(const std::string& id, std::string* tool) {
  std::lock_guard lk(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return nullptr;
  ToolDone done = std::move(it->second.done);
  if (tool) *tool = it->second.tool;
  it->second.timer->cancel();
  pending_.erase(it);
  return done;
}

bool ToolClientLink::on_response(const json& msg) {
  if (!msg.contains("id") || !msg["id"].is_string()) return false;
  std::string tool;
  ToolDone done = take(msg["id"].get<std::string>(), &tool);
  if (!done) return false;
  if (msg.contains("error")) {
    const json& e = msg["error"];
    std::string m = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                       : wire_dump(e);
    done({cat("Error: tool '", tool, "' failed: ", m), true});
  } else {
    done(tool_result_from_mcp(msg.value("result", json())));
  }
  return true;
}

bool ToolClientLink::on_progress(const json& params) {
  if (!params.is_object() || !params.contains("progressToken") || !params["progressToken"].is_string()) return false;
  std::lock_guard lk(mu_);
  auto it = pending_.find(params["progressToken"].get<std::string>());
  if (it == pending_.end()) return false;
  it->second.last_progress = params;
  return true;
}

void ToolClientLink::disconnect() {
  std::map<std::string, Pending> gone;
  {
    std::lock_guard lk(mu_);
    connected_ = false;
    gone.swap(pending_);
  }
  for (auto& [id, p] : gone) {
    p.timer->cancel();
    p.done({cat("Error: tool '", p.tool, "' failed: tool client disconnected"), true});
  }
}

void RemoteTool::invoke(const json& arguments, ToolClock::time_point deadline, std::shared_ptr<CancelToken> cancel,
                        ToolDone done) {
  if (auto link = link_.lock()) return link->call(spec_, arguments, deadline, std::move(cancel), std::move(done));
  done({cat("Error: tool '", spec_.name, "' is unavailable: tool client disconnected"), true});
}

}  // namespace exl
