// The output file of a batch job: JSONL, one result per line, durable line by line so that a job
// killed at any moment can be resumed, and held by one job at a time.
//
// Invariants: every line in the file is complete. append() writes the whole line (with its
// newline) — looping only if the kernel accepts part of it — and fsyncs before returning, so a
// crash loses at most the line being written, and only as a trailing partial line; opening the
// file again truncates such a partial line away. A write or sync that fails (ENOSPC, EIO, ...)
// truncates the file back to its last complete line, throws, and leaves the object failed: every
// later append() throws the same error, so nothing is buffered once the disk refuses data.
// Locking: the constructor takes an exclusive flock(2) on the file before it reads or repairs
// it, held until destruction; a second BatchOutputFile on the same file — in this process or
// another — throws BatchOutputBusy. The lock is advisory and follows the inode: it does not stop
// other programs, nor a job started on a file that replaced the locked one.
// A path that is not a regular file (a pipe, /dev/stdout, /dev/full) is written only: nothing is
// read from it, repaired or resumed, and a sync it does not support (EINVAL) is not an error.
// Not thread-safe: one thread per object.
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/error.h"

namespace exl {

// Another job holds the output's lock. what() names the output.
struct BatchOutputBusy : Error {
  using Error::Error;
};

// The calls BatchOutputFile makes on its descriptor after opening, with the contract of
// write(2) and fsync(2) (-1 and errno on failure); tests replace them to inject short writes,
// ENOSPC and EIO.
struct BatchOutputIo {
  std::function<ssize_t(int fd, const void* data, size_t size)> write;
  std::function<int(int fd)> fsync;
};
// ::write and ::fsync.
BatchOutputIo system_batch_output_io();

class BatchOutputFile {
 public:
  // Creates the file if needed (0644), locks it, truncates a trailing partial line, and reads the
  // complete lines. Throws BatchOutputBusy when another job holds the lock, and exl::Error
  // ("sessions: batch: output 'PATH': ...: <strerror>") when it cannot be opened or repaired.
  explicit BatchOutputFile(const std::filesystem::path& path, BatchOutputIo io = system_batch_output_io());
  ~BatchOutputFile();
  BatchOutputFile(const BatchOutputFile&) = delete;
  BatchOutputFile& operator=(const BatchOutputFile&) = delete;

  // The complete lines found on opening (without newlines), in file order.
  const std::vector<std::string>& existing_lines() const { return existing_; }
  // Bytes of a partial last line removed on opening (0 when the file ended cleanly) ...
  size_t truncated_bytes() const { return truncated_; }
  // ... and its first bytes (at most 120), to say what was dropped.
  const std::string& truncated_head() const { return truncated_head_; }
  // Appends `line` (which must not contain a newline) plus "\n" durably. Throws exl::Error naming
  // the output and the system error; see the invariants for what the file holds afterwards.
  void append(std::string_view line);
  // The error that failed this object, empty while appends succeed.
  const std::string& failure() const { return failure_; }

 private:
  [[noreturn]] void fail_append(const char* what, int err, bool partial);

  std::filesystem::path path_;
  BatchOutputIo io_;
  int fd_ = -1;
  bool regular_ = true;
  off_t size_ = 0;  // bytes of complete lines (regular files)
  std::vector<std::string> existing_;
  size_t truncated_ = 0;
  std::string truncated_head_;
  std::string failure_;
};

}  // namespace exl
