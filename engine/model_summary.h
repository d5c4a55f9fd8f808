// What `exlagent info` reports about a model directory: dimensions, each linear layer's storage
// format and bit widths, bits per weight, weight bytes and KV-cache sizes. Building a summary
// loads (and so fully validates) every linear layer.
//
// Bits per weight (bpw) of one linear = 8 · storage bytes / (in_features · out_features), where
// out_features is unpadded and the storage bytes are those of the format's tensors without bias:
//   EXL2:  q_weight + q_scale + q_scale_max + q_groups + q_invperm   (q_perm, if any, is ignored)
//   GPTQ:  qweight + qzeros + scales + g_idx (when present)
//   dense: weight (16 for F16/BF16, 32 for F32)
// This is ExLlamaV2's own accounting (conversion/qparams.py: total_bits counts the packed weights,
// 16 bits per group for q_scale_max, 32 per group for q_groups, 4 per group and column for
// q_scale, 32 per input row for q_invperm). On the exl2-ref models converted with -b 4.0 it gives
// 3.988 (llama-gqa), 3.975 (qwen2-bias) and 3.997 (llama3-rope) for the decoder layers; the
// packed weights alone give 3.77–3.83.
// avg_bpw_layers is the average over every linear of every decoder layer, weighted by in·out.
//
// head_bits is the nominal bit width of the head: for EXL2 the smallest width present, since the
// converter's head options (-hb 2/3/4/5/6/8) mix about 15% of rows at a higher width with the
// nominal one (-hb 6 is [8, 6]); for GPTQ 4; for dense heads the storage width (16 or 32).
// head_bpw is the head's exact bpw by the rule above (6.67–7.0 for the exl2-ref heads).
//
// KV cache, bytes per `tokens` tokens, for every layer, K and V, kv_heads × head_dim values each:
//   fp16: 2 bytes per value.
//   q8:   1 byte per value, plus one fp16 scale per block of 32 values along head_dim.
//   q4:   0.5 byte per value, plus one fp16 scale per block of 32 values along head_dim.
// Blocks do not cross heads; a head_dim that is not a multiple of 32 ends in a shorter block.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/formats/linear_loader.h"
#include "engine/formats/model_dir.h"

namespace exl {

struct LinearSummary {
  std::string name;           // module name, e.g. "model.layers.0.mlp.up_proj" or "lm_head"
  std::string tensor_prefix;  // where its tensors are ("model.embed_tokens" for a tied dense head)
  WeightFormat format = WeightFormat::dense;
  DType dtype = DType::f16;   // dense storage dtype; unused for quantized formats
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t storage_bytes = 0;  // see the header comment; bias excluded
  double bpw = 0;
  std::map<int, int64_t> rows_per_bits;  // input rows per bit width (dense: {16 or 32: K})
  bool has_bias = false;
};

struct KvCacheBytes {
  int64_t fp16 = 0;
  int64_t q8 = 0;
  int64_t q4 = 0;
};

struct ModelSummary {
  std::string path;
  ModelConfig config;
  std::vector<std::vector<LinearSummary>> layers;  // [num_layers][7]
  LinearSummary head;
  double avg_bpw_layers = 0;
  int head_bits = 0;
  double head_bpw = 0;
  std::map<int, int64_t> layer_weights_per_bits;  // decoder layers: weights (rows · out) per bit width
  int64_t weight_bytes = 0;                       // all tensors of all weight files
  int64_t num_tensors = 0;
  KvCacheBytes kv_cache_per_1k;                   // for 1024 tokens
};

// Summarizes `dir` (opened with weights). Throws exl::Error if any linear layer is missing or
// malformed.
ModelSummary summarize_model(const ModelDir& dir);

// KV-cache bytes for `tokens` tokens, by the scheme in the header comment.
KvCacheBytes kv_cache_bytes(const ModelConfig& c, int64_t tokens);

// The summary as one JSON object (the `exlagent info --json` output).
nlohmann::ordered_json to_json(const ModelSummary& s);

}  // namespace exl
