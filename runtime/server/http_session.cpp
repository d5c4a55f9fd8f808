#include "runtime/server/http_session.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <string>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include "runtime/openai/api_error.h"
#include "runtime/openai/completion_writer.h"
#include "runtime/server/http_request_reader.h"
#include "runtime/server/router.h"
#include "runtime/server/ws_rpc.h"
#include "runtime/server/ws_session.h"

namespace exl {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kMaxPending = 8u << 20;
constexpr size_t kMaxPipelined = 64u << 10;

// Whether the peer closed the connection (EOF or a pending error), without consuming its bytes.
bool http_peer_has_closed(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

std::string chunked(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

}  // namespace

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, std::shared_ptr<ServerState> state)
      : stream_(std::move(socket)), state_(std::move(state)) {
    ++state_->metrics().open_connections;
  }
  ~HttpSession() {
    if (!finished_) cancel_jobs();
    --state_->metrics().open_connections;
  }

  void run() { net::dispatch(stream_.get_executor(), beast::bind_front_handler(&HttpSession::do_read, shared_from_this())); }

 private:
  void do_read() {
    if (state_->draining()) return do_close();
    parser_.emplace();
    limit_request_parser(*parser_, state_->options().max_body_bytes);
    stream_.expires_after(state_->options().read_timeout);
    http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream) return do_close();
    if (ec == http::error::body_limit) {
      ApiError e(413, "invalid_request_error",
                 cat("Request body exceeds the limit of ", state_->options().max_body_bytes, " bytes."), {},
                 "request_too_large");
      state_->metrics().count_request("other", 413);
      return send(error_response(e), false);
    }
    if (ec) {
      if (ec == beast::error::timeout || ec == net::error::operation_aborted || ec == net::error::eof ||
          ec == net::error::connection_reset)
        return do_close();
      state_->metrics().count_request("other", 400);
      return send(error_response(ApiError(400, "invalid_request_error", cat("Malformed HTTP request: ", ec.message()))),
                  false);
    }
    const auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    if (beast::websocket::is_upgrade(req)) {
      if (auto refused = check_ws_upgrade(to_http_request(req), *state_)) {
        state_->metrics().count_request(kWsPath, refused->status);
        return send(std::move(*refused), false);
      }
      state_->metrics().count_request(kWsPath, 101);
      return start_ws_session(stream_.release_socket(), parser_->release(), state_);
    }
    HttpRequest request = to_http_request(req);
    request.client_gone = [fd = stream_.socket().native_handle()] { return http_peer_has_closed(fd); };
    read_at_ = std::chrono::steady_clock::now();
    RouteResult r = route(request, *state_);
    if (r.plan) return start_generation(std::move(*r.plan));
    send(std::move(r.response), keep_alive_);
  }

  void send(HttpResponse resp, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(http::status(resp.status), version_ ? version_ : 11);
    res->set(http::field::server, "exlagent");
    res->set(http::field::content_type, resp.content_type);
    for (const auto& [k, v] : resp.headers) res->set(k, v);
    res->body() = std::move(resp.body);
    res->keep_alive(keep_alive && !state_->draining());
    res->prepare_payload();
    stream_.expires_after(state_->options().read_timeout);
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      self->on_response_written(ec, !res->keep_alive());
    });
  }

  void on_response_written(beast::error_code ec, bool close) {
    if (ec || close) return do_close();
    resume_reading();
  }

  // Generation.

  void start_generation(GenerationPlan plan) {
    plan_admission_ = std::move(plan.admission);
    endpoint_ = plan.endpoint;
    writer_.emplace(plan.meta, state_->chat_template());
    streaming_ = plan.meta.stream;
    finished_ = false;
    std::weak_ptr<HttpSession> weak = shared_from_this();
    for (size_t i = 0; i < plan.jobs.size(); ++i)
      plan.jobs[i].on_event = [weak, i](const GenerationEvent& e) {
        if (auto self = weak.lock())
          net::post(self->stream_.get_executor(), [self, i, e] { self->on_generation_event(i, e); });
      };
    stream_.expires_never();
    if (streaming_) {
      pending_ += "HTTP/1.1 200 OK\r\nServer: exlagent\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                  "Transfer-Encoding: chunked\r\nConnection: ";
      pending_ += keep_alive_ ? "keep-alive\r\n\r\n" : "close\r\n\r\n";
      if (std::string b = writer_->begin(); !b.empty()) pending_ += chunked(b);
      flush();
    }
    jobs_.clear();
    jobs_.push_back(state_->generator().submit(std::move(plan.jobs[0])));
    state_->metrics().observe_preparation(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - read_at_).count());
    waiting_jobs_.assign(std::make_move_iterator(plan.jobs.begin() + 1), std::make_move_iterator(plan.jobs.end()));
    watch_peer();
  }

  // Choices after the first start once it has prefilled (its first event), so that its full
  // prompt pages are in the prefix cache for them.
  void submit_waiting_jobs() {
    for (GenerationJob& job : waiting_jobs_) jobs_.push_back(state_->generator().submit(std::move(job)));
    waiting_jobs_.clear();
  }

  void cancel_jobs() {
    waiting_jobs_.clear();
    for (size_t i = 0; i < jobs_.size(); ++i)
      if (!writer_ || !writer_->choice_done(i)) state_->generator().cancel(jobs_[i]);
  }

  void on_generation_event(size_t choice, const GenerationEvent& e) {
    if (finished_ || !writer_) return;
    std::string out = writer_->on_event(choice, e);
    if (choice == 0 && !writer_->done()) submit_waiting_jobs();
    if (!writer_->done()) {
      if (streaming_ && !out.empty()) {
        pending_ += chunked(out);
        if (pending_.size() > kMaxPending) return abandon();
        flush();
      }
      return;
    }
    finished_ = true;
    cancel_jobs();
    for (size_t i = 0; i < writer_->n_choices(); ++i) state_->metrics().observe_generation(writer_->choice_stats(i));
    plan_admission_.reset();
    if (peer_gone_) return do_close();
    if (!streaming_) {
      HttpResponse resp = writer_->response();
      state_->metrics().count_request(endpoint_, resp.status);
      return send(std::move(resp), keep_alive_);
    }
    state_->metrics().count_request(endpoint_, 200);
    pending_ += chunked(out) + "0\r\n\r\n";
    flush();
  }

  void flush() {
    if (writing_ || pending_.empty()) return;
    inflight_ = std::move(pending_);
    pending_.clear();
    writing_ = true;
    net::async_write(stream_, net::buffer(inflight_),
                     beast::bind_front_handler(&HttpSession::on_stream_written, shared_from_this()));
  }

  void on_stream_written(beast::error_code ec, size_t) {
    writing_ = false;
    if (ec) return abandon();
    if (!pending_.empty()) return flush();
    if (finished_) {
      if (!keep_alive_) return do_close();
      resume_reading();
    }
  }

  // A client that is gone or too far behind: cancel its job and drop the connection.
  void abandon() {
    peer_gone_ = true;
    if (!finished_) cancel_jobs();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }

  // Reads while a job runs, so a closed connection is noticed; bytes of a pipelined next
  // request are kept for the next read.
  void watch_peer() {
    if (watching_ || buffer_.size() >= kMaxPipelined) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096), beast::bind_front_handler(&HttpSession::on_peer, shared_from_this()));
  }

  void on_peer(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      if (ec && ec != net::error::operation_aborted) return do_close();
      return do_read();
    }
    if (ec) {
      if (!finished_) abandon();
      return;
    }
    if (!finished_) watch_peer();
  }

  void resume_reading() {
    writer_.reset();
    jobs_.clear();
    if (watching_) {
      resume_after_watch_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    do_read();
  }

  void do_close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::shared_ptr<ServerState> state_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = true;
  unsigned version_ = 11;

  std::optional<CompletionWriter> writer_;
  std::chrono::steady_clock::time_point read_at_;  // the current request's last byte read
  std::shared_ptr<void> plan_admission_;
  std::string endpoint_;
  std::vector<uint64_t> jobs_;               // submitted, by choice
  std::vector<GenerationJob> waiting_jobs_;  // choices 1.. until choice 0 has prefilled
  bool streaming_ = false;
  bool finished_ = true;
  bool peer_gone_ = false;
  std::string pending_, inflight_;
  bool writing_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
};

void start_http_session(tcp::socket socket, std::shared_ptr<ServerState> state) {
  std::make_shared<HttpSession>(std::move(socket), std::move(state))->run();
}

}  // namespace exl
