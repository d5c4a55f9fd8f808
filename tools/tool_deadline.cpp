#include "tools/tool_deadline.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/error.h"

namespace exl {

struct ToolTimer::Core {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<ToolClock::time_point, Id>, Callback> queue;
  std::map<Id, ToolClock::time_point> when;
  Id next_id = 1;
  bool stop = false;

  bool cancel(Id id) {
    std::lock_guard lock(mu);
    auto it = when.find(id);
    if (it == when.end()) return false;
    queue.erase({it->second, id});
    when.erase(it);
    return true;
  }

  void run() {
    std::unique_lock lock(mu);
    while (!stop) {
      if (queue.empty()) {
        cv.wait(lock);
        continue;
      }
      auto first = queue.begin();
      if (ToolClock::now() < first->first.first) {
        cv.wait_until(lock, first->first.first);
        continue;
      }
      Callback fn = std::move(first->second);
      when.erase(first->first.second);
      queue.erase(first);
      lock.unlock();
      fn(false);
      lock.lock();
    }
  }
};

ToolTimer::ToolTimer() : core_(std::make_shared<Core>()), thread_([core = core_] { core->run(); }) {}

ToolTimer::~ToolTimer() {
  std::map<std::pair<ToolClock::time_point, Id>, Callback> left;
  {
    std::lock_guard lock(core_->mu);
    core_->stop = true;
  }
  core_->cv.notify_all();
  thread_.join();
  {
    std::lock_guard lock(core_->mu);
    left.swap(core_->queue);
    core_->when.clear();
  }
  for (auto& [key, fn] : left) fn(true);
}

ToolTimer::Id ToolTimer::schedule(ToolClock::time_point when, Callback fn) {
  Id id;
  {
    std::lock_guard lock(core_->mu);
    id = core_->next_id++;
    core_->queue.emplace(std::make_pair(when, id), std::move(fn));
    core_->when.emplace(id, when);
  }
  core_->cv.notify_all();
  return id;
}

bool ToolTimer::cancel(Id id) { return core_->cancel(id); }

size_t ToolTimer::pending() const {
  std::lock_guard lock(core_->mu);
  return core_->queue.size();
}

namespace {

// One call's completion: whoever flips `finished` first delivers.
struct CallState {
  std::atomic<bool> finished{false};
  ToolDone done;
  ToolTimer::Id timer_id = 0;

  bool claim() { return !finished.exchange(true, std::memory_order_acq_rel); }
  void deliver(ToolResult r) {
    ToolDone d = std::move(done);
    d(std::move(r));
  }
};

}  // namespace

void invoke_with_deadline(const std::shared_ptr<Tool>& tool, const nlohmann::json& arguments,
                          std::chrono::milliseconds timeout, std::shared_ptr<CancelToken> cancel, ToolDone done,
                          ToolTimer& timer) {
  EXL_CHECK(tool != nullptr, "tools: deadline: null tool");
  if (!cancel) cancel = std::make_shared<CancelToken>();
  const std::string name = tool->spec().name;
  const auto deadline = ToolClock::now() + timeout;
  auto state = std::make_shared<CallState>();
  state->done = std::move(done);

  state->timer_id = timer.schedule(deadline, [state, cancel, name, timeout](bool shutdown) {
    if (!state->claim()) return;
    cancel->cancel();
    state->deliver({shutdown ? "tool '" + name + "' was cancelled: the runtime is shutting down"
                             : cat("tool '", name, "' timed out after ", timeout.count(), " ms"),
                    true});
  });
  ToolDone on_result = [state, core = timer.core_](ToolResult r) {
    if (!state->claim()) return;
    core->cancel(state->timer_id);
    state->deliver(std::move(r));
  };
  try {
    tool->invoke(arguments, deadline, cancel, std::move(on_result));
  } catch (const std::exception& e) {
    if (state->claim()) {
      timer.cancel(state->timer_id);
      state->deliver({"tool '" + name + "' failed: " + e.what(), true});
    }
  } catch (...) {
    if (state->claim()) {
      timer.cancel(state->timer_id);
      state->deliver({"tool '" + name + "' failed: unknown exception", true});
    }
  }
}

}  // namespace exl
