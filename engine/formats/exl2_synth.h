// Random-weight EXL2 models with realistic layouts, for benchmarks only: no large real model can
// be downloaded here, and speed depends on shapes and bit layout, not on trained values. Layers
// mix two bit widths like the converter (the higher width on the first, most salient rows, in
// 32-row groups; the lower in 128-row groups), rows are act-order permuted (q/k/v share one
// permutation and gate/up another, as in the converter's output, whose order comes from the
// shared input's statistics), the head is 6-bit with 8-bit salient rows. Weights are scaled so
// activations stay in fp16 range.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace exl {

struct SynthShape {
  std::string name;
  std::string architecture;  // LlamaForCausalLM, Qwen2ForCausalLM
  int64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  int64_t max_position_embeddings = 4096;
  double rope_theta = 10000.0;
  nlohmann::json rope_scaling;  // null or a rope_scaling object
  bool qkv_bias = false;
};

// llama2-7b, llama3-8b, llama3-70b, qwen2-7b, tiny; nullopt for other names.
std::optional<SynthShape> synth_shape(std::string_view name);

// Writes OUT_DIR/{config.json, output.safetensors} plus the tokenizer files found in
// tokenizer_dir (may be empty). bpw in [2.5, 8]; progress(done, total) is called per tensor.
void write_synth_exl2(const SynthShape& shape, double bpw, int head_bits, const std::filesystem::path& tokenizer_dir,
                      const std::filesystem::path& out_dir, uint64_t seed,
                      const std::function<void(size_t, size_t)>& progress = {});

}  // namespace exl
