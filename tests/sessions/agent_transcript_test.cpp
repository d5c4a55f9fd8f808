// Transcript storage (issue 28: transcripts were 0644 files in a shared temp directory, never
// deleted): the private directory's checks, 0600 files, and retention by count and bytes.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kernels/error.h"
#include "sessions/agent_transcript.h"
#include "test_support.h"

namespace exl {
namespace agent_transcript_test {

namespace fs = std::filesystem;

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return unsigned(st.st_mode & 07777);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

Transcript sample(const std::string& id, size_t content_bytes = 10) {
  Transcript t;
  t.id = id;
  t.messages.push_back({"user", std::string(content_bytes, 'x'), {}, {}});
  return t;
}

TEST(AgentTranscript, PrivateDirectoryAndFiles) {
  const fs::path base = test::temp_dir("transcripts");
  const fs::path dir = base / "nested" / "sessions";
  const mode_t old = ::umask(022);
  save_transcript(dir, sample("s-1"));
  ::umask(old);
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(dir / "s-1.json"), 0600u);
  EXPECT_EQ(load_transcript(dir, "s-1").messages.size(), 1u);
  save_transcript(dir, sample("s-1", 20));  // replaced, still 0600
  EXPECT_EQ(mode_of(dir / "s-1.json"), 0600u);

  const fs::path open_dir = base / "open";
  fs::create_directories(open_dir);
  fs::permissions(open_dir, fs::perms(0755));
  EXPECT_NE(error_of([&] { prepare_private_dir(open_dir); }).find("has mode 0755"), std::string::npos);
  save_transcript(open_dir, sample("s-2"));  // a workflow's output directory: used as it is
  EXPECT_EQ(mode_of(open_dir / "s-2.json"), 0600u);

  const fs::path link = base / "link";
  fs::create_symlink(dir, link);
  EXPECT_NE(error_of([&] { prepare_private_dir(link); }).find("is a symlink"), std::string::npos);
  const fs::path file = base / "file";
  std::ofstream(file) << "x";
  EXPECT_NE(error_of([&] { prepare_private_dir(file); }).find("is not a directory"), std::string::npos);
  if (::geteuid() != 0) {
    EXPECT_NE(error_of([] { prepare_private_dir("/"); }).find("belongs to uid 0"), std::string::npos);
  }
}

TEST(AgentTranscript, RetentionDeletesTheOldestButSparesLiveSessions) {
  const fs::path dir = test::temp_dir("retention") / "sessions";
  const auto t0 = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (int i = 0; i < 6; ++i) {
    const std::string id = "s-" + std::to_string(i);
    save_transcript(dir, sample(id, 1000));
    fs::last_write_time(dir / (id + ".json"), t0 + std::chrono::minutes(i));
  }
  std::ofstream(dir / "notes.txt") << "not a transcript";
  EXPECT_EQ(prune_transcripts(dir, {4, 0}, {"s-0"}), 2u);  // s-0 is live: s-1, s-2 go
  for (const char* id : {"s-0", "s-3", "s-4", "s-5"}) EXPECT_TRUE(fs::exists(dir / (std::string(id) + ".json"))) << id;
  EXPECT_FALSE(fs::exists(dir / "s-1.json"));
  EXPECT_FALSE(fs::exists(dir / "s-2.json"));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));

  const uint64_t one = fs::file_size(dir / "s-3.json");
  EXPECT_EQ(prune_transcripts(dir, {0, 2 * one + one / 2}), 2u);  // bytes: two fit
  EXPECT_FALSE(fs::exists(dir / "s-0.json"));
  EXPECT_FALSE(fs::exists(dir / "s-3.json"));
  EXPECT_TRUE(fs::exists(dir / "s-4.json"));
  EXPECT_TRUE(fs::exists(dir / "s-5.json"));
  EXPECT_EQ(prune_transcripts(dir, {0, 0}), 0u);
}

}  // namespace agent_transcript_test
}  // namespace exl
