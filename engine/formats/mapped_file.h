// A read-only memory mapping of a whole file. Owns the mapping; move-only.
#pragma once
#include <cstddef>
#include <filesystem>
#include <span>

namespace exl {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only; throws exl::Error naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  // Drops the pages of the mapping that this process holds (madvise MADV_DONTNEED): the bytes read
  // the same afterwards, faulted in from the file again on access. For once everything read from
  // the file has been copied elsewhere, so that those pages stop counting in the process's memory.
  void release_pages() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace exl
