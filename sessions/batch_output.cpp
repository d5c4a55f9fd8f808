#include "sessions/batch_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kernels/error.h"

namespace exl {

namespace {

[[noreturn]] void sys_fail(const std::filesystem::path& p, const char* what) {
  fail("sessions: batch: output '", p.string(), "': ", what, ": ", std::strerror(errno));
}

}  // namespace

BatchOutputFile::BatchOutputFile(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) sys_fail(path_, "cannot open");
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::pread(fd_, buf, sizeof buf, off_t(data.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd_);
      sys_fail(path_, "cannot read");
    }
    if (n == 0) break;
    data.append(buf, size_t(n));
  }
  const size_t end = data.rfind('\n');
  const size_t keep = end == std::string::npos ? 0 : end + 1;
  if (keep < data.size()) {
    truncated_ = data.size() - keep;
    if (::ftruncate(fd_, off_t(keep)) != 0 || ::fsync(fd_) != 0) {
      ::close(fd_);
      sys_fail(path_, "cannot truncate a partial last line");
    }
  }
  size_t pos = 0;
  while (pos < keep) {
    const size_t nl = data.find('\n', pos);
    if (nl > pos) existing_.push_back(data.substr(pos, nl - pos));
    pos = nl + 1;
  }
}

BatchOutputFile::~BatchOutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void BatchOutputFile::append(std::string_view line) {
  EXL_CHECK(line.find('\n') == std::string_view::npos, "sessions: batch: output '", path_.string(),
            "': a result line contains a newline");
  std::string full(line);
  full += '\n';
  size_t done = 0;
  while (done < full.size()) {
    const ssize_t n = ::write(fd_, full.data() + done, full.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) sys_fail(path_, "cannot write");
    done += size_t(n);
  }
  if (::fsync(fd_) != 0) sys_fail(path_, "cannot sync");
}

}  // namespace exl
