#include "sessions/batch_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "kernels/error.h"
#include "sessions/batch_line_writer.h"
#include "test_support.h"

namespace exl {
namespace batch_output_test {

TEST(BatchOutput, CreatesAppendsAndRereadsCompleteLines) {
  const auto dir = test::temp_dir("BatchOutput_create");
  const auto path = dir / "out.jsonl";
  {
    BatchOutputFile f(path);
    EXPECT_TRUE(f.existing_lines().empty());
    f.append(R"({"id":"a"})");
    f.append(R"({"id":"b"})");
  }
  EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
  BatchOutputFile f(path);
  EXPECT_EQ(f.existing_lines(), (std::vector<std::string>{R"({"id":"a"})", R"({"id":"b"})"}));
  EXPECT_EQ(f.truncated_bytes(), 0u);
  f.append(R"({"id":"c"})");
  EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n");
}

TEST(BatchOutput, TruncatesAPartialLastLineLeftByACrash) {
  const auto dir = test::temp_dir("BatchOutput_partial");
  const auto path = dir / "out.jsonl";
  test::write_file(path, "{\"id\":\"a\"}\n{\"id\":\"b\",\"out");
  BatchOutputFile f(path);
  EXPECT_EQ(f.existing_lines(), std::vector<std::string>{R"({"id":"a"})"});
  EXPECT_EQ(f.truncated_bytes(), 14u);
  EXPECT_EQ(f.truncated_head(), "{\"id\":\"b\",\"out");
  EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n");
  f.append(R"({"id":"b"})");
  EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
}

TEST(BatchOutput, APartialOnlyLineLeavesAnEmptyFile) {
  const auto dir = test::temp_dir("BatchOutput_partial_only");
  const auto path = dir / "out.jsonl";
  test::write_file(path, "{\"id\":");
  BatchOutputFile f(path);
  EXPECT_TRUE(f.existing_lines().empty());
  EXPECT_EQ(test::read_file(path), "");
}

TEST(BatchOutput, RefusesNewlinesAndUnopenablePaths) {
  const auto dir = test::temp_dir("BatchOutput_errors");
  BatchOutputFile f(dir / "out.jsonl");
  EXPECT_THROW(f.append("a\nb"), Error);
  try {
    BatchOutputFile g(dir / "missing-dir" / "out.jsonl");
    FAIL() << "opened a file in a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sessions: batch: output '"), std::string::npos) << e.what();
  }
}

// Issue #28: a full disk lost results silently. An io whose write number `fail_at` (1-based)
// fails with `err` after accepting `accept` bytes of it (in a call of its own), and whose sync
// number `sync_fail_at` fails with `sync_err`.
struct FaultyIo {
  int fail_at = 0, sync_fail_at = 0;
  int err = ENOSPC, sync_err = EIO;
  size_t accept = 0;
  int writes = 0, syncs = 0;
  bool accepted = false;

  BatchOutputIo io() {
    return {[this](int fd, const void* data, size_t size) -> ssize_t {
              if (++writes == fail_at) {
                if (accept > 0 && !accepted) {
                  accepted = true;
                  --writes;
                  return ::write(fd, data, std::min(accept, size));
                }
                errno = err;
                return -1;
              }
              return ::write(fd, data, size);
            },
            [this](int fd) {
              if (++syncs == sync_fail_at) {
                errno = sync_err;
                return -1;
              }
              return ::fsync(fd);
            }};
  }
};

std::string append_error(BatchOutputFile& f, std::string_view line) {
  try {
    f.append(line);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BatchOutput, AFailedWriteIsReportedAndKeepsEveryCompleteLine) {
  const auto dir = test::temp_dir("BatchOutput_enospc");
  const auto path = dir / "out.jsonl";
  FaultyIo faults;
  faults.fail_at = 3;
  BatchOutputFile f(path, faults.io());
  f.append(R"({"id":"a"})");
  f.append(R"({"id":"b"})");
  const std::string err = append_error(f, R"({"id":"c"})");
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find("'" + path.string() + "'"), std::string::npos) << err;
  EXPECT_EQ(f.failure(), err);
  EXPECT_EQ(append_error(f, R"({"id":"d"})"), err) << "appends after a failure must fail, not buffer";
  EXPECT_EQ(faults.writes, 3) << "no write was attempted after the failure";
  EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
}

TEST(BatchOutput, APartialWriteThenEioIsTruncatedBackToTheLastCompleteLine) {
  const auto dir = test::temp_dir("BatchOutput_eio_partial");
  const auto path = dir / "out.jsonl";
  FaultyIo faults;
  faults.fail_at = 2;
  faults.err = EIO;
  faults.accept = 5;
  BatchOutputFile f(path, faults.io());
  f.append(R"({"id":"a"})");
  const std::string err = append_error(f, R"({"id":"b","output":"long enough"})");
  EXPECT_NE(err.find("cannot write: Input/output error"), std::string::npos) << err;
  EXPECT_TRUE(faults.accepted) << "the fault did not write part of the line first";
  EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n");
}

TEST(BatchOutput, AFailedSyncRemovesItsLineAndIsReported) {
  const auto dir = test::temp_dir("BatchOutput_sync_eio");
  const auto path = dir / "out.jsonl";
  {
    FaultyIo faults;
    faults.sync_fail_at = 2;
    BatchOutputFile f(path, faults.io());
    f.append(R"({"id":"a"})");
    const std::string err = append_error(f, R"({"id":"b"})");
    EXPECT_NE(err.find("cannot sync: Input/output error"), std::string::npos) << err;
    EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n");
  }
  BatchOutputFile again(path);
  EXPECT_EQ(again.existing_lines(), std::vector<std::string>{R"({"id":"a"})"});
}

TEST(BatchOutput, DevFullReportsNoSpaceWithoutReadingTheDevice) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  BatchOutputFile f("/dev/full");
  EXPECT_TRUE(f.existing_lines().empty());
  const std::string err = append_error(f, R"({"id":"a"})");
  EXPECT_NE(err.find("output '/dev/full': cannot write: No space left on device"), std::string::npos) << err;
}

TEST(BatchOutput, ASecondWriterOnTheSameFileIsRefused) {
  const auto dir = test::temp_dir("BatchOutput_lock");
  const auto path = dir / "out.jsonl";
  {
    BatchOutputFile first(path);
    first.append(R"({"id":"a"})");
    {
      std::FILE* raw = std::fopen(path.c_str(), "ab");
      ASSERT_NE(raw, nullptr);
      std::fputs("{\"id\":\"b\",", raw);  // the first job, mid-write
      std::fclose(raw);
    }
    try {
      BatchOutputFile second(path);
      FAIL() << "a second BatchOutputFile opened a locked output";
    } catch (const BatchOutputBusy& e) {
      EXPECT_NE(std::string(e.what()).find("output '" + path.string() + "' is in use"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("another batch job holds its lock"), std::string::npos) << e.what();
    }
    EXPECT_EQ(test::read_file(path), "{\"id\":\"a\"}\n{\"id\":\"b\",") << "the refused writer repaired the file";
  }
  BatchOutputFile after(path);
  EXPECT_EQ(after.existing_lines(), std::vector<std::string>{R"({"id":"a"})"});
}

TEST(BatchOutput, ALockHeldByAnotherProcessIsRefused) {
  const auto dir = test::temp_dir("BatchOutput_lock_process");
  const auto path = dir / "out.jsonl";
  test::write_file(path, "{\"id\":\"a\"}\n");
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(path.c_str(), O_RDWR);
    const char ok = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    char c;
    (void)!::read(release[0], &c, 1);
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y') << "the child could not lock the file";
  EXPECT_THROW(BatchOutputFile{path}, BatchOutputBusy);
  (void)!::write(release[1], "x", 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
  BatchOutputFile f(path);
  EXPECT_EQ(f.existing_lines().size(), 1u);
}

// The writer thread (BatchLineWriter): lines land in push order, each callback after its line is
// in the file; after a failed write the queued lines are dropped, push refuses, failure() names
// the error, and the file keeps exactly the lines written before it.
TEST(BatchLineWriter, WritesInOrderAndStopsAtTheFirstFailure) {
  const auto dir = test::temp_dir("BatchLineWriter");
  {
    const auto path = dir / "ok.jsonl";
    BatchOutputFile f(path);
    std::vector<int> written;
    std::vector<size_t> sizes;
    {
      BatchLineWriter w(f);
      for (int i = 0; i < 50; ++i)
        EXPECT_TRUE(w.push("{\"id\":" + std::to_string(i) + "}", [&, i] {
          written.push_back(i);
          sizes.push_back(test::read_file(path).size());
        }));
      w.finish();
      EXPECT_FALSE(w.push("late")) << "nothing is queued after finish()";
      EXPECT_EQ(w.failure(), "");
    }
    std::string want;
    for (int i = 0; i < 50; ++i) {
      EXPECT_EQ(written[size_t(i)], i);
      want += "{\"id\":" + std::to_string(i) + "}\n";
      EXPECT_GE(sizes[size_t(i)], want.size()) << "callback " << i << " ran before its line was in the file";
    }
    EXPECT_EQ(test::read_file(path), want);
  }
  const auto path = dir / "full.jsonl";
  FaultyIo faults;
  faults.fail_at = 4;
  BatchOutputFile f(path, faults.io());
  BatchLineWriter w(f);
  std::atomic<int> written = 0;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(w.push("{\"id\":" + std::to_string(i) + "}", [&] { ++written; }));
  while (written < 3) std::this_thread::yield();
  EXPECT_TRUE(w.push("{\"id\":3}", [&] { ++written; }));
  w.finish();
  EXPECT_EQ(written, 3);
  EXPECT_NE(w.failure().find("No space left on device"), std::string::npos) << w.failure();
  EXPECT_FALSE(w.push("{\"id\":4}"));
  EXPECT_EQ(test::read_file(path), "{\"id\":0}\n{\"id\":1}\n{\"id\":2}\n");
}

}  // namespace batch_output_test
}  // namespace exl
