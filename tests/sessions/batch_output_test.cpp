#include "sessions/batch_output.h"

#include <gtest/gtest.h>

#include "kernels/error.h"
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

}  // namespace batch_output_test
}  // namespace exl
