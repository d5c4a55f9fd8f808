// What the agent-session tests share: a ServerState on stories260K (CPU, the mistral template's
// compact tool format: the model's context is 512 tokens) for the whole suite, AgentEnvs whose
// turns write scripted replies (ForcedTextHook), and a log of a session's events.
// Test-only; tests/README.md lists the fixtures.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

#include <boost/asio/thread_pool.hpp>

#include "runtime/server/server_state.h"
#include "sessions/agent_constraint.h"
#include "sessions/agent_session.h"
#include "test_support.h"

namespace exl::test {

// Collects a session's events; wait_done blocks (up to 60 s) until the nth "done" arrives.
struct AgentEventLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<AgentEvent> all;
  AgentSink sink() {
    return [this](const AgentEvent& e) {
      std::lock_guard lk(mu);
      all.push_back(e);
      cv.notify_all();
    };
  }
  std::string errors() {
    std::lock_guard lk(mu);
    std::string s;
    for (const auto& e : all)
      if (e.type == "error") s += e.data.dump() + "\n";
    return s;
  }
  nlohmann::json wait_done(size_t nth = 1) {
    std::unique_lock lk(mu);
    nlohmann::json out;
    cv.wait_for(lk, std::chrono::seconds(60), [&] {
      size_t k = 0;
      for (const auto& e : all)
        if (e.type == "done" && ++k == nth) {
          out = e.data;
          return true;
        }
      return false;
    });
    return out;
  }
  std::vector<AgentEvent> of(const std::string& type) {
    std::lock_guard lk(mu);
    std::vector<AgentEvent> v;
    for (const auto& e : all)
      if (e.type == type) v.push_back(e);
    return v;
  }
};

// Skips every test when stories260K is absent; each test gets a fresh private directory.
class ScriptedAgentTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = shared_dir() / "models/stories260K-hf";
    if (!std::filesystem::exists(dir / "model.safetensors")) return;
    ServerOptions o;
    o.model_dir = dir.string();
    o.page_size = 16;
    o.cache_pages = 128;
    o.cpu_threads = 1;
    o.chat_template = "mistral";
    state_ = std::make_unique<ServerState>(o);
    state_->generator().start();
  }
  static void TearDownTestSuite() { state_.reset(); }
  void SetUp() override {
    if (!state_) GTEST_SKIP() << "shared asset missing: models/stories260K-hf";
    dir_ = std::filesystem::temp_directory_path() /
           ("exl-agent-" + std::to_string(::getpid()) + "-" + testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Turn n writes replies[n - 1] (the last one again after the list ends).
  AgentEnv scripted_env(std::vector<std::string> replies,
                        std::function<std::shared_ptr<Tool>(const std::string&)> find_tool) {
    AgentEnv e;
    e.generator = &state_->generator();
    e.tokenizer = &state_->tokenizer();
    e.chat_template = state_->chat_template();
    e.encode_prompt = [](const RenderedPrompt& p) { return state_->encode_prompt(p); };
    e.find_tool = std::move(find_tool);
    const Tokenizer* tok = e.tokenizer;
    e.constraint = [tok, replies](const AgentTurnContext& c) -> std::shared_ptr<LogitsMaskHook> {
      return ForcedTextHook::for_text(*tok, replies[std::min<size_t>(size_t(c.turn), replies.size()) - 1]);
    };
    e.executor = pool_.get_executor();
    e.dir = dir_;
    e.context_length = state_->context_length();
    return e;
  }

  static inline std::unique_ptr<ServerState> state_;
  boost::asio::thread_pool pool_{1};
  std::filesystem::path dir_;
};

}  // namespace exl::test
