// Processes started by exlagent are stopped with it: the real `exlagent serve --mcp` binary with
// tests/tools/fake_mcp_server.py, ended by SIGTERM (a drain) and by SIGKILL (nothing of exlagent
// runs: the kernel's parent-death signal ends the server). Skipped without stories260K or the
// built binary.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "test_support.h"
#include "tools/mcp/child_process.h"

namespace exl {
namespace mcp_process_lifetime_test {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The fake server's pid once it has recorded its start (up to 30 s), else -1.
pid_t started_pid(const fs::path& record) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream in(record);
    std::string line;
    if (std::getline(in, line) && !line.empty()) return json::parse(line)["started"].get<pid_t>();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

bool ended(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

class McpProcessLifetime : public testing::TestWithParam<int> {};

TEST_P(McpProcessLifetime, TheMcpServerEndsWithExlagent) {
  const fs::path model = test::shared_dir() / "models/stories260K-hf";
  const fs::path exe = test::binary_dir() / "exlagent";
  if (!fs::exists(model / "model.safetensors")) GTEST_SKIP() << "shared asset missing: models/stories260K-hf";
  if (!fs::exists(exe)) GTEST_SKIP() << "the exlagent binary is not built";
  const fs::path dir = test::temp_dir(cat("McpProcessLifetime_", GetParam()));
  const fs::path record = dir / "record.jsonl";
  auto serve = ChildProcess::spawn({exe.string(), "serve", "--model", model.string(), "--port", "0", "--threads", "1",
                                    "--session-dir", (dir / "sessions").string(), "--mcp",
                                    "fake=python3 " + std::string(EXL_SOURCE_DIR) +
                                        "/tests/tools/fake_mcp_server.py --record " + record.string()});
  const pid_t server = started_pid(record);
  ASSERT_GT(server, 0) << "the MCP server did not start";
  EXPECT_EQ(::kill(server, 0), 0);
  ASSERT_EQ(::kill(serve->pid(), GetParam()), 0);
  EXPECT_TRUE(ended(server)) << "the MCP server outlived exlagent (signal " << GetParam() << ")";
  serve->stop(std::chrono::milliseconds(2000));
}

INSTANTIATE_TEST_SUITE_P(Signals, McpProcessLifetime, testing::Values(SIGTERM, SIGKILL),
                         [](const testing::TestParamInfo<int>& i) { return i.param == SIGTERM ? "Term" : "Kill"; });

}  // namespace mcp_process_lifetime_test
}  // namespace exl
