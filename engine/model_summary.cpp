#include "engine/model_summary.h"

#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace exl {

namespace {

using Json = nlohmann::ordered_json;

int64_t tensor_bytes(const ModelDir& dir, const std::string& prefix, std::initializer_list<const char*> suffixes) {
  int64_t total = 0;
  for (const char* s : suffixes)
    if (auto t = dir.find(cat(prefix, ".", s))) total += int64_t(t->info->nbytes);
  return total;
}

int dense_bits(DType t) { return int(dtype_size(t) * 8); }

LinearSummary summarize_linear(const ModelDir& dir, const LinearSpec& spec) {
  LinearSummary s;
  s.name = spec.name;
  s.in_features = spec.in_features;
  s.out_features = spec.out_features;
  LinearWeights w = load_linear(dir, spec.name, spec.in_features, spec.out_features);
  s.tensor_prefix = *resolve_linear_prefix(dir, spec.name);
  s.format = *detect_weight_format(dir, s.tensor_prefix);
  if (const auto* m = std::get_if<Exl2Matrix>(&w)) {
    for (const auto& g : m->groups) s.rows_per_bits[g.bits] += g.rows;
    s.storage_bytes = tensor_bytes(dir, s.tensor_prefix, {"q_weight", "q_scale", "q_scale_max", "q_groups", "q_invperm"});
    s.has_bias = !m->bias.empty();
  } else if (const auto* m = std::get_if<GptqMatrix>(&w)) {
    s.rows_per_bits[4] = m->in_features;
    s.storage_bytes = tensor_bytes(dir, s.tensor_prefix, {"qweight", "qzeros", "scales", "g_idx"});
    s.has_bias = !m->bias.empty();
  } else {
    const auto& d = std::get<DenseMatrix>(w);
    s.dtype = d.dtype;
    s.rows_per_bits[dense_bits(d.dtype)] = d.in_features;
    s.storage_bytes = tensor_bytes(dir, s.tensor_prefix, {"weight"});
    s.has_bias = !d.bias.empty();
  }
  s.bpw = 8.0 * double(s.storage_bytes) / (double(s.in_features) * double(s.out_features));
  return s;
}

Json linear_json(const LinearSummary& s) {
  Json j = {{"name", s.name},
            {"format", to_string(s.format)},
            {"in_features", s.in_features},
            {"out_features", s.out_features},
            {"bpw", s.bpw},
            {"storage_bytes", s.storage_bytes},
            {"bias", s.has_bias}};
  if (s.tensor_prefix != s.name) j["tensor_prefix"] = s.tensor_prefix;
  if (s.format == WeightFormat::dense) j["dtype"] = std::string(to_string(s.dtype));
  Json bits = Json::array(), rows = Json::object();
  for (auto it = s.rows_per_bits.rbegin(); it != s.rows_per_bits.rend(); ++it) {
    bits.push_back(it->first);
    rows[std::to_string(it->first)] = it->second;
  }
  j["bits"] = bits;
  j["rows_per_bits"] = rows;
  return j;
}

Json rope_json(const RopeConfig& r) {
  Json j = {{"type", to_string(r.type)}, {"theta", r.theta}};
  if (r.type == RopeType::default_) return j;
  j["factor"] = r.factor;
  if (r.type == RopeType::llama3) {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
  }
  if (r.type == RopeType::llama3 || r.type == RopeType::yarn)
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.type == RopeType::yarn) {
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    if (r.mscale) j["mscale"] = *r.mscale;
    if (r.mscale_all_dim) j["mscale_all_dim"] = *r.mscale_all_dim;
    if (r.attention_factor) j["attention_factor"] = *r.attention_factor;
  }
  return j;
}

}  // namespace

KvCacheBytes kv_cache_bytes(const ModelConfig& c, int64_t tokens) {
  const int64_t vectors = tokens * c.num_layers * 2 * c.num_kv_heads;  // one head_dim vector each
  const int64_t scale_bytes = vectors * ((c.head_dim + 31) / 32) * 2;
  return {vectors * c.head_dim * 2, vectors * c.head_dim + scale_bytes, vectors * ((c.head_dim + 1) / 2) + scale_bytes};
}

ModelSummary summarize_model(const ModelDir& dir) {
  ModelSummary s;
  s.path = dir.path().string();
  s.config = dir.config();
  double bits = 0, weights = 0;
  for (int64_t l = 0; l < s.config.num_layers; ++l) {
    auto& layer = s.layers.emplace_back();
    for (const auto& spec : decoder_layer_linears(s.config, l)) {
      LinearSummary ls = summarize_linear(dir, spec);
      bits += 8.0 * double(ls.storage_bytes);
      weights += double(ls.in_features) * double(ls.out_features);
      for (const auto& [b, rows] : ls.rows_per_bits) s.layer_weights_per_bits[b] += rows * ls.out_features;
      layer.push_back(std::move(ls));
    }
  }
  s.avg_bpw_layers = weights > 0 ? bits / weights : 0;
  s.head = summarize_linear(dir, head_linear(s.config));
  s.head_bits = s.head.format == WeightFormat::exl2 ? s.head.rows_per_bits.begin()->first
                : s.head.format == WeightFormat::gptq ? 4
                                                      : dense_bits(s.head.dtype);
  s.head_bpw = s.head.bpw;
  for (const auto& f : dir.files())
    for (const auto& t : f->header().tensors) {
      s.weight_bytes += int64_t(t.nbytes);
      ++s.num_tensors;
    }
  s.kv_cache_per_1k = kv_cache_bytes(s.config, 1024);
  return s;
}

Json to_json(const ModelSummary& s) {
  const ModelConfig& c = s.config;
  Json j = {{"path", s.path},
            {"architecture", c.architecture},
            {"family", to_string(c.arch)},
            {"num_layers", c.num_layers},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_heads", c.num_heads},
            {"num_kv_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"attention_bias", c.attention_bias},
            {"rope", rope_json(c.rope)},
            {"avg_bpw_layers", s.avg_bpw_layers},
            {"head_bits", s.head_bits},
            {"head_bpw", s.head_bpw},
            {"weight_bytes", s.weight_bytes},
            {"num_tensors", s.num_tensors},
            {"head", linear_json(s.head)}};
  if (c.sliding_window) j["sliding_window"] = *c.sliding_window;
  if (!c.quant_method.empty())
    j["quantization_config"] = {{"quant_method", c.quant_method}, {"bits", c.quant_bits},
                                {"head_bits", c.quant_head_bits}};
  Json per_bits = Json::object();
  for (auto it = s.layer_weights_per_bits.rbegin(); it != s.layer_weights_per_bits.rend(); ++it)
    per_bits[std::to_string(it->first)] = it->second;
  j["layer_weights_per_bits"] = per_bits;
  Json layers = Json::array();
  for (size_t l = 0; l < s.layers.size(); ++l) {
    Json lin = Json::array();
    for (const auto& ls : s.layers[l]) lin.push_back(linear_json(ls));
    layers.push_back({{"index", l}, {"linears", lin}});
  }
  j["layers"] = layers;
  j["kv_cache_bytes_per_1k"] = {{"fp16", s.kv_cache_per_1k.fp16}, {"q8", s.kv_cache_per_1k.q8},
                                {"q4", s.kv_cache_per_1k.q4}};
  return j;
}

}  // namespace exl
