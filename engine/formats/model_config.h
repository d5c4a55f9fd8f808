// Architecture description read from a HF config.json (Llama, Mistral, Qwen2 families).
// Both the classic keys (rope_theta, rope_scaling) and transformers 5's rope_parameters are read.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace exl {

enum class Arch : uint8_t { llama, mistral, qwen2 };
std::string to_string(Arch a);

enum class RopeType : uint8_t { default_, linear, llama3, yarn };
std::string to_string(RopeType t);

// RoPE parameters; fields not used by `type` keep their defaults.
struct RopeConfig {
  RopeType type = RopeType::default_;
  double theta = 10000.0;
  double factor = 1.0;                        // linear, llama3, yarn
  double low_freq_factor = 1.0;               // llama3
  double high_freq_factor = 4.0;              // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn
  double beta_fast = 32.0;                    // yarn
  double beta_slow = 1.0;                     // yarn
  std::optional<double> mscale;               // yarn
  std::optional<double> mscale_all_dim;       // yarn
  std::optional<double> attention_factor;     // yarn
};

struct ModelConfig {
  Arch arch = Arch::llama;
  std::string architecture;  // architectures[0] as written, e.g. "LlamaForCausalLM"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (always true for Qwen2)
  bool mlp_bias = false;
  std::optional<int64_t> sliding_window;
  RopeConfig rope;
  std::vector<int64_t> bos_token_ids, eos_token_ids;
  std::optional<int64_t> pad_token_id;
  // quantization_config, when present
  std::string quant_method;
  double quant_bits = 0;
  double quant_head_bits = 0;
  std::string checkpoint_format;  // "gptq_v2" or empty
};

// Parses config.json. `label` names the file in errors. Validates that the dimensions are
// positive and consistent (heads divide, head_dim * heads fits). Throws exl::Error.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& label);

}  // namespace exl
