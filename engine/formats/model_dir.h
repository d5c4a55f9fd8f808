// A model directory as published: config.json (+ generation_config.json, tokenizer_config.json)
// and safetensors weights (one file, shards with model.safetensors.index.json, or EXL2's
// output*.safetensors without an index). Owns the mapped files; tensor views stay valid while
// the ModelDir lives. Read-only after construction; safe to share between threads.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/formats/model_config.h"
#include "engine/formats/safetensors.h"

namespace exl {

// Reads and parses a JSON file; throws exl::Error naming the file on I/O or syntax errors.
nlohmann::json read_json_file(const std::filesystem::path& path);

class ModelDir {
 public:
  // Opens `dir`. With `weights == false` only the JSON files are read (tokenizer-only use).
  explicit ModelDir(const std::filesystem::path& dir, bool weights = true);

  const std::filesystem::path& path() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const nlohmann::json& config_json() const { return config_json_; }
  const nlohmann::json& generation_config() const { return generation_config_; }  // {} if absent
  const nlohmann::json& tokenizer_config() const { return tokenizer_config_; }    // {} if absent

  bool has(std::string_view name) const;
  // The tensor, or nullopt.
  std::optional<TensorView> find(std::string_view name) const;
  // The tensor, checked against dtype and shape (empty shape = any); throws naming the tensor.
  TensorView require(std::string_view name, std::optional<DType> dtype = {},
                     std::span<const int64_t> shape = {}) const;
  std::vector<std::string> tensor_names() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::filesystem::path dir_;
  nlohmann::json config_json_, generation_config_, tokenizer_config_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>, std::less<>> tensors_;
};

std::string shape_to_string(std::span<const int64_t> shape);

}  // namespace exl
