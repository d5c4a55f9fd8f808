// Test-only: what the MCP client tests share (mcp_client_test over stdio with fake_mcp_server.py,
// mcp_http_client_test over Streamable HTTP with fake_mcp_http_server.py): the fixture that gives
// each test the record file its fake server writes, calls that wait for their result, and the
// cases both transports must pass alike.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/mcp/mcp_client.h"
#include "tools/tool_registry.h"
#include "tools/tool_test_util.h"

namespace exl::test {

// A test whose fake MCP server (--record FILE) appends its starts and the messages it received,
// one JSON object a line, to record_: a fresh temporary file named after `prefix`, the process
// and the test, removed after the test.
class FakeMcpRecordTest : public testing::Test {
 protected:
  explicit FakeMcpRecordTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    record_ = std::filesystem::temp_directory_path() /
              (prefix_ + std::to_string(::getpid()) + "-" +
               testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl");
    std::filesystem::remove(record_);
  }
  void TearDown() override { std::filesystem::remove(record_); }

  std::vector<nlohmann::json> recorded() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(record_);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // The recorded objects that have `key`.
  std::vector<nlohmann::json> recorded_with(const std::string& key) const {
    std::vector<nlohmann::json> out;
    for (auto& j : recorded())
      if (j.contains(key)) out.push_back(j);
    return out;
  }

  std::filesystem::path record_;

 private:
  std::string prefix_;
};

// Calls `tool` on the client directly (30 s deadline) and waits for the result; a call that does
// not end within 40 s is a failure.
inline ToolResult call_mcp(McpClient& c, const std::string& tool, const nlohmann::json& args,
                           std::shared_ptr<CancelToken> cancel = nullptr) {
  std::promise<ToolResult> p;
  auto f = p.get_future();
  c.call(tool, args, ToolClock::now() + std::chrono::seconds(30), [&p](ToolResult r) { p.set_value(std::move(r)); },
         std::move(cancel));
  EXPECT_EQ(f.wait_for(std::chrono::seconds(40)), std::future_status::ready) << "the call hangs";
  return f.get();
}

// Polls `done` every 10 ms, at most `tries` times, until it holds.
inline void poll_until(const std::function<bool()>& done, int tries) {
  for (int i = 0; i < tries && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// Both fake servers: their `change` tool adds a tool `extra` and sends
// notifications/tools/list_changed; the registry then holds `server`__extra beside the others
// (`kept`, a tool it had before).
inline void expect_list_changed_reregisters(const std::shared_ptr<McpClient>& c, const std::string& server,
                                            const std::string& kept) {
  ToolRegistry reg;
  register_mcp_tools(reg, c);
  const std::string extra = server + "__extra";
  EXPECT_FALSE(reg.contains(extra));
  EXPECT_EQ(call_now(reg, server + "__change", nlohmann::json::object()).content, "changed");
  poll_until([&] { return reg.contains(extra); }, 1000);
  EXPECT_TRUE(reg.contains(extra));
  EXPECT_TRUE(reg.contains(server + "__" + kept));
}

// @modelcontextprotocol/server-everything (tests/node), started as `everything`: registers its
// tools in `reg`, echoes `message` and sums 2 and 3.
inline void expect_server_everything_echoes_and_sums(const std::shared_ptr<McpClient>& c, ToolRegistry& reg,
                                                     const std::string& message) {
  EXPECT_EQ(c->protocol_version(), "2025-06-18");
  for (const auto& line : register_mcp_tools(reg, c)) std::cerr << "note: " << line << "\n";
  ASSERT_TRUE(reg.contains("everything__echo"));
  ToolResult r = call_now(reg, "everything__echo", {{"message", message}});
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_EQ(r.content, "Echo: " + message);
  r = call_now(reg, "everything__get-sum", {{"a", 2}, {"b", 3}});
  EXPECT_TRUE(contains(r.content, "5")) << r.content;
}

}  // namespace exl::test
