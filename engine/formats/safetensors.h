// Safetensors files: header parsing with full validation, and memory-mapped tensor access.
// A parsed header guarantees: every tensor's byte range lies inside the data section, ranges do
// not overlap, byte length == product(shape) * dtype size, and the dtype is known.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/formats/mapped_file.h"
#include "kernels/dtype.h"

namespace exl {

// One tensor's metadata; `offset` is relative to the start of the data section.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;

  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;           // sorted by offset
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_start = 0;                   // byte offset of the data section in the file
};

// Parses and validates the header of a whole file's bytes. `label` (usually the file name) starts
// every error message. Throws exl::Error; never reads outside `file`.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view label);

// A view of one tensor's bytes inside a mapped file.
struct TensorView {
  const TensorInfo* info = nullptr;
  std::span<const std::byte> data;
  std::string_view file;  // file name, for messages
};

// An opened, validated, memory-mapped safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);

  const SafetensorsHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return file_.path(); }
  const TensorInfo* find(std::string_view name) const;
  TensorView view(const TensorInfo& t) const;
  // MappedFile::release_pages of the file.
  void release_pages() const { file_.release_pages(); }

 private:
  MappedFile file_;
  std::string label_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace exl
