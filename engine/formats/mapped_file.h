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
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace exl
