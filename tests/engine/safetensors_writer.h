// Test-only: builds safetensors files (and model directories around them) from in-memory
// tensors, so tests can write well-formed and deliberately malformed weight files.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace exl::test {

struct TensorBlob {
  std::string name;
  std::string dtype;  // safetensors spelling: "F16", "I32", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string to_bytes(std::span<const T> v) {
  std::string s(v.size_bytes(), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), v.size_bytes());
  return s;
}
template <typename T>
std::string to_bytes(const std::vector<T>& v) {
  return to_bytes(std::span<const T>(v));
}

// Collects tensors and serializes them. Tensors are laid out by element size, largest first (as
// the reference writer does), so every tensor is naturally aligned: the header is padded with
// spaces to a multiple of 8, then `extra_header_bytes` more spaces are added (to misalign on purpose).
class SafetensorsWriter {
 public:
  SafetensorsWriter& add(TensorBlob t) {
    remove(t.name);
    tensors_.push_back(std::move(t));
    return *this;
  }
  template <typename T>
  SafetensorsWriter& add(std::string name, std::string dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
    return add(TensorBlob{std::move(name), std::move(dtype), std::move(shape), to_bytes(v)});
  }
  SafetensorsWriter& remove(const std::string& name) {
    std::erase_if(tensors_, [&](const TensorBlob& t) { return t.name == name; });
    return *this;
  }
  TensorBlob* find(const std::string& name) {
    for (auto& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  // Element bytes of tensor `name` reinterpreted as T (for edits); the tensor must exist.
  template <typename T>
  T* data(const std::string& name) {
    return reinterpret_cast<T*>(find(name)->bytes.data());
  }

  std::string serialize(int extra_header_bytes = 0) const {
    std::vector<const TensorBlob*> order;
    for (const auto& t : tensors_) order.push_back(&t);
    std::stable_sort(order.begin(), order.end(),
                     [](const TensorBlob* a, const TensorBlob* b) { return elem_size(a->dtype) > elem_size(b->dtype); });
    nlohmann::json h = nlohmann::json::object();
    h["__metadata__"] = {{"format", "pt"}};
    std::string data;
    for (const TensorBlob* t : order) {
      h[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {data.size(), data.size() + t->bytes.size()}}};
      data += t->bytes;
    }
    std::string header = h.dump();
    header.resize((header.size() + 7) / 8 * 8 + size_t(extra_header_bytes), ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
    return out + header + data;
  }

  void write(const std::filesystem::path& path) const {
    write_file(path, serialize());
  }

 private:
  static int elem_size(const std::string& dtype) {
    if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
    if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
    if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
    return 1;
  }
  std::vector<TensorBlob> tensors_;
};

// A minimal Llama config.json object; tests edit it before writing.
inline nlohmann::json tiny_llama_config(int64_t hidden = 64, int64_t intermediate = 80, int64_t layers = 1) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", hidden},
          {"intermediate_size", intermediate},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", hidden / 2},
          {"vocab_size", 64},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0}};
}

// Writes config.json and `file_name` holding `w` into `dir`.
inline void write_model_dir(const std::filesystem::path& dir, const nlohmann::json& config,
                            const SafetensorsWriter& w, const std::string& file_name = "output.safetensors") {
  write_file(dir / "config.json", config.dump(2));
  w.write(dir / file_name);
}

}  // namespace exl::test
