#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "kernels/error.h"
#include "test_support.h"
#include "tools/builtin_tools.h"
#include "tool_test_util.h"

namespace exl {
namespace builtin_read_file_test {

namespace fs = std::filesystem;
using nlohmann::json;
using test::contains;

// <tmp>/root (the allowed directory) and <tmp>/root2, <tmp>/secret.txt beside it.
class ReadFile : public ::testing::Test {
 protected:
  void SetUp() override {
    base = fs::temp_directory_path() / ("exl_read_file_" + std::to_string(::getpid()));
    fs::remove_all(base);
    root = base / "root";
    fs::create_directories(root / "sub");
    fs::create_directories(base / "root2");
    test::write_file(root / "a.txt", "hello\n");
    test::write_file(root / "sub" / "b.txt", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");  // café € 😀
    test::write_file(root / "sixteen.txt", std::string(16, 'x'));
    test::write_file(root / "seventeen.txt", std::string(17, 'x'));
    test::write_file(root / "latin1.txt", "caf\xe9");
    test::write_file(root / "overlong.txt", "\xc0\xaf");
    test::write_file(root / "surrogate.txt", "\xed\xa0\x80");
    test::write_file(root / "truncated.txt", "ok \xe2\x82");
    test::write_file(root / "empty.txt", "");
    test::write_file(base / "secret.txt", "top secret");
    test::write_file(base / "root2" / "f.txt", "sibling");
    fs::create_symlink(base / "secret.txt", root / "leak");
    fs::create_symlink("../secret.txt", root / "leak_rel");
    fs::create_symlink(base, root / "updir");
    fs::create_symlink("../root2", root / "sibling");
    fs::create_symlink("a.txt", root / "alias");
    fs::create_symlink("sub", root / "subalias");
    opts.read_root = root;
    opts.read_max_bytes = 16;
    for (auto& t : make_builtin_tools(opts)) reg.add(t);
  }
  void TearDown() override { fs::remove_all(base); }
  ToolResult read(const std::string& path) { return test::call_now(reg, "read_file", {{"path", path}}); }
  void refused(const std::string& path, const std::string& why) {
    ToolResult r = read(path);
    EXPECT_TRUE(r.is_error) << path << " -> " << r.content;
    EXPECT_TRUE(contains(r.content, why)) << path << " -> " << r.content;
    EXPECT_FALSE(contains(r.content, "top secret"));
  }

  fs::path base, root;
  BuiltinToolOptions opts;
  ToolRegistry reg;
};

TEST_F(ReadFile, ReadsFilesUnderTheRoot) {
  EXPECT_EQ(read("a.txt").content, "hello\n");
  EXPECT_EQ(read("./a.txt").content, "hello\n");
  EXPECT_EQ(read("sub/b.txt").content, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(read("alias").content, "hello\n");  // a symlink that stays inside is fine
  EXPECT_EQ(read("subalias/b.txt").content, read("sub/b.txt").content);
  EXPECT_EQ(read("sixteen.txt").content, std::string(16, 'x'));
  ToolResult r = read("empty.txt");
  EXPECT_FALSE(r.is_error);
  EXPECT_EQ(r.content, "");
}

TEST_F(ReadFile, RefusesEscapes) {
  refused("../secret.txt", "contains '..'");
  refused("sub/../../secret.txt", "contains '..'");
  refused("sub/../a.txt", "contains '..'");
  refused((base / "secret.txt").string(), "is absolute");
  refused("/etc/passwd", "is absolute");
  refused("leak", "resolves (through a symlink) outside the root directory");
  refused("leak_rel", "outside the root directory");
  refused("updir/secret.txt", "outside the root directory");
  refused("sibling/f.txt", "outside the root directory");  // root2 shares the prefix "root"
}

TEST_F(ReadFile, RefusesBadFiles) {
  refused("missing.txt", "no such file");
  refused("sub", "is not a regular file");
  refused("seventeen.txt", "is 17 bytes, more than the limit of 16");
  refused("latin1.txt", "is not UTF-8 text");
  refused("overlong.txt", "is not UTF-8 text");
  refused("surrogate.txt", "is not UTF-8 text");
  refused("truncated.txt", "is not UTF-8 text");
  ToolResult r = read("");
  EXPECT_TRUE(r.content.starts_with("invalid arguments for tool 'read_file'")) << r.content;
  r = test::call_now(reg, "read_file", {{"path", "a.txt"}, {"mode", "rw"}});
  EXPECT_TRUE(contains(r.content, "unexpected property 'mode'")) << r.content;
  r = test::invoke_now(*reg.find("read_file"), {{"path", std::string("a\0b", 3)}});
  EXPECT_TRUE(contains(r.content, "contains a NUL byte")) << r.content;
}

TEST_F(ReadFile, SymlinksAreWalkedInsideTheRootOnly) {
  fs::create_symlink("..", root / "sub" / "up");
  fs::create_symlink("up/sub/up/a.txt", root / "sub" / "loopy");
  fs::create_symlink("up/..", root / "sub" / "up2");
  fs::create_symlink((root / "a.txt").string(), root / "absolute_inside");
  fs::create_symlink("self", root / "self");
  EXPECT_EQ(read("sub/up/a.txt").content, "hello\n");
  EXPECT_EQ(read("sub/loopy").content, "hello\n");
  refused("sub/up2/secret.txt", "outside the root directory");
  refused("sub/up/updir/secret.txt", "outside the root directory");
  refused("absolute_inside", "outside the root directory");  // absolute targets are never followed
  refused("self", "too many symlinks");
  refused("a.txt/x", "no such file");
  ASSERT_EQ(::mkfifo((root / "fifo").c_str(), 0600), 0);
  refused("fifo", "is not a regular file");  // and no hang waiting for a writer
}

// Issue 28: the root-relative path was checked (canonical) and then opened by name, so swapping a
// directory for a symlink between the two read a file outside the root. Now nothing is looked up
// by path twice: the race can only ever yield the inside file or an error.
TEST_F(ReadFile, SwappingADirectoryForASymlinkNeverLeaks) {
  fs::create_directories(root / "d");
  test::write_file(root / "d" / "s.txt", "inside");
  fs::create_directories(base / "outside");
  test::write_file(base / "outside" / "s.txt", "top secret");
  fs::create_symlink(base / "outside", root / "d_swap");
  auto swap = [&] {
    return ::renameat2(AT_FDCWD, (root / "d").c_str(), AT_FDCWD, (root / "d_swap").c_str(), RENAME_EXCHANGE);
  };
  if (swap() != 0) GTEST_SKIP() << "renameat2(RENAME_EXCHANGE) unsupported here";
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    while (!stop) swap();
  });
  int inside = 0, leaked = 0;
  for (int i = 0; i < 20000; ++i) {
    ToolResult r = read("d/s.txt");
    if (contains(r.content, "top secret")) ++leaked;
    else if (!r.is_error && r.content == "inside") ++inside;
  }
  stop = true;
  flipper.join();
  EXPECT_EQ(leaked, 0);
  std::printf("[ info     ] %d of 20000 reads got the inside file\n", inside);
}

TEST_F(ReadFile, RootMustExist) {
  BuiltinToolOptions o;
  o.read_root = base / "nope";
  EXPECT_THROW(make_read_file_tool(o), Error);
  o.read_root = root / "a.txt";
  EXPECT_THROW(make_read_file_tool(o), Error);
}

}  // namespace builtin_read_file_test
}  // namespace exl
