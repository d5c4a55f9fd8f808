// The output file of a batch job: JSONL, one result per line, durable line by line so that a job
// killed at any moment can be resumed.
//
// Invariants: every line in the file is complete. append() writes the whole line (with its
// newline) with one write() call — looping only if the kernel accepts part of it — and fsyncs
// before returning, so a crash loses at most the line being written, and only as a trailing
// partial line; opening the file again truncates such a partial line away.
// Not thread-safe: one writer per file (a second process appending concurrently is not detected).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace exl {

class BatchOutputFile {
 public:
  // Creates the file if needed, truncates a trailing partial line, and reads the complete lines.
  // Throws exl::Error ("sessions: batch: output 'PATH': ...") when it cannot be opened or repaired.
  explicit BatchOutputFile(const std::filesystem::path& path);
  ~BatchOutputFile();
  BatchOutputFile(const BatchOutputFile&) = delete;
  BatchOutputFile& operator=(const BatchOutputFile&) = delete;

  // The complete lines found on opening (without newlines), in file order.
  const std::vector<std::string>& existing_lines() const { return existing_; }
  // Bytes of a partial last line removed on opening (0 when the file ended cleanly).
  size_t truncated_bytes() const { return truncated_; }
  // Appends `line` (which must not contain a newline) plus "\n" durably. Throws exl::Error.
  void append(std::string_view line);

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<std::string> existing_;
  size_t truncated_ = 0;
};

}  // namespace exl
