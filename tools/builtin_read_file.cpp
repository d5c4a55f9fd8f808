// read_file: a text file under the configured root. Checks, in order: the path is relative, not
// empty, has no NUL and no ".." component. Then the path is walked without ever asking the kernel
// to resolve more than one name: each component is opened with openat(O_NOFOLLOW) relative to
// the directory fd reached so far, starting from an O_DIRECTORY fd of the root opened when the
// tool was made. A component that is a symlink is read (readlinkat) and its target walked in its
// place: an absolute target, or ".." above the root, is refused, so no name is ever looked up
// outside the root. Swapping a directory for a symlink between checks cannot redirect the read:
// there is no second lookup by path. Finally the opened file must be a regular file (fstat) no
// larger than the cap, and its bytes valid UTF-8.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/error.h"
#include "tools/builtin_tools.h"
#include "tools/function_tool.h"

namespace exl {
namespace fs = std::filesystem;
namespace {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = uint8_t(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const uint8_t b = uint8_t(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

constexpr int kMaxSymlinks = 40;

struct ReadFileFd {
  int fd = -1;
  explicit ReadFileFd(int f = -1) : fd(f) {}
  ReadFileFd(ReadFileFd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  ReadFileFd& operator=(ReadFileFd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~ReadFileFd() {
    if (fd >= 0) ::close(fd);
  }
};

void split_path(std::string_view path, std::deque<std::string>& out_front) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string_view::npos) end = path.size();
    if (end > pos) parts.emplace_back(path.substr(pos, end - pos));
    pos = end + 1;
  }
  out_front.insert(out_front.begin(), parts.begin(), parts.end());
}

// Opens `rel` under the root fd as described at the top of this file; returns the file's fd.
ReadFileFd open_beneath(int root_fd, const std::string& rel, const std::string& shown) {
  std::deque<std::string> todo;
  split_path(rel, todo);
  std::vector<ReadFileFd> dirs;  // directories below the root, outermost first
  ReadFileFd file;
  int links = 0;
  while (!todo.empty()) {
    const std::string name = std::move(todo.front());
    todo.pop_front();
    file = ReadFileFd();
    if (name == ".") continue;
    if (name == "..") {  // only from a symlink's target: the user's path has none
      EXL_CHECK(!dirs.empty(), "read_file: path ", shown, " resolves (through a symlink) outside the root directory");
      dirs.pop_back();
      continue;
    }
    const int at = dirs.empty() ? root_fd : dirs.back().fd;
    const bool last = todo.empty();
    const int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (last ? 0 : O_DIRECTORY);
    ReadFileFd fd(::openat(at, name.c_str(), flags));
    if (fd.fd < 0) {
      const int err = errno;
      struct stat st {};
      if ((err == ELOOP || err == ENOTDIR) && ::fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode)) {
        EXL_CHECK(++links <= kMaxSymlinks, "read_file: path ", shown, ": too many symlinks");
        char target[PATH_MAX];
        const ssize_t n = ::readlinkat(at, name.c_str(), target, sizeof target);
        EXL_CHECK(n > 0 && size_t(n) < sizeof target, "read_file: path ", shown, ": unreadable symlink");
        EXL_CHECK(target[0] != '/', "read_file: path ", shown,
                  " resolves (through a symlink) outside the root directory");
        split_path(std::string_view(target, size_t(n)), todo);
        continue;
      }
      EXL_CHECK(err != ENOENT, "read_file: path ", shown, ": no such file");
      EXL_CHECK(err != ENOTDIR, "read_file: path ", shown, ": no such file (a component is not a directory)");
      fail("read_file: path ", shown, ": ", std::strerror(err));
    }
    if (last) file = std::move(fd);
    else dirs.push_back(std::move(fd));
  }
  EXL_CHECK(file.fd >= 0, "read_file: path ", shown, " is not a regular file");
  return file;
}

ToolResult read(int root_fd, uint64_t cap, const nlohmann::json& args) {
  const std::string rel = args.at("path").get<std::string>();
  const std::string shown = nlohmann::json(rel).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXL_CHECK(!rel.empty(), "read_file: path is empty");
  EXL_CHECK(rel.find('\0') == std::string::npos, "read_file: path ", shown, " contains a NUL byte");
  const fs::path p(rel);
  EXL_CHECK(!p.is_absolute() && !p.has_root_name() && !p.has_root_directory(), "read_file: path ", shown,
            " is absolute; give a path relative to the root directory");
  for (const fs::path& part : p)
    EXL_CHECK(part != "..", "read_file: path ", shown, " contains '..'; paths may not leave the root directory");
  const ReadFileFd fd = open_beneath(root_fd, rel, shown);
  struct stat st {};
  EXL_CHECK(::fstat(fd.fd, &st) == 0 && S_ISREG(st.st_mode), "read_file: path ", shown, " is not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  EXL_CHECK(size <= cap, "read_file: path ", shown, " is ", size, " bytes, more than the limit of ", cap);
  std::string data(size_t(cap) + 1, '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd.fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    EXL_CHECK(n >= 0, "read_file: path ", shown, ": ", std::strerror(errno));
    if (n == 0) break;
    got += size_t(n);
  }
  data.resize(got);
  EXL_CHECK(data.size() <= cap, "read_file: path ", shown, " is more than the limit of ", cap, " bytes");
  EXL_CHECK(valid_utf8(data), "read_file: path ", shown, " is not UTF-8 text");
  return {data};
}

}  // namespace

std::shared_ptr<Tool> make_read_file_tool(const BuiltinToolOptions& opts) {
  std::error_code ec;
  const fs::path root = fs::canonical(opts.read_root, ec);
  EXL_CHECK(!ec && fs::is_directory(root), "tools: read_file: root '", opts.read_root.string(),
            "' is not an existing directory");
  ToolSpec spec{"read_file",
                "Read a UTF-8 text file, given its path relative to the allowed directory.",
                {{"type", "object"},
                 {"properties",
                  {{"path",
                    {{"type", "string"}, {"minLength", 1}, {"maxLength", 4096},
                     {"description", "relative path, e.g. notes/todo.txt"}}}}},
                 {"required", {"path"}},
                 {"additionalProperties", false}}};
  auto root_fd = std::make_shared<ReadFileFd>(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXL_CHECK(root_fd->fd >= 0, "tools: read_file: cannot open root '", root.string(), "': ", std::strerror(errno));
  const uint64_t cap = opts.read_max_bytes;
  return std::make_shared<FunctionTool>(std::move(spec), [root_fd, cap](const nlohmann::json& args, const CancelToken&) {
    return read(root_fd->fd, cap, args);
  });
}

}  // namespace exl
