// Issue #28, batch data safety end to end: a second job on an output another job holds exits 3
// and leaves it alone (the first job's output keeps every id exactly once), and a write that
// fails (/dev/full: ENOSPC) stops the job with an error instead of exiting 0 with results lost.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/cli/cli_commands.h"
#include "runtime/batch_job_support.h"
#include "runtime/cli_runner.h"
#include "test_support.h"

namespace exl {
namespace cli_batch_output_test {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

TEST(CliBatchOutput, ALockedOutputExits3AndIsLeftAlone) {
  const auto dir = test::temp_dir("CliBatchOutput_locked");
  test::write_file(dir / "in.jsonl", test::batch_simple_lines(3, 4));
  const fs::path out = dir / "out.jsonl";
  const std::string before = "{\"id\":\"r0\",\"output\":\"x\"}\n{\"id\":\"r1\",";  // the holder, mid-write
  test::write_file(out, before);
  const int held = ::open(out.c_str(), O_RDWR);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  auto r = test::run_cli(cli_batch, {"--model", test::job_model_dir(), "--input", (dir / "in.jsonl").string(), "--output",
                                     out.string(), "--threads", "1"});
  ::close(held);
  EXPECT_EQ(r.code, 3) << r.error << r.err;
  EXPECT_NE(r.err.find("exlagent batch: error: sessions: batch: output '" + out.string() +
                       "' is in use: another batch job holds its lock"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(test::read_file(out), before);
}

TEST(CliBatchOutput, ASecondConcurrentJobIsRefusedAndTheFirstWritesEveryIdOnce) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const fs::path bin = test::binary_dir() / "exlagent";
  if (!fs::exists(bin)) GTEST_SKIP() << "the exlagent binary is not built: " << bin;
  const auto dir = test::temp_dir("CliBatchOutput_concurrent");
  const int n = 120;
  test::write_file(dir / "in.jsonl", test::batch_simple_lines(n, 32));
  const fs::path out = dir / "out.jsonl";
  const std::vector<std::string> args = {"batch", "--model", test::job_model_dir(), "--input", (dir / "in.jsonl").string(),
                                         "--output", out.string(), "--concurrency", "4", "--threads", "1", "--quiet"};
  const pid_t pid = test::spawn_quiet(bin, args);
  ASSERT_GE(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (test::count_file_lines(out) < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto r = test::run_cli(cli_batch, {args.begin() + 1, args.end()});
  int status = 0;
  const bool reaped = r.code != 3 && ::waitpid(pid, &status, WNOHANG) == pid;
  if (reaped && test::count_file_lines(out) == size_t(n)) GTEST_SKIP() << "the first job finished before the second started";
  EXPECT_EQ(r.code, 3) << r.error << r.err;
  EXPECT_NE(r.err.find("is in use"), std::string::npos) << r.err;
  if (!reaped) {
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the first job failed: status " << status;
  const std::string s = test::read_file(out);
  std::map<std::string, int> count;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t nl = s.find('\n', pos);
    ASSERT_NE(nl, std::string::npos) << "partial last line";
    ++count[ojson::parse(s.substr(pos, nl - pos))["id"].get<std::string>()];
    pos = nl + 1;
  }
  EXPECT_EQ(count.size(), size_t(n));
  for (const auto& [id, c] : count) EXPECT_EQ(c, 1) << id;
}

TEST(CliBatchOutput, ATornLastLineIsCutBackNamedAndRunAgain) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const auto dir = test::temp_dir("CliBatchOutput_torn");
  test::write_file(dir / "in.jsonl", test::batch_simple_lines(3, 4));
  const fs::path out = dir / "out.jsonl";
  const std::string kept = "{\"id\":\"r0\",\"output\":\"kept\"}\n";
  test::write_file(out, kept + "{\"id\":\"r1\",\"outp");
  auto r = test::run_cli(cli_batch, {"--model", test::job_model_dir(), "--input", (dir / "in.jsonl").string(), "--output",
                                     out.string(), "--threads", "1", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  EXPECT_NE(r.err.find("removed a partial last line (16 bytes, no newline) left by an interrupted write; it began "
                       "\"{\\\"id\\\":\\\"r1\\\",\\\"outp\""),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("2 ok, 0 errors, 1 already done"), std::string::npos) << r.err;
  const std::string s = test::read_file(out);
  ASSERT_EQ(s.substr(0, kept.size()), kept);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 3);
  EXPECT_NE(s.find("{\"id\":\"r1\",\"output\":"), std::string::npos) << s;
  EXPECT_NE(s.find("{\"id\":\"r2\",\"output\":"), std::string::npos) << s;
}

TEST(CliBatchOutput, AFullDeviceStopsTheJobWithAnError) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const auto dir = test::temp_dir("CliBatchOutput_full");
  test::write_file(dir / "in.jsonl", test::batch_simple_lines(6, 4));
  auto r = test::run_cli(cli_batch, {"--model", test::job_model_dir(), "--input", (dir / "in.jsonl").string(), "--output",
                                     "/dev/full", "--concurrency", "2", "--threads", "1", "--quiet"});
  EXPECT_EQ(r.code, -1) << "the job did not fail: " << r.err;
  EXPECT_NE(r.error.find("runtime: batch: stopped: sessions: batch: output '/dev/full': cannot write: "
                         "No space left on device"),
            std::string::npos)
      << r.error;
  EXPECT_NE(r.error.find("0 complete result lines, 6 requests are not done"), std::string::npos) << r.error;
  EXPECT_NE(r.err.find("0 ok, 0 errors"), std::string::npos) << r.err;
}

}  // namespace cli_batch_output_test
}  // namespace exl
