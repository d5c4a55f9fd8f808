// Loading any linear layer of a model directory, whatever its storage format, and the list of
// linear layers an architecture has. The format is detected per layer from tensor names, as
// ExLlamaV2 does (exl2-engine.md §1.1): `<prefix>.q_weight` → EXL2, `<prefix>.qweight` → GPTQ,
// `<prefix>.weight` → dense, checked in that order. The head "lm_head" falls back to
// "model.embed_tokens" when the directory has no lm_head tensors (tied embeddings; EXL2 writes a
// quantized tied head under lm_head, so that is found first).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/formats/model_dir.h"
#include "engine/formats/tensor_access.h"
#include "kernels/linear_weights.h"

namespace exl {

enum class WeightFormat : uint8_t { exl2, gptq, dense };
std::string to_string(WeightFormat f);

// The tensor prefix that holds the linear `prefix` (itself, or the tied-embedding fallback of
// lm_head), or nullopt when neither has weights.
std::optional<std::string> resolve_linear_prefix(const ModelDir& dir, std::string_view prefix);

// The format of the tensors under an already resolved prefix, or nullopt when none is present.
std::optional<WeightFormat> detect_weight_format(const ModelDir& dir, std::string_view resolved_prefix);

// Loads and validates the linear `prefix` with the dimensions the config expects
// (out_features unpadded). Throws exl::Error when it is missing or malformed.
LinearWeights load_linear(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                          int64_t out_features);

// One linear layer of the architecture: its HF module name and dimensions.
struct LinearSpec {
  std::string name;  // "model.layers.3.self_attn.q_proj"
  int64_t in_features = 0;
  int64_t out_features = 0;
};

// The linears of decoder layer `layer` (q, k, v, o, gate, up, down) for Llama/Mistral/Qwen2.
std::vector<LinearSpec> decoder_layer_linears(const ModelConfig& c, int64_t layer);
// The output head: "lm_head", hidden_size → vocab_size.
LinearSpec head_linear(const ModelConfig& c);

}  // namespace exl
