#include "engine/formats/model_config.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace exl {

std::string to_string(Arch a) {
  switch (a) {
    case Arch::llama: return "llama";
    case Arch::mistral: return "mistral";
    case Arch::qwen2: return "qwen2";
  }
  return "?";
}

std::string to_string(RopeType t) {
  switch (t) {
    case RopeType::default_: return "default";
    case RopeType::linear: return "linear";
    case RopeType::llama3: return "llama3";
    case RopeType::yarn: return "yarn";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

int64_t get_int(const json& j, const char* key, const std::string& label, std::optional<int64_t> dflt = {}) {
  if (!j.contains(key) || j[key].is_null()) {
    EXL_CHECK(dflt.has_value(), "engine: config: '", label, "': missing key '", key, "'");
    return *dflt;
  }
  const json& v = j[key];
  const double d = v.is_number_float() ? v.get<double>() : 0.0;
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())
                                           : v.is_number_integer() || (v.is_number_float() && d >= -0x1p63 &&
                                                                       d < 0x1p63 && d == std::trunc(d));
  EXL_CHECK(fits, "engine: config: '", label, "': key '", key, "' must be a 64-bit integer, got ", v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : int64_t(d);
}

double get_num(const json& j, const char* key, const std::string& label, double dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  EXL_CHECK(j[key].is_number(), "engine: config: '", label, "': key '", key, "' must be a number, got ",
            j[key].dump());
  return j[key].get<double>();
}

std::vector<int64_t> get_ids(const json& j, const char* key) {
  std::vector<int64_t> out;
  if (!j.contains(key)) return out;
  const json& v = j[key];
  if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  if (v.is_array())
    for (const auto& x : v)
      if (x.is_number_integer()) out.push_back(x.get<int64_t>());
  return out;
}

RopeConfig parse_rope(const json& cfg, const std::string& label) {
  RopeConfig r;
  r.theta = get_num(cfg, "rope_theta", label, 10000.0);
  const json* rp = nullptr;
  if (cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object()) rp = &cfg["rope_parameters"];
  else if (cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object()) rp = &cfg["rope_scaling"];
  if (!rp) return r;
  const json& p = *rp;
  r.theta = get_num(p, "rope_theta", label, r.theta);
  std::string type = "default";
  if (p.contains("rope_type") && p["rope_type"].is_string()) type = p["rope_type"].get<std::string>();
  else if (p.contains("type") && p["type"].is_string()) type = p["type"].get<std::string>();
  if (type == "default") r.type = RopeType::default_;
  else if (type == "linear") r.type = RopeType::linear;
  else if (type == "llama3") r.type = RopeType::llama3;
  else if (type == "yarn") r.type = RopeType::yarn;
  else fail("engine: config: '", label, "': unsupported rope type '", type, "' (supported: default, linear, llama3, yarn)");
  r.factor = get_num(p, "factor", label, 1.0);
  r.low_freq_factor = get_num(p, "low_freq_factor", label, 1.0);
  r.high_freq_factor = get_num(p, "high_freq_factor", label, 4.0);
  r.original_max_position_embeddings = get_int(p, "original_max_position_embeddings", label, int64_t(0));
  r.beta_fast = get_num(p, "beta_fast", label, 32.0);
  r.beta_slow = get_num(p, "beta_slow", label, 1.0);
  if (p.contains("mscale") && p["mscale"].is_number()) r.mscale = p["mscale"].get<double>();
  if (p.contains("mscale_all_dim") && p["mscale_all_dim"].is_number()) r.mscale_all_dim = p["mscale_all_dim"].get<double>();
  if (p.contains("attention_factor") && p["attention_factor"].is_number())
    r.attention_factor = p["attention_factor"].get<double>();
  if (r.type != RopeType::default_)
    EXL_CHECK(r.factor > 0, "engine: config: '", label, "': rope factor must be positive");
  if (r.type == RopeType::llama3) {
    EXL_CHECK(r.original_max_position_embeddings > 0, "engine: config: '", label,
              "': llama3 rope needs original_max_position_embeddings");
    EXL_CHECK(r.high_freq_factor != r.low_freq_factor, "engine: config: '", label,
              "': llama3 rope needs high_freq_factor != low_freq_factor");
  }
  EXL_CHECK(r.theta > 0, "engine: config: '", label, "': rope_theta must be positive");
  return r;
}

ModelConfig parse_model_config_fields(const json& root, const std::string& label) {
  EXL_CHECK(root.is_object(), "engine: config: '", label, "': not a JSON object");
  const json& j = (root.contains("text_config") && root["text_config"].is_object()) ? root["text_config"] : root;
  ModelConfig c;
  if (root.contains("architectures") && root["architectures"].is_array() && !root["architectures"].empty() &&
      root["architectures"][0].is_string())
    c.architecture = root["architectures"][0].get<std::string>();
  std::string model_type = root.value("model_type", std::string());
  if (c.architecture == "LlamaForCausalLM" || (c.architecture.empty() && model_type == "llama")) c.arch = Arch::llama;
  else if (c.architecture == "MistralForCausalLM" || (c.architecture.empty() && model_type == "mistral")) c.arch = Arch::mistral;
  else if (c.architecture == "Qwen2ForCausalLM" || (c.architecture.empty() && model_type == "qwen2")) c.arch = Arch::qwen2;
  else
    fail("engine: config: '", label, "': unsupported architecture '", c.architecture.empty() ? model_type : c.architecture,
         "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
  if (c.architecture.empty()) c.architecture = model_type;

  c.hidden_size = get_int(j, "hidden_size", label);
  c.intermediate_size = get_int(j, "intermediate_size", label);
  c.num_layers = get_int(j, "num_hidden_layers", label);
  c.num_heads = get_int(j, "num_attention_heads", label);
  c.num_kv_heads = get_int(j, "num_key_value_heads", label, c.num_heads);
  c.vocab_size = get_int(j, "vocab_size", label);
  EXL_CHECK(c.num_heads > 0, "engine: config: '", label, "': num_attention_heads must be positive");
  c.head_dim = get_int(j, "head_dim", label, c.hidden_size / c.num_heads);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", label, int64_t(4096));
  c.rms_norm_eps = get_num(j, "rms_norm_eps", label, 1e-6);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  c.attention_bias = c.arch == Arch::qwen2 ? true : j.value("attention_bias", false);
  c.mlp_bias = j.value("mlp_bias", false);
  if (j.contains("sliding_window") && j["sliding_window"].is_number_integer() &&
      !(c.arch == Arch::qwen2 && !j.value("use_sliding_window", false)))
    c.sliding_window = j["sliding_window"].get<int64_t>();
  c.rope = parse_rope(j, label);
  c.bos_token_ids = get_ids(root, "bos_token_id");
  c.eos_token_ids = get_ids(root, "eos_token_id");
  if (root.contains("pad_token_id") && root["pad_token_id"].is_number_integer())
    c.pad_token_id = root["pad_token_id"].get<int64_t>();

  auto pos = [&](int64_t v, const char* what) {
    EXL_CHECK(v > 0, "engine: config: '", label, "': ", what, " must be positive, got ", v);
  };
  pos(c.hidden_size, "hidden_size");
  pos(c.intermediate_size, "intermediate_size");
  pos(c.num_layers, "num_hidden_layers");
  pos(c.num_kv_heads, "num_key_value_heads");
  pos(c.head_dim, "head_dim");
  pos(c.vocab_size, "vocab_size");
  EXL_CHECK(c.num_heads % c.num_kv_heads == 0, "engine: config: '", label, "': num_attention_heads ", c.num_heads,
            " is not a multiple of num_key_value_heads ", c.num_kv_heads);
  EXL_CHECK(c.head_dim % 2 == 0, "engine: config: '", label, "': head_dim ", c.head_dim, " must be even for RoPE");
  EXL_CHECK(c.rms_norm_eps > 0, "engine: config: '", label, "': rms_norm_eps must be positive");

  if (root.contains("quantization_config") && root["quantization_config"].is_object()) {
    const json& q = root["quantization_config"];
    c.quant_method = q.value("quant_method", std::string());
    c.quant_bits = get_num(q, "bits", label, 0.0);
    c.quant_head_bits = get_num(q, "head_bits", label, 0.0);
    c.checkpoint_format = q.value("checkpoint_format", std::string());
  }
  return c;
}

}  // namespace

ModelConfig parse_model_config(const json& root, const std::string& label) {
  try {
    return parse_model_config_fields(root, label);
  } catch (const json::exception& e) {
    fail("engine: config: '", label, "': a field has the wrong type: ", e.what());
  }
}

}  // namespace exl
