// Load and soak (issue 28): concurrent HTTP streams and WebSocket agent sessions against one
// server on loopback for a bounded time; every response is checked (SSE framing, each event valid
// JSON, [DONE] last, no error object; every agent run ends with done and no error), and the
// latency percentiles and the process's RSS (at the mark and at the end) are printed.
//
// The suite name holds "Slow", so the sanitizer run skips it. CI runs it short; by hand:
//   EXL_LOAD_SECONDS=300 EXL_LOAD_HTTP=256 EXL_LOAD_WS=128 EXL_LOAD_MODEL=examples/demo-model/model
//     build/tests/exl_runtime_tests --gtest_filter='ServerLoadSlow.*'
// With EXL_LOAD_SECONDS >= 120 the test also requires flat RSS: the end within 10% + 64 MiB of
// the value at the mark (60 s, or a quarter of a shorter run).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/server/server.h"
#include "http_test_client.h"
#include "test_support.h"
#include "ws_test_client.h"

namespace exl {
namespace server_load_test {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

double rss_mib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return double(resident) * double(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

struct Tally {
  std::mutex mu;
  std::vector<double> http_ms, ws_ms;  // guarded by mu
  std::vector<std::string> failures;    // guarded by mu; the first few
  std::atomic<long> n_failed{0};
  void fail(std::string what) {
    ++n_failed;
    std::lock_guard lk(mu);
    if (failures.size() < 10) failures.push_back(std::move(what));
  }
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

// One streamed chat completion, checked event by event; "" when good, else what was wrong.
std::string check_stream(const test::HttpReply& r) {
  if (r.status != 200) return "status " + std::to_string(r.status) + ": " + r.body.substr(0, 200);
  size_t pos = 0;
  bool saw_done = false, saw_content = false;
  while (pos < r.body.size()) {
    const size_t end = r.body.find("\n\n", pos);
    if (end == std::string::npos) return "unterminated SSE event";
    const std::string ev = r.body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) return "not an SSE data event: " + ev.substr(0, 100);
    const std::string data = ev.substr(6);
    if (saw_done) return "event after [DONE]";
    if (data == "[DONE]") {
      saw_done = true;
      continue;
    }
    json j = json::parse(data, nullptr, false);
    if (j.is_discarded()) return "invalid JSON in an event: " + data.substr(0, 100);
    if (j.contains("error")) return "error event: " + data.substr(0, 200);
    if (j.value("object", "") != "chat.completion.chunk") return "not a chunk: " + data.substr(0, 100);
    saw_content = true;
  }
  if (!saw_done) return "no [DONE]";
  if (!saw_content) return "no chunks";
  return {};
}

TEST(ServerLoadSlow, ConcurrentStreamsAndAgentSessions) {
  const std::string model_env = std::getenv("EXL_LOAD_MODEL") ? std::getenv("EXL_LOAD_MODEL") : "";
  const std::filesystem::path model =
      model_env.empty() ? test::shared_dir() / "models/stories260K-hf" : std::filesystem::path(model_env);
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "model missing: " << model;
  const long seconds = env_long("EXL_LOAD_SECONDS", 8);
  const long n_http = env_long("EXL_LOAD_HTTP", 32);
  const long n_ws = env_long("EXL_LOAD_WS", 16);
  const long max_tokens = env_long("EXL_LOAD_MAX_TOKENS", 8);

  ServerOptions o;
  o.model_dir = model.string();
  o.port = 0;
  o.max_sessions = int(n_http + n_ws + 8);
  o.max_batch_seqs = 32;
  o.session_dir = (test::temp_dir("ServerLoadSlow") / "sessions").string();
  o.session_retain_files = 256;
  auto state = std::make_shared<ServerState>(o);
  Server server(state);
  server.start();
  const uint16_t port = server.port();

  Tally tally;
  const auto start = Clock::now();
  const auto stop_at = start + std::chrono::seconds(seconds);
  const auto mark_at = start + std::chrono::seconds(seconds >= 120 ? 60 : std::max<long>(1, seconds / 4));
  std::atomic<long> n_http_done{0}, n_ws_done{0};
  std::vector<std::thread> threads;
  for (long i = 0; i < n_http; ++i)
    threads.emplace_back([&, i] {
      const json body = {{"model", "m"},
                         {"messages", {{{"role", "user"}, {"content", "Tell me a story number " + std::to_string(i)}}}},
                         {"max_tokens", max_tokens},
                         {"stream", true}};
      while (Clock::now() < stop_at) {
        const auto t0 = Clock::now();
        try {
          const std::string bad = check_stream(test::http_request(port, "POST", "/v1/chat/completions", body.dump()));
          if (!bad.empty()) {
            tally.fail("http: " + bad);
            continue;
          }
        } catch (const std::exception& e) {
          tally.fail(std::string("http: ") + e.what());
          continue;
        }
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        std::lock_guard lk(tally.mu);
        tally.http_ms.push_back(ms);
        ++n_http_done;
      }
    });
  for (long i = 0; i < n_ws; ++i)
    threads.emplace_back([&] {
      try {
        test::WsTestClient c(port, "");
        std::string sid;
        while (Clock::now() < stop_at) {
          if (sid.empty()) {
            json created = c.call("sessions/create", {{"maxTokens", max_tokens}});
            if (!created.contains("result")) return tally.fail("ws create: " + created.dump());
            sid = created["result"]["sessionId"];
          }
          const auto t0 = Clock::now();
          json sent = c.call("sessions/send", {{"sessionId", sid}, {"content", "Go on."}});
          if (!sent.contains("result")) return tally.fail("ws send: " + sent.dump());
          auto done = c.next_of("sessions/event", "done", std::chrono::milliseconds(120000));
          if (!done) return tally.fail("ws: no done event");
          std::string error;
          for (const auto& f : c.seen())
            if (f.value("method", "") == "sessions/event" && f["params"].value("type", "") == "error")
              error = f["params"].value("message", "");
          c.clear_seen();
          if (!error.empty() || (*done)["params"]["reason"] != "final") {
            // A long soak fills a conversation's context: that ends the run with an error naming
            // the context; anything else is a failure. Either way, start a new session.
            if (error.find("the context holds") == std::string::npos)
              tally.fail("ws run: " + done->dump() + " " + error);
            c.call("sessions/close", {{"sessionId", sid}});
            sid.clear();
            continue;
          }
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          std::lock_guard lk(tally.mu);
          tally.ws_ms.push_back(ms);
          ++n_ws_done;
        }
        c.close();
      } catch (const std::exception& e) {
        tally.fail(std::string("ws: ") + e.what());
      }
    });
  std::this_thread::sleep_until(mark_at);
  const double rss_mark = rss_mib();
  for (auto& t : threads) t.join();
  const double rss_end = rss_mib();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(test::http_request(port, "GET", "/health").status, 200);

  std::lock_guard lk(tally.mu);
  std::printf("[ load     ] %s: %lds, %ld HTTP streams, %ld WS sessions, max_tokens %ld\n", model.filename().c_str(),
              seconds, n_http, n_ws, max_tokens);
  std::printf("[ load     ] HTTP: %ld completions (%.1f/s), p50 %.0f ms, p99 %.0f ms\n", n_http_done.load(),
              double(n_http_done) / wall, percentile(tally.http_ms, 0.5), percentile(tally.http_ms, 0.99));
  std::printf("[ load     ] WS:   %ld agent runs (%.1f/s), p50 %.0f ms, p99 %.0f ms\n", n_ws_done.load(),
              double(n_ws_done) / wall, percentile(tally.ws_ms, 0.5), percentile(tally.ws_ms, 0.99));
  std::printf("[ load     ] RSS: %.0f MiB at %lds, %.0f MiB at the end; failures: %ld\n", rss_mark,
              long(std::chrono::duration_cast<std::chrono::seconds>(mark_at - start).count()), rss_end,
              tally.n_failed.load());
  for (const auto& f : tally.failures) ADD_FAILURE() << f;
  EXPECT_EQ(tally.n_failed, 0);
  EXPECT_GT(n_http_done, 0);
  if (n_ws > 0) {
    EXPECT_GT(n_ws_done, 0);
  }
  if (seconds >= 120) {
    EXPECT_LE(rss_end, rss_mark * 1.10 + 64) << "RSS grew after the mark";
  }
}

}  // namespace server_load_test
}  // namespace exl
