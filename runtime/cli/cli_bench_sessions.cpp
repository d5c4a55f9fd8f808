// `exlagent bench-sessions`: N concurrent agent sessions over loopback WebSocket against an
// in-process server. One tool client registers `lookup` and answers every tools/call; each session
// client opens its own connection, creates a session offering `lookup`, sends one message and
// waits for done. Turns are scripted (ForcedTextHook: turn 1 calls the tool, turn 2 answers) so
// a tiny model does real prefill/decode work of a fixed shape. Reports throughput and TTFT
// percentiles (send -> first token event, as the client sees it).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <iomanip>
#include <iostream>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>

#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/server/server.h"
#include "runtime/server/session_hub.h"

namespace exl {

namespace {

namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// One async JSON-RPC WebSocket client; on_message sees every frame.
class BenchConn : public std::enable_shared_from_this<BenchConn> {
 public:
  BenchConn(net::io_context& ioc, uint16_t port) : ws_(net::make_strand(ioc)), port_(port) {}
  std::function<void(const json&)> on_message;
  std::function<void()> on_open;
  std::function<void(const std::string&)> on_error;

  void start() {
    beast::get_lowest_layer(ws_).async_connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_),
                                               [self = shared_from_this()](beast::error_code ec) {
                                                 if (ec) return self->fail("connect", ec);
                                                 self->handshake();
                                               });
  }
  void send(const json& j) {
    queue_.push_back(j.dump());
    if (queue_.size() == 1) write();
  }
  void close() {
    closed_ = true;
    ws_.async_close(websocket::close_code::normal, [self = shared_from_this()](beast::error_code) {});
  }

 private:
  void handshake() {
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::request_type& r) { r.set(beast::http::field::sec_websocket_protocol, "exlagent.v1"); }));
    ws_.async_handshake("127.0.0.1", "/v1/ws", [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->fail("handshake", ec);
      if (self->on_open) self->on_open();
      self->read();
    });
  }
  void read() {
    buf_.clear();
    ws_.async_read(buf_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->closed_ ? void() : self->fail("read", ec);
      json j = json::parse(beast::buffers_to_string(self->buf_.data()), nullptr, false);
      if (self->on_message) self->on_message(j);
      self->read();
    });
  }
  void write() {
    ws_.text(true);
    ws_.async_write(net::buffer(queue_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail("write", ec);
      self->queue_.pop_front();
      if (!self->queue_.empty()) self->write();
    });
  }
  void fail(const char* what, beast::error_code ec) {
    if (on_error) on_error(cat(what, ": ", ec.message()));
  }

  websocket::stream<beast::tcp_stream> ws_;
  uint16_t port_;
  beast::flat_buffer buf_;
  std::deque<std::string> queue_;
  bool closed_ = false;
};

struct SessionResult {
  double ttft_s = -1, total_s = 0;
  int64_t completion_tokens = 0, prompt_tokens = 0, cached_tokens = 0;
  std::string error;
  bool done = false;
};

double latency_percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

const CommandSpec& session_bench_spec() {
  static const CommandSpec s{
      "bench-sessions",
      "Run N concurrent agent sessions over loopback WebSocket against an in-process server; each session\n"
      "calls a client-registered tool once, then answers (both turns scripted). Prints throughput and TTFT.",
      {},
      {{"--model", "DIR", "model directory", true},
       {"--sessions", "N", "concurrent sessions (default 64)"},
       {"--threads", "N", "CPU threads for the cpu backend (default: all)"},
       {"--backend", "NAME", "cpu (default) or cuda"},
       {"--batch", "N", "sequences decoded at once (default 16)"},
       {"--cache-pages", "N", "KV cache pages (default 1024)"},
       {"--answer-words", "N", "words in the scripted final answer (default 48)"},
       {"--chat-template", "NAME", "template override (mistral has the most compact tool format)"}}};
  return s;
}

std::string scripted_answer(int words) {
  static const char* w[] = {"the", "little", "cat", "ran", "to", "see", "a", "big", "dog", "in", "park", "and"};
  std::string s = "It is 4 degrees.";
  for (int i = 0; i < words; ++i) s += std::string(" ") + w[i % 12];
  return s + ".";
}

}  // namespace

int cli_bench_sessions(std::span<const std::string> args) {
  return run_command(session_bench_spec(), args, [](const ParsedArgs& a) {
    ServerOptions o;
    o.model_dir = *a.get("--model");
    o.port = 0;
    o.backend = a.get_or("--backend", o.backend);
    o.cpu_threads = int(a.get_int("--threads", 0));
    o.max_batch_seqs = int(a.get_int("--batch", 16));
    o.cache_pages = int(a.get_int("--cache-pages", 1024));
    o.chat_template = a.get_or("--chat-template", "");
    const int n = int(a.get_int("--sessions", 64));
    if (n <= 0) throw UsageError("--sessions must be positive");
    o.max_sessions = n;
    o.session_dir =
        (std::filesystem::temp_directory_path() / ("exlagent-bench-sessions-" + std::to_string(::geteuid()))).string();
    auto state = std::make_shared<ServerState>(o);
    state->sessions().set_turn_constraint(scripted_turns(
        state->tokenizer(), {state->chat_template()->family() == TemplateFamily::mistral
                                 ? "[TOOL_CALLS] [{\"name\": \"lookup\", \"arguments\": {\"city\": \"Oslo\"}}]"
                                 : "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
                             scripted_answer(int(a.get_int("--answer-words", 48)))}));
    Server server(state);
    server.start();

    net::io_context ioc;
    std::vector<SessionResult> results(static_cast<size_t>(n));
    int finished = 0;
    std::string fatal;
    auto tools = std::make_shared<BenchConn>(ioc, server.port());
    std::vector<std::shared_ptr<BenchConn>> conns;
    Clock::time_point t0;
    tools->on_error = [&](const std::string& e) { fatal = "tool client: " + e; ioc.stop(); };
    tools->on_message = [&, tools](const json& m) {
      if (m.value("method", "") == "tools/call")
        tools->send({{"jsonrpc", "2.0"}, {"id", m["id"]},
                     {"result", {{"content", {{{"type", "text"}, {"text", "4 degrees"}}}}, {"isError", false}}}});
      if (m.contains("id") && m["id"] == 1 && !m.contains("method")) {
        if (m.contains("error")) {
          fatal = m.dump();
          return ioc.stop();
        }
        t0 = Clock::now();
        for (int i = 0; i < n; ++i) {
          auto c = std::make_shared<BenchConn>(ioc, server.port());
          conns.push_back(c);
          SessionResult* r = &results[size_t(i)];
          auto sent = std::make_shared<Clock::time_point>();
          auto finish = [&, r, c](const std::string& error) {
            if (r->done) return;
            r->done = true;
            r->error = error;
            r->total_s = std::chrono::duration<double>(Clock::now() - t0).count();
            c->close();
            if (++finished == n) tools->close();
          };
          c->on_error = finish;
          c->on_open = [c] { c->send({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "sessions/create"},
                                      {"params", {{"tools", {"lookup"}}, {"maxTokens", 128}}}}); };
          c->on_message = [r, c, sent, finish](const json& m) {
            if (m.contains("error")) return finish(m["error"].dump());
            if (m.value("id", json()) == 1) {
              *sent = Clock::now();
              return c->send({{"jsonrpc", "2.0"}, {"id", 2}, {"method", "sessions/send"},
                              {"params", {{"sessionId", m["result"]["sessionId"]}, {"content", "How warm is Oslo?"}}}});
            }
            if (m.value("method", "") != "sessions/event") return;
            const json& p = m["params"];
            const std::string type = p["type"];
            if (type == "token" && r->ttft_s < 0) r->ttft_s = std::chrono::duration<double>(Clock::now() - *sent).count();
            if (type == "error") return finish(p.value("message", "error"));
            if (type == "done") {
              r->completion_tokens = p["usage"]["completion_tokens"];
              r->prompt_tokens = p["usage"]["prompt_tokens"];
              r->cached_tokens = p["usage"]["prompt_tokens_details"]["cached_tokens"];
              finish(p["reason"] == "final" ? "" : "reason " + p["reason"].get<std::string>());
            }
          };
          c->start();
        }
      }
    };
    tools->on_open = [tools] {
      tools->send({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "tools/register"},
                   {"params", {{"tools", {{{"name", "lookup"}, {"description", "temperature of a city"},
                                           {"inputSchema", {{"type", "object"},
                                                            {"properties", {{"city", {{"type", "string"}}}}}}}}}}}}});
    };
    tools->start();
    ioc.run();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    server.shutdown(std::chrono::seconds(5));
    if (!fatal.empty()) throw Error(cat("runtime: bench-sessions: ", fatal));

    int errors = 0;
    int64_t gen = 0, prompt = 0, cached = 0;
    std::vector<double> ttft;
    for (const auto& r : results) {
      if (!r.error.empty() || !r.done) {
        if (++errors <= 3) std::cerr << "session error: " << (r.done ? r.error : "not finished") << "\n";
        continue;
      }
      gen += r.completion_tokens;
      prompt += r.prompt_tokens;
      cached += r.cached_tokens;
      if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    }
    std::cout << std::fixed << std::setprecision(3) << "sessions: " << n << " (" << (n - errors) << " ok, " << errors
              << " failed), 2 turns + 1 tool call each\n"
              << "wall: " << wall << " s, " << double(n - errors) / wall << " sessions/s\n"
              << "generated tokens: " << gen << " (" << double(gen) / wall << " tok/s)\n"
              << "prompt tokens: " << prompt << ", cached: " << cached << "\n"
              << "TTFT p50: " << latency_percentile(ttft, 0.5) * 1000 << " ms, p99: " << latency_percentile(ttft, 0.99) * 1000
              << " ms\n";
    return errors == 0 ? 0 : 1;
  });
}

}  // namespace exl
