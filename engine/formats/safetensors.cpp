#include "engine/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace exl {

namespace {

constexpr uint64_t k_max_header_bytes = 100ull << 20;
constexpr int k_max_rank = 8;

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view label) {
  auto where = [&] { return cat("engine: safetensors: '", label, "': "); };
  EXL_CHECK(file.size() >= 8, where(), "file is ", file.size(), " bytes, too short for the 8-byte header length");
  uint64_t n = read_u64_le(file.data());
  EXL_CHECK(n <= k_max_header_bytes, where(), "header length ", n, " exceeds the limit of ", k_max_header_bytes);
  EXL_CHECK(n <= file.size() - 8, where(), "header length ", n, " runs past the end of the file (",
            file.size(), " bytes): truncated file?");
  EXL_CHECK(n >= 2, where(), "header length ", n, " is too small for a JSON object");

  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, text + n);
  } catch (const nlohmann::json::exception& e) {
    fail(where(), "header is not valid JSON: ", e.what());
  }
  EXL_CHECK(j.is_object(), where(), "header is not a JSON object");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_size = file.size() - h.data_start;

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      EXL_CHECK(v.is_object(), where(), "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        EXL_CHECK(m.value().is_string(), where(), "__metadata__ value '", m.key(), "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto tw = [&] { return cat(where(), "tensor '", key, "': "); };
    EXL_CHECK(v.is_object(), tw(), "entry is not an object");
    EXL_CHECK(v.contains("dtype") && v["dtype"].is_string(), tw(), "missing or non-string 'dtype'");
    EXL_CHECK(v.contains("shape") && v["shape"].is_array(), tw(), "missing or non-array 'shape'");
    EXL_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, tw(),
              "'data_offsets' must be an array [begin, end]");

    TensorInfo t;
    t.name = key;
    auto dt = dtype_from_safetensors(v["dtype"].get<std::string>());
    EXL_CHECK(dt.has_value(), tw(), "unknown dtype '", v["dtype"].get<std::string>(), "'");
    t.dtype = *dt;

    EXL_CHECK(v["shape"].size() <= k_max_rank, tw(), "rank ", v["shape"].size(), " exceeds ", k_max_rank);
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      EXL_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), tw(),
                "shape has a non-integer or negative dimension ", d.dump());
      uint64_t du = d.get<uint64_t>();
      EXL_CHECK(du <= uint64_t(std::numeric_limits<int64_t>::max()), tw(), "dimension ", du, " too large");
      EXL_CHECK(!mul_overflows(numel, du, &numel), tw(), "shape overflows");
      t.shape.push_back(static_cast<int64_t>(du));
    }
    const auto& off = v["data_offsets"];
    EXL_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(), tw(),
              "data_offsets must be non-negative integers");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    EXL_CHECK(b <= e, tw(), "data_offsets [", b, ", ", e, "] are reversed");
    EXL_CHECK(e <= data_size, tw(), "data_offsets [", b, ", ", e, "] run past the data section (", data_size,
              " bytes): truncated file?");
    uint64_t expect = 0;
    EXL_CHECK(!mul_overflows(numel, dtype_size(t.dtype), &expect), tw(), "byte size overflows");
    EXL_CHECK(e - b == expect, tw(), "holds ", e - b, " bytes but shape and dtype ", to_string(t.dtype),
              " need ", expect);
    t.offset = b;
    t.nbytes = e - b;
    h.tensors.push_back(std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  uint64_t end = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    EXL_CHECK(t.offset >= end, where(), "tensor '", t.name, "' [", t.offset, ", ", t.offset + t.nbytes,
              ") overlaps tensor '", prev ? prev->name : "", "' ending at ", end);
    EXL_CHECK(t.offset == end, where(), "gap of ", t.offset - end, " bytes before tensor '", t.name,
              "' at offset ", end, ": the data section must be fully indexed");
    end = t.offset + t.nbytes;
    if (t.nbytes) prev = &t;
  }
  EXL_CHECK(end == data_size, where(), "data section has ", data_size - end,
            " trailing bytes not covered by any tensor");
  return h;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : file_(path), label_(path.filename().string()) {
  header_ = parse_safetensors_header(file_.bytes(), path.string());
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const TensorInfo& t) const {
  return {&t, file_.bytes().subspan(header_.data_start + t.offset, t.nbytes), label_};
}

}  // namespace exl
