#include "tools/tool_deadline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "tool_test_util.h"

namespace exl {
namespace tool_deadline_test {

using namespace std::chrono_literals;
using nlohmann::json;

// A tool whose behaviour each test scripts: it records what it was given and acts through `body`.
class ScriptedTool : public Tool {
 public:
  using Body = std::function<void(std::shared_ptr<CancelToken>, ToolDone)>;
  ScriptedTool(std::string name, Body body) : spec_{std::move(name), "", json::object()}, body_(std::move(body)) {}
  const ToolSpec& spec() const override { return spec_; }
  void invoke(const json&, ToolClock::time_point deadline, std::shared_ptr<CancelToken> cancel, ToolDone done) override {
    last_deadline = deadline;
    body_(std::move(cancel), std::move(done));
  }
  ToolClock::time_point last_deadline;

 private:
  ToolSpec spec_;
  Body body_;
};

// Collects every done call.
struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ToolResult> results;
  ToolDone done() {
    return [this](ToolResult r) {
      std::lock_guard lock(mu);
      results.push_back(std::move(r));
      cv.notify_all();
    };
  }
  ToolResult wait_one() {
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, 10s, [&] { return !results.empty(); }));
    return results.empty() ? ToolResult{} : results[0];
  }
  size_t count() {
    std::lock_guard lock(mu);
    return results.size();
  }
};

TEST(ToolDeadline, SynchronousResult) {
  ToolTimer timer;
  auto tool = std::make_shared<ScriptedTool>("sync", [](auto, ToolDone d) { d({"42", false}); });
  Sink sink;
  const auto before = ToolClock::now();
  invoke_with_deadline(tool, json::object(), 5000ms, nullptr, sink.done(), timer);
  ASSERT_EQ(sink.count(), 1u);  // delivered before invoke_with_deadline returned
  EXPECT_EQ(sink.results[0].content, "42");
  EXPECT_FALSE(sink.results[0].is_error);
  EXPECT_GE(tool->last_deadline, before + 5000ms);
  EXPECT_EQ(timer.pending(), 0u);  // the deadline was withdrawn
}

TEST(ToolDeadline, ResultFromAnotherThread) {
  ToolTimer timer;
  std::thread worker;
  auto tool = std::make_shared<ScriptedTool>("async", [&](auto, ToolDone d) {
    worker = std::thread([d = std::move(d)] {
      std::this_thread::sleep_for(5ms);
      d({"later", false});
    });
  });
  Sink sink;
  invoke_with_deadline(tool, json::object(), 5000ms, nullptr, sink.done(), timer);
  EXPECT_EQ(sink.wait_one().content, "later");
  worker.join();
  EXPECT_EQ(sink.count(), 1u);
  EXPECT_EQ(timer.pending(), 0u);
}

TEST(ToolDeadline, TimeoutReportsOnceCancelsAndDropsTheLateResult) {
  ToolTimer timer;
  ToolDone kept;
  std::shared_ptr<CancelToken> seen;
  auto tool = std::make_shared<ScriptedTool>("slow", [&](std::shared_ptr<CancelToken> c, ToolDone d) {
    seen = c;
    kept = std::move(d);
  });
  Sink sink;
  const auto start = ToolClock::now();
  invoke_with_deadline(tool, json::object(), 30ms, nullptr, sink.done(), timer);
  ToolResult r = sink.wait_one();
  EXPECT_GE(ToolClock::now() - start, 30ms);
  EXPECT_TRUE(r.is_error);
  EXPECT_EQ(r.content, "tool 'slow' timed out after 30 ms");
  ASSERT_NE(seen, nullptr);
  EXPECT_TRUE(seen->cancelled());
  kept({"too late", false});
  kept({"and again", false});
  EXPECT_EQ(sink.count(), 1u);
}

TEST(ToolDeadline, CallerTokenIsPassedThrough) {
  ToolTimer timer;
  auto token = std::make_shared<CancelToken>();
  std::shared_ptr<CancelToken> seen;
  auto tool = std::make_shared<ScriptedTool>("t", [&](std::shared_ptr<CancelToken> c, ToolDone d) {
    seen = c;
    d({"ok", false});
  });
  Sink sink;
  invoke_with_deadline(tool, json::object(), 1000ms, token, sink.done(), timer);
  EXPECT_EQ(seen, token);
  EXPECT_FALSE(token->cancelled());
}

TEST(ToolDeadline, ThrowingToolIsAnErrorResult) {
  ToolTimer timer;
  auto thrower = std::make_shared<ScriptedTool>("thrower", [](auto, ToolDone) { throw std::runtime_error("boom"); });
  Sink sink;
  invoke_with_deadline(thrower, json::object(), 1000ms, nullptr, sink.done(), timer);
  ASSERT_EQ(sink.count(), 1u);
  EXPECT_TRUE(sink.results[0].is_error);
  EXPECT_EQ(sink.results[0].content, "tool 'thrower' failed: boom");
  EXPECT_EQ(timer.pending(), 0u);

  // Answering, then throwing: the answer stands and done is not called again.
  auto both = std::make_shared<ScriptedTool>("both", [](auto, ToolDone d) {
    d({"answer", false});
    throw 7;
  });
  Sink sink2;
  invoke_with_deadline(both, json::object(), 1000ms, nullptr, sink2.done(), timer);
  ASSERT_EQ(sink2.count(), 1u);
  EXPECT_EQ(sink2.results[0].content, "answer");
  EXPECT_FALSE(sink2.results[0].is_error);
}

TEST(ToolDeadline, TimerShutdownCompletesPendingCalls) {
  Sink sink;
  ToolDone kept;
  auto tool = std::make_shared<ScriptedTool>("hang", [&](auto, ToolDone d) { kept = std::move(d); });
  {
    ToolTimer timer;
    invoke_with_deadline(tool, json::object(), 60000ms, nullptr, sink.done(), timer);
    EXPECT_EQ(sink.count(), 0u);
  }
  ASSERT_EQ(sink.count(), 1u);
  EXPECT_TRUE(sink.results[0].is_error);
  EXPECT_EQ(sink.results[0].content, "tool 'hang' was cancelled: the runtime is shutting down");
  kept({"after shutdown", false});  // the timer is gone; this must be a harmless no-op
  EXPECT_EQ(sink.count(), 1u);
}

TEST(ToolDeadline, RacingAnswersAndDeadlinesDeliverExactlyOnce) {
  ToolTimer timer;
  constexpr int kCalls = 200;
  std::vector<std::thread> workers;
  std::mutex workers_mu;
  std::atomic<int> delivered{0}, timeouts{0}, answers{0};
  std::vector<std::atomic<int>> per_call(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    auto tool = std::make_shared<ScriptedTool>("race", [&, i](auto, ToolDone d) {
      std::lock_guard lock(workers_mu);
      workers.emplace_back([d = std::move(d), i] {
        std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 40)));
        d({"answer", false});
      });
    });
    invoke_with_deadline(tool, json::object(), 1ms, nullptr,
                         [&, i](ToolResult r) {
                           per_call[size_t(i)]++;
                           delivered++;
                           (r.is_error ? timeouts : answers)++;
                         },
                         timer);
  }
  for (auto& w : workers) w.join();
  const auto until = ToolClock::now() + 10s;
  while (delivered.load() < kCalls && ToolClock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(delivered.load(), kCalls);
  for (auto& c : per_call) EXPECT_EQ(c.load(), 1);
  EXPECT_EQ(timeouts.load() + answers.load(), kCalls);
}

TEST(ToolTimer, RunsInDeadlineOrderAndCancels) {
  ToolTimer timer;
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> all;
  const auto now = ToolClock::now();
  auto push = [&](int v) {
    return [&, v](bool shutdown) {
      std::lock_guard lock(mu);
      order.push_back(shutdown ? -v : v);
      if (order.size() == 3) all.set_value();
    };
  };
  timer.schedule(now + 30ms, push(3));
  auto id = timer.schedule(now + 20ms, push(99));
  timer.schedule(now + 10ms, push(1));
  timer.schedule(now + 20ms, push(2));
  EXPECT_TRUE(timer.cancel(id));
  EXPECT_FALSE(timer.cancel(id));
  ASSERT_EQ(all.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

}  // namespace tool_deadline_test
}  // namespace exl
