#include "engine/formats/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace exl {

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, std::vector<Entry> entries)
    : path_(path), tmp_(path.string() + ".partial"), entries_(std::move(entries)) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const auto& e : entries_) {
    uint64_t n = dtype_size(e.dtype);
    for (int64_t d : e.shape) n *= uint64_t(d);
    h[e.name] = {{"dtype", std::string(to_string(e.dtype))}, {"shape", e.shape}, {"data_offsets", {off, off + n}}};
    sizes_.push_back(n);
    off += n;
  }
  std::string header = h.dump();
  header.resize((header.size() + 7) / 8 * 8, ' ');
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  EXL_CHECK(out_.good(), "engine: safetensors_writer: cannot create '", tmp_.string(), "'");
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  out_.write(len, 8);
  out_.write(header.data(), std::streamsize(header.size()));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!finished_) {
    out_.close();
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
  }
}

void SafetensorsWriter::write_next(std::span<const std::byte> data) {
  EXL_CHECK(next_ < entries_.size(), "engine: safetensors_writer: more tensors written than declared");
  EXL_CHECK(data.size() == sizes_[next_], "engine: safetensors_writer: tensor '", entries_[next_].name, "' needs ",
            sizes_[next_], " bytes, got ", data.size());
  out_.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  EXL_CHECK(out_.good(), "engine: safetensors_writer: write error on '", tmp_.string(), "'");
  ++next_;
}

void SafetensorsWriter::finish() {
  EXL_CHECK(next_ == entries_.size(), "engine: safetensors_writer: ", entries_.size() - next_,
            " declared tensors were not written");
  out_.close();
  EXL_CHECK(!out_.fail(), "engine: safetensors_writer: error closing '", tmp_.string(), "'");
  std::filesystem::rename(tmp_, path_);
  finished_ = true;
}

}  // namespace exl
