// The Streamable HTTP transport (MCP 2025-06-18), client side, on Boost.Beast:
//  - every message is a POST of one JSON-RPC message to the URL, on its own connection, with
//    `Accept: application/json, text/event-stream`; a request's answer comes back as an
//    application/json body or as a text/event-stream whose events carry JSON-RPC messages (the
//    server's notifications and requests on the way, then the response, after which the stream is
//    closed by us); notifications and our replies to the server's requests expect 202;
//  - the `Mcp-Session-Id` header of the initialize response is sent with every later message,
//    and `MCP-Protocol-Version` once it is agreed; stop() DELETEs the session (waiting at most
//    kill_grace);
//  - HTTP 404 to a message that carries the session id means the server ended the session: the
//    link ends, and the client's next call re-initializes (its restart);
//  - a server that cannot be reached, resets the connection or answers other statuses fails that
//    request only (the next call tries again); a request past its deadline or cancelled is given
//    up: its connection is closed and `notifications/cancelled` POSTed.
//  - once initialized, a GET opens the server's own event stream (its list_changed and requests
//    outside any call), read until the link stops; a server without one (405) is left alone.
// No TLS: http:// only; no resumption of a broken stream (Last-Event-ID).
#include <atomic>
#include <deque>
#include <optional>
#include <set>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/src.hpp>  // Boost.URL is compiled header-only, in this its one user

#include "kernels/error.h"
#include "tools/mcp/mcp_link.h"

namespace exl {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using json = nlohmann::json;

McpHttpTarget parse_mcp_http_url(std::string_view url) {
  auto parsed = boost::urls::parse_uri(url);
  EXL_CHECK(parsed.has_value(), "'", url, "' is not a URL (", parsed.error().message(), ")");
  const boost::urls::url_view u = *parsed;
  EXL_CHECK(u.scheme() == "http", "'", url, "': only http:// URLs are supported (this build has no TLS)");
  EXL_CHECK(!u.encoded_host().empty(), "'", url, "' names no host");
  EXL_CHECK(!u.has_userinfo(), "'", url, "': user information in the URL is not supported");
  McpHttpTarget t;
  t.host = u.host_address();
  t.port = u.has_port() ? std::string(u.port()) : "80";
  EXL_CHECK(!t.port.empty(), "'", url, "' has an empty port");
  t.target = std::string(u.encoded_path());
  if (t.target.empty()) t.target = "/";
  if (u.has_query()) t.target += cat("?", std::string(u.encoded_query()));
  t.host_header = std::string(u.encoded_host_and_port());
  return t;
}

namespace {

// One HTTP exchange: a POST (or the DELETE) and its response. Handlers run on the link's thread.
struct McpHttpExchange {
  explicit McpHttpExchange(net::io_context& ioc) : resolver(ioc), stream(ioc), timer(ioc) {}
  http::verb verb = http::verb::post;
  std::string body;      // the JSON-RPC message; empty for the DELETE
  int64_t id = 0;        // the request's id (set on the link's thread); 0: no answer expected
  bool notification = false;  // a notification or a reply to the server: requests wait for it
  std::string method;
  McpReply reply;        // may be empty
  ToolClock::time_point deadline, sent;
  std::shared_ptr<CancelToken> cancel;
  net::ip::tcp::resolver resolver;
  beast::tcp_stream stream;
  net::steady_timer timer;
  beast::flat_buffer buf;
  http::request<http::string_body> req;
  std::optional<http::response_parser<http::string_body>> parser;
  std::string sse_pending;  // bytes of the event stream not yet split into lines
  std::string sse_data;     // the data lines of the event being read
  bool sse_has_data = false;
  std::atomic<bool> answered{false};
};
using McpHttpX = std::shared_ptr<McpHttpExchange>;

class McpHttpLink : public McpLink, public std::enable_shared_from_this<McpHttpLink> {
 public:
  McpHttpLink(const McpServerConfig& c, std::shared_ptr<McpLog> l, McpLinkEvents e)
      : url_(c.url), target_(parse_mcp_http_url(c.url)), max_bytes_(c.max_line_bytes), grace_(c.kill_grace),
        log_(std::move(l)), events_(std::move(e)) {}

  std::string start() override {
    work_.emplace(net::make_work_guard(ioc_));
    thread_ = std::thread([self = shared_from_this()] { self->ioc_.run(); });
    return "";
  }

  void request(const std::string& method, json params, ToolClock::time_point deadline,
               std::shared_ptr<CancelToken> cancel, McpReply reply) override {
    auto x = std::make_shared<McpHttpExchange>(ioc_);
    x->method = method;
    x->deadline = deadline;
    x->cancel = std::move(cancel);
    x->reply = std::move(reply);  // set before x is live: stop() may complete it at once
    int64_t id = 0;
    std::string ended;
    {
      std::lock_guard lk(mu_);
      if (ended_) {
        ended = end_reason_;
      } else {
        id = next_id_++;
        live_.insert(x);
      }
    }
    if (!ended.empty()) return x->reply({{}, {}, ended});
    net::post(ioc_, [self = shared_from_this(), x, id, params = std::move(params)]() mutable {
      x->id = id;
      x->body = json{{"jsonrpc", "2.0"}, {"id", id}, {"method", x->method}, {"params", std::move(params)}}.dump(
          -1, ' ', false, json::error_handler_t::replace);
      self->launch(x);
    });
  }

  void notify(const std::string& method, json params) override {
    json msg = {{"jsonrpc", "2.0"}, {"method", method}};
    if (!params.is_null()) msg["params"] = std::move(params);
    post_message(msg, method);
    if (method == "notifications/initialized") listen();
  }

  void stop() override {
    std::vector<McpHttpX> live;
    std::string sid;
    bool first_end = false;
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
      stopping_ = true;
      first_end = !ended_;
      if (!ended_) {
        ended_ = true;
        end_reason_ = "was stopped (the client is shutting down)";
      }
      live.assign(live_.begin(), live_.end());
      live_.clear();
      sid = session_id_;
    }
    for (auto& x : live) complete(x, {{}, {}, "was stopped (the client is shutting down)"});
    net::post(ioc_, [self = shared_from_this(), live, sid] {
      for (auto& x : live) self->abort(x);
      if (sid.empty()) return self->work_.reset();
      auto x = std::make_shared<McpHttpExchange>(self->ioc_);
      x->verb = http::verb::delete_;
      x->method = "DELETE";
      x->deadline = ToolClock::now() + self->grace_;
      x->reply = [self](McpAnswer) { self->work_.reset(); };
      self->launch(x);
    });
    if (first_end && events_.ended) events_.ended(this, "was stopped (the client is shutting down)");
  }

  void join() override {
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
    else thread_.join();
  }

 private:
  // A message that expects no answer (a notification, our reply to a server request).
  void post_message(const json& msg, const std::string& what) {
    auto x = std::make_shared<McpHttpExchange>(ioc_);
    x->notification = true;
    x->method = what;
    x->body = msg.dump(-1, ' ', false, json::error_handler_t::replace);
    x->deadline = ToolClock::now() + std::max(grace_, std::chrono::milliseconds(10000));
    {
      std::lock_guard lk(mu_);
      if (ended_) return;
      live_.insert(x);
    }
    net::post(ioc_, [self = shared_from_this(), x] { self->launch(x); });
  }

  // The GET stream for the server's own messages (list_changed, ...), opened once the session is
  // initialized and read until the link stops; a server that offers none (405) is left alone.
  void listen() {
    auto x = std::make_shared<McpHttpExchange>(ioc_);
    x->verb = http::verb::get;
    x->method = "GET";
    x->deadline = ToolClock::time_point::max();
    {
      std::lock_guard lk(mu_);
      if (ended_) return;
      live_.insert(x);
    }
    net::post(ioc_, [self = shared_from_this(), x] { self->launch(x); });
  }

  // On the link's thread from here on.
  void launch(const McpHttpX& x) {
    if (x->answered) return;
    // A request waits for the notifications sent before it (notifications/initialized before the
    // first tools/list), as each message travels on its own connection.
    if (x->id > 0 && notifying_ > 0) return deferred_.push_back(x);
    if (x->notification) ++notifying_;
    x->sent = ToolClock::now();
    watch(x);
    x->resolver.async_resolve(target_.host, target_.port,
                              [self = shared_from_this(), x](beast::error_code ec, net::ip::tcp::resolver::results_type r) {
                                if (ec) return self->fail_transport(x, ec, "resolve");
                                x->stream.async_connect(r, [self, x](beast::error_code ec2, const auto&) {
                                  if (ec2) return self->fail_transport(x, ec2, "connect");
                                  self->write_request(x);
                                });
                              });
  }

  void watch(const McpHttpX& x) {
    auto when = x->deadline;
    if (x->cancel) when = std::min(when, ToolClock::now() + kMcpCancelPoll);
    x->timer.expires_at(when);
    x->timer.async_wait([self = shared_from_this(), x](beast::error_code ec) {
      if (ec || x->answered) return;
      const bool late = ToolClock::now() >= x->deadline;
      if (late || (x->cancel && x->cancel->cancelled())) return self->give_up(x, late);
      self->watch(x);
    });
  }

  void give_up(const McpHttpX& x, bool late) {
    abort(x);
    if (x->id == 0) return complete(x, {{}, {}, cat(x->method, " was not delivered in time")});
    post_message({{"jsonrpc", "2.0"},
                  {"method", "notifications/cancelled"},
                  {"params", {{"requestId", x->id}, {"reason", late ? "timed out" : "cancelled by the caller"}}}},
                 "notifications/cancelled");
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(x->deadline - x->sent).count();
    complete(x, {{}, {}, late ? cat("timed out after ", ms, " ms (notifications/cancelled sent)")
                              : std::string("was cancelled (notifications/cancelled sent)")});
  }

  void write_request(const McpHttpX& x) {
    auto& req = x->req;
    req.method(x->verb);
    req.target(target_.target);
    req.version(11);
    req.set(http::field::host, target_.host_header);
    req.set(http::field::user_agent, "exlagent");
    req.set(http::field::accept, x->verb == http::verb::get ? "text/event-stream" : "application/json, text/event-stream");
    {
      std::lock_guard lk(mu_);
      if (!session_id_.empty()) req.set("Mcp-Session-Id", session_id_);
      if (!protocol_.empty()) req.set("MCP-Protocol-Version", protocol_);
    }
    if (!x->body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = x->body;
    }
    req.keep_alive(false);
    req.prepare_payload();
    http::async_write(x->stream, req, [self = shared_from_this(), x](beast::error_code ec, size_t) {
      if (ec) return self->fail_transport(x, ec, "write");
      x->parser.emplace();
      x->parser->body_limit(self->max_bytes_);
      http::async_read_header(x->stream, x->buf, *x->parser, [self, x](beast::error_code ec2, size_t) {
        if (ec2) return self->fail_transport(x, ec2, "read");
        self->on_header(x);
      });
    });
  }

  void on_header(const McpHttpX& x) {
    if (x->answered) return abort(x);
    const auto& res = x->parser->get();
    const unsigned status = res.result_int();
    const bool carried_session = x->req.count("Mcp-Session-Id") > 0;
    if (x->method == "initialize" && status / 100 == 2) {
      auto it = res.find("Mcp-Session-Id");
      if (it != res.end()) {
        std::lock_guard lk(mu_);
        session_id_ = std::string(it->value());
      }
    }
    if (status == 404 && carried_session && x->verb == http::verb::post) {
      const std::string why = "ended the session (HTTP 404 to a message with its Mcp-Session-Id)";
      {
        std::lock_guard lk(mu_);
        session_id_.clear();
      }
      abort(x);
      end(why);  // first, so that a call made from this reply finds the link ended and reconnects
      return complete(x, {{}, {}, why});
    }
    if (status / 100 != 2) {
      return http::async_read(x->stream, x->buf, *x->parser, [self = shared_from_this(), x, status](beast::error_code, size_t) {
        self->abort(x);
        const auto& r = x->parser->get();
        self->complete(x, {{}, {}, cat("answered HTTP ", status, " ", std::string(r.reason()), ": '",
                                       mcp_excerpt(r.body()), "'")});
      });
    }
    if (x->verb == http::verb::get) {
      if (std::string_view(res[http::field::content_type]).substr(0, 17) != "text/event-stream") return fail_now(x, "");
      log_->note("listening on the server's GET event stream");
      x->parser->body_limit(boost::none);
      return read_events(x);
    }
    if (x->id == 0) {  // 202 Accepted (or any 2xx) for a message without an answer
      abort(x);
      return complete(x, {});
    }
    const std::string type(res[http::field::content_type]);
    if (type.rfind("text/event-stream", 0) == 0) {
      x->parser->body_limit(boost::none);
      return read_events(x);
    }
    if (type.rfind("application/json", 0) != 0) {
      abort(x);
      return complete(x, {{}, {}, cat("answered with Content-Type '", mcp_excerpt(type),
                                      "' (expected application/json or text/event-stream)")});
    }
    http::async_read(x->stream, x->buf, *x->parser, [self = shared_from_this(), x](beast::error_code ec, size_t) {
      if (ec == http::error::body_limit)
        return self->fail_now(x, cat("sent a body longer than ", self->max_bytes_, " bytes"));
      if (ec) return self->fail_transport(x, ec, "read");
      self->abort(x);
      const std::string& body = x->parser->get().body();
      try {
        self->handle_message(x, mcp_parse_message(body));
      } catch (const std::exception&) {
        return self->complete(x, {{}, {}, cat("sent a body that is not JSON: '", mcp_excerpt(body), "'")});
      }
      self->complete(x, {{}, {}, cat("answered without a response to request ", x->id)});
    });
  }

  void read_events(const McpHttpX& x) {
    http::async_read_some(x->stream, x->buf, *x->parser, [self = shared_from_this(), x](beast::error_code ec, size_t) {
      if (x->answered) return self->abort(x);
      std::string& body = x->parser->get().body();
      x->sse_pending += body;
      body.clear();
      self->split_events(x);
      if (x->answered) return self->abort(x);
      if (x->sse_pending.size() + x->sse_data.size() > self->max_bytes_)
        return self->fail_now(x, cat("sent an event longer than ", self->max_bytes_, " bytes"));
      if (ec) return self->fail_transport(x, ec, "read");
      if (x->parser->is_done())
        return self->fail_now(x, x->verb == http::verb::get
                                     ? std::string("closed its GET event stream")
                                     : cat("closed its event stream without answering request ", x->id));
      self->read_events(x);
    });
  }

  // The text/event-stream format: lines; "data:" lines accumulate, a blank line ends the event.
  void split_events(const McpHttpX& x) {
    size_t start = 0;
    for (size_t nl; !x->answered && (nl = x->sse_pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(x->sse_pending.data() + start, nl - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) {
        if (x->sse_has_data) {
          const std::string data = std::move(x->sse_data);
          x->sse_data.clear();
          x->sse_has_data = false;
          try {
            handle_message(x, mcp_parse_message(data));
          } catch (const std::exception&) {
            fail_now(x, cat("sent an event that is not JSON: '", mcp_excerpt(data), "'"));
          }
        }
        continue;
      }
      if (line.front() == ':') continue;
      const size_t colon = line.find(':');
      const std::string_view field = line.substr(0, colon);
      std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (field != "data") continue;
      if (x->sse_has_data) x->sse_data += '\n';
      x->sse_data.append(value);
      x->sse_has_data = true;
    }
    x->sse_pending.erase(0, start);
  }

  void handle_message(const McpHttpX& x, const json& msg) {
    if (msg.is_array()) {
      for (const auto& m : msg) handle_message(x, m);
      return;
    }
    if (!msg.is_object()) return fail_now(x, cat("sent a message that is not a JSON-RPC object: '", mcp_excerpt(msg.dump()), "'"));
    const bool has_id = msg.contains("id") && !msg["id"].is_null();
    if (msg.contains("method") && msg["method"].is_string()) {
      if (!has_id) {
        if (events_.notification) events_.notification(this, msg);
        return;
      }
      json reply = {{"jsonrpc", "2.0"}, {"id", msg["id"]}};
      if (msg["method"] == "ping") reply["result"] = json::object();
      else reply["error"] = {{"code", -32601}, {"message", cat("Method not found: ", msg["method"].get<std::string>())}};
      return post_message(reply, "a reply");
    }
    if (!has_id || !msg["id"].is_number_integer() || msg["id"].get<int64_t>() != x->id) {
      log_->note(cat("ignored a message on the stream of request ", x->id, ": '", mcp_excerpt(msg.dump()), "'"));
      return;
    }
    McpAnswer a;
    if (msg.contains("error")) a.error = msg["error"].is_object() ? msg["error"] : json{{"message", msg["error"].dump()}};
    else if (msg.contains("result")) a.result = msg["result"];
    else return fail_now(x, cat("sent a response with neither result nor error: '", mcp_excerpt(msg.dump()), "'"));
    if (x->method == "initialize" && a.result.is_object() && a.result.contains("protocolVersion") &&
        a.result["protocolVersion"].is_string()) {
      std::lock_guard lk(mu_);
      protocol_ = a.result["protocolVersion"];
    }
    complete(x, std::move(a));
  }

  void fail_now(const McpHttpX& x, std::string why) {
    abort(x);
    complete(x, {{}, {}, std::move(why)});
  }

  void fail_transport(const McpHttpX& x, beast::error_code ec, const char* step) {
    if (x->answered) return;
    abort(x);
    const bool before = std::string_view(step) == "resolve" || std::string_view(step) == "connect";
    complete(x, {{}, {}, before ? cat("could not be reached at ", url_, " (", step, ": ", ec.message(), ")")
                                : cat("broke the connection at ", url_, " (", step, ": ", ec.message(), ")")});
  }

  // Closes the exchange's connection and timer. On the link's thread.
  void abort(const McpHttpX& x) {
    beast::error_code ignored;
    x->timer.cancel();
    x->resolver.cancel();
    x->stream.socket().close(ignored);
  }

  // Runs the reply once (any thread), then lets deferred requests go once no notification is out.
  void complete(const McpHttpX& x, McpAnswer a) {
    if (x->answered.exchange(true)) return;
    {
      std::lock_guard lk(mu_);
      live_.erase(x);
    }
    if (x->reply) x->reply(std::move(a));
    if (x->notification)
      net::post(ioc_, [self = shared_from_this()] {
        if (--self->notifying_ > 0) return;
        auto later = std::move(self->deferred_);
        self->deferred_.clear();
        for (auto& d : later) self->launch(d);
      });
  }

  void end(const std::string& why) {
    std::vector<McpHttpX> live;
    {
      std::lock_guard lk(mu_);
      if (ended_) return;
      ended_ = true;
      end_reason_ = why;
      live.assign(live_.begin(), live_.end());
      live_.clear();
    }
    log_->note(cat("the server ", why));
    if (events_.ended) events_.ended(this, why);
    for (auto& x : live) {
      abort(x);
      complete(x, {{}, {}, why});
    }
  }

  const std::string url_;
  const McpHttpTarget target_;
  const size_t max_bytes_;
  const std::chrono::milliseconds grace_;
  std::shared_ptr<McpLog> log_;
  McpLinkEvents events_;
  net::io_context ioc_;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_;  // the link's thread only
  std::thread thread_;
  int notifying_ = 0;                 // the link's thread only: notifications not yet delivered
  std::vector<McpHttpX> deferred_;    // the link's thread only: requests waiting for them
  std::mutex mu_;                     // guards what follows
  std::set<McpHttpX> live_;           // exchanges not yet answered (but the DELETE)
  int64_t next_id_ = 1;
  std::string session_id_, protocol_;
  bool ended_ = false, stopping_ = false;
  std::string end_reason_;
};

}  // namespace

std::shared_ptr<McpLink> make_mcp_http_link(const McpServerConfig& config, std::shared_ptr<McpLog> log,
                                            McpLinkEvents events) {
  return std::make_shared<McpHttpLink>(config, std::move(log), std::move(events));
}

}  // namespace exl
