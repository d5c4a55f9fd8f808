#include "engine/formats/model_dir.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "kernels/error.h"

namespace exl {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXL_CHECK(in.good(), "engine: cannot open '", path.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("engine: '", path.string(), "' is not valid JSON: ", e.what());
  }
}

std::string shape_to_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

ModelDir::ModelDir(const fs::path& dir, bool weights) : dir_(dir) {
  EXL_CHECK(fs::is_directory(dir), "engine: model_dir: '", dir.string(), "' is not a directory");
  auto opt_json = [&](const char* name) {
    fs::path p = dir / name;
    return fs::exists(p) ? read_json_file(p) : nlohmann::json::object();
  };
  generation_config_ = opt_json("generation_config.json");
  tokenizer_config_ = opt_json("tokenizer_config.json");
  fs::path cfg = dir / "config.json";
  if (!weights && !fs::exists(cfg)) return;
  config_json_ = read_json_file(cfg);
  try {
    config_ = parse_model_config(config_json_, cfg.string());
  } catch (const nlohmann::json::exception& e) {
    fail("engine: config: '", cfg.string(), "': ", e.what());
  }
  if (!weights) return;

  std::vector<fs::path> shards;
  fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    auto j = read_json_file(index);
    EXL_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "engine: model_dir: '", index.string(),
              "': missing 'weight_map' object");
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      EXL_CHECK(it.value().is_string(), "engine: model_dir: '", index.string(), "': weight_map entry '", it.key(),
                "' is not a file name");
      std::string f = it.value().get<std::string>();
      EXL_CHECK(f.find('/') == std::string::npos && f.find("..") == std::string::npos, "engine: model_dir: '",
                index.string(), "': shard name '", f, "' must be a plain file name");
      names.insert(f);
    }
    for (const auto& n : names) shards.push_back(dir / n);
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") shards.push_back(e.path());
    std::sort(shards.begin(), shards.end());
  }
  EXL_CHECK(!shards.empty(), "engine: model_dir: '", dir.string(), "': no .safetensors files");
  for (const auto& s : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>(s));
    size_t fi = files_.size() - 1;
    for (const auto& t : files_.back()->header().tensors) {
      auto [it, inserted] = tensors_.emplace(t.name, std::make_pair(fi, &t));
      EXL_CHECK(inserted, "engine: model_dir: tensor '", t.name, "' appears in both '",
                files_[it->second.first]->path().filename().string(), "' and '", s.filename().string(), "'");
    }
  }
}

bool ModelDir::has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

std::optional<TensorView> ModelDir::find(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return files_[it->second.first]->view(*it->second.second);
}

TensorView ModelDir::require(std::string_view name, std::optional<DType> dtype, std::span<const int64_t> shape) const {
  auto v = find(name);
  EXL_CHECK(v.has_value(), "engine: model_dir: '", dir_.string(), "': missing tensor '", name, "'");
  if (dtype)
    EXL_CHECK(v->info->dtype == *dtype, "engine: model_dir: '", v->file, "': tensor '", name, "' has dtype ",
              to_string(v->info->dtype), ", expected ", to_string(*dtype));
  if (!shape.empty())
    EXL_CHECK(std::equal(shape.begin(), shape.end(), v->info->shape.begin(), v->info->shape.end()),
              "engine: model_dir: '", v->file, "': tensor '", name, "' has shape ", shape_to_string(v->info->shape),
              ", expected ", shape_to_string(shape));
  return *v;
}

std::vector<std::string> ModelDir::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

}  // namespace exl
