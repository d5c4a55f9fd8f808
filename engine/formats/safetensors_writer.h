// Writes a safetensors file whose tensors are declared up front and then streamed one by one, so
// multi-gigabyte files never sit in memory. The file is written to "<path>.partial" and renamed
// into place by finish(), so an interrupted write never leaves a complete-looking file.
// Tensors are laid out densely in declaration order (the format allows no gaps); declare larger
// element sizes first, as the reference writer does, so every tensor stays naturally aligned.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace exl {

class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };

  // Declares every tensor; writes the header. Throws exl::Error on I/O failure.
  SafetensorsWriter(const std::filesystem::path& path, std::vector<Entry> entries);
  ~SafetensorsWriter();

  // Writes the next declared tensor's bytes (exactly its size), in declaration order.
  void write_next(std::span<const std::byte> data);
  // Checks every tensor was written, flushes and renames the file into place.
  void finish();

 private:
  std::filesystem::path path_, tmp_;
  std::vector<Entry> entries_;
  std::vector<uint64_t> sizes_;
  size_t next_ = 0;
  std::ofstream out_;
  bool finished_ = false;
};

}  // namespace exl
