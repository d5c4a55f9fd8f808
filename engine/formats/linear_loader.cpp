#include "engine/formats/linear_loader.h"

#include "engine/formats/dense_loader.h"
#include "engine/formats/exl2_loader.h"
#include "engine/formats/gptq_loader.h"
#include "kernels/error.h"

namespace exl {

namespace {

constexpr std::string_view k_head = "lm_head";
constexpr std::string_view k_tied_head = "model.embed_tokens";

}  // namespace

std::string to_string(WeightFormat f) {
  switch (f) {
    case WeightFormat::exl2: return "exl2";
    case WeightFormat::gptq: return "gptq";
    case WeightFormat::dense: return "dense";
  }
  return "?";
}

std::optional<WeightFormat> detect_weight_format(const ModelDir& dir, std::string_view prefix) {
  if (dir.has(cat(prefix, ".q_weight"))) return WeightFormat::exl2;
  if (dir.has(cat(prefix, ".qweight"))) return WeightFormat::gptq;
  if (dir.has(cat(prefix, ".weight"))) return WeightFormat::dense;
  return std::nullopt;
}

std::optional<std::string> resolve_linear_prefix(const ModelDir& dir, std::string_view prefix) {
  if (detect_weight_format(dir, prefix)) return std::string(prefix);
  if (prefix == k_head && detect_weight_format(dir, k_tied_head)) return std::string(k_tied_head);
  return std::nullopt;
}

LinearWeights load_linear(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                          int64_t out_features) {
  auto resolved = resolve_linear_prefix(dir, prefix);
  EXL_CHECK(resolved.has_value(), "engine: linear: '", dir.path().string(), "': no weights for layer '", prefix,
            "' (looked for ", prefix, ".q_weight, .qweight and .weight",
            prefix == k_head ? cat(", and the tied ", k_tied_head, ".weight") : std::string(), ")");
  switch (*detect_weight_format(dir, *resolved)) {
    case WeightFormat::exl2: return load_exl2_matrix(dir, *resolved, in_features, out_features);
    case WeightFormat::gptq: return load_gptq_matrix(dir, *resolved, in_features, out_features);
    case WeightFormat::dense: return load_dense_matrix(dir, *resolved, in_features, out_features);
  }
  fail("engine: linear: unreachable format");
}

std::vector<LinearSpec> decoder_layer_linears(const ModelConfig& c, int64_t layer) {
  const std::string p = cat("model.layers.", layer, ".");
  const int64_t q_out = c.num_heads * c.head_dim;
  const int64_t kv_out = c.num_kv_heads * c.head_dim;
  return {
      {p + "self_attn.q_proj", c.hidden_size, q_out},
      {p + "self_attn.k_proj", c.hidden_size, kv_out},
      {p + "self_attn.v_proj", c.hidden_size, kv_out},
      {p + "self_attn.o_proj", q_out, c.hidden_size},
      {p + "mlp.gate_proj", c.hidden_size, c.intermediate_size},
      {p + "mlp.up_proj", c.hidden_size, c.intermediate_size},
      {p + "mlp.down_proj", c.intermediate_size, c.hidden_size},
  };
}

LinearSpec head_linear(const ModelConfig& c) { return {std::string(k_head), c.hidden_size, c.vocab_size}; }

}  // namespace exl
