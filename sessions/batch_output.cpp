#include "sessions/batch_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace exl {

namespace {

[[noreturn]] void batch_output_sys_fail(const std::filesystem::path& p, const char* what, int err) {
  fail("sessions: batch: output '", p.string(), "': ", what, ": ", std::strerror(err));
}

// Closes the descriptor unless released; for the constructor's error paths.
struct BatchOutputFdGuard {
  int& fd;
  ~BatchOutputFdGuard() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

}  // namespace

BatchOutputIo system_batch_output_io() {
  return {[](int fd, const void* data, size_t size) { return ::write(fd, data, size); },
          [](int fd) { return ::fsync(fd); }};
}

BatchOutputFile::BatchOutputFile(const std::filesystem::path& path, BatchOutputIo io)
    : path_(path), io_(std::move(io)) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  const bool special = !ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st);
  fd_ = ::open(path.c_str(), special ? O_WRONLY | O_APPEND | O_CLOEXEC : O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC,
               0644);
  if (fd_ < 0) batch_output_sys_fail(path_, "cannot open", errno);
  int guarded = fd_;
  BatchOutputFdGuard guard{guarded};
  struct stat sb {};
  if (::fstat(fd_, &sb) != 0) batch_output_sys_fail(path_, "cannot stat", errno);
  regular_ = S_ISREG(sb.st_mode);
  if (!regular_) {
    guarded = -1;
    return;
  }
  int rc;
  while ((rc = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0 && errno == EWOULDBLOCK)
    throw BatchOutputBusy(cat("sessions: batch: output '", path_.string(),
                              "' is in use: another batch job holds its lock; wait for that job to finish"));
  if (rc != 0) batch_output_sys_fail(path_, "cannot lock", errno);
  if (::fstat(fd_, &sb) != 0) batch_output_sys_fail(path_, "cannot stat", errno);

  std::string data(size_t(sb.st_size), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::pread(fd_, data.data() + got, data.size() - got, off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) batch_output_sys_fail(path_, "cannot read", errno);
    if (n == 0) break;
    got += size_t(n);
  }
  data.resize(got);
  const size_t end = data.rfind('\n');
  const size_t keep = end == std::string::npos ? 0 : end + 1;
  if (keep < data.size()) {
    truncated_ = data.size() - keep;
    truncated_head_ = data.substr(keep, 120);
    if (::ftruncate(fd_, off_t(keep)) != 0) batch_output_sys_fail(path_, "cannot truncate a partial last line", errno);
    if (io_.fsync(fd_) != 0) batch_output_sys_fail(path_, "cannot sync after truncating a partial last line", errno);
  }
  size_ = off_t(keep);
  size_t pos = 0;
  while (pos < keep) {
    const size_t nl = data.find('\n', pos);
    if (nl > pos) existing_.push_back(data.substr(pos, nl - pos));
    pos = nl + 1;
  }
  guarded = -1;
}

BatchOutputFile::~BatchOutputFile() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void BatchOutputFile::fail_append(const char* what, int err, bool partial) {
  failure_ = cat("sessions: batch: output '", path_.string(), "': ", what, ": ", std::strerror(err));
  if (partial && regular_) {
    // Truncating needs no free space, so it works on a full disk; a crash before it reaches the
    // disk leaves a partial line, which the next open removes.
    if (::ftruncate(fd_, size_) != 0)
      failure_ += cat("; the partial line could not be removed (", std::strerror(errno), ") and will be on resume");
  } else if (partial) {
    failure_ += "; a partial line may have been written";
  }
  throw Error(failure_);
}

void BatchOutputFile::append(std::string_view line) {
  if (!failure_.empty()) throw Error(failure_);
  EXL_CHECK(line.find('\n') == std::string_view::npos, "sessions: batch: output '", path_.string(),
            "': a result line contains a newline");
  std::string full(line);
  full += '\n';
  size_t done = 0;
  while (done < full.size()) {
    const ssize_t n = io_.write(fd_, full.data() + done, full.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_append("cannot write", errno, done > 0);
    if (n == 0) fail_append("cannot write", EIO, done > 0);
    done += size_t(n);
  }
  if (io_.fsync(fd_) != 0) {
    const int err = errno;
    if (regular_ || (err != EINVAL && err != EROFS)) fail_append("cannot sync", err, true);
  }
  size_ += off_t(full.size());
}

}  // namespace exl
