#include "engine/quantize/calib_model.h"

#include <cmath>

#include "engine/formats/tensor_access.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/error.h"

namespace exl {

struct CalibModel::Layer {
  Buffer attn_norm, mlp_norm;
  std::unique_ptr<PreparedLinear> lin[kAttnLinears + kMlpLinears];
};

namespace calib_model_impl {

constexpr int kCalibPageSize = 16;

// Backend memory holding a copy of host floats.
Buffer calib_upload(Backend& be, std::span<const float> v) {
  Buffer b = be.alloc(std::max<size_t>(v.size(), 1) * sizeof(float));
  if (!v.empty()) be.upload(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

std::vector<float> calib_download(Backend& be, const Buffer& b, size_t n) {
  std::vector<float> out(n);
  be.download(out.data(), b.data(), n * sizeof(float));
  return out;
}

// Page tables, positions and cache slots of a CalibPositions batch.
struct CalibIndex {
  std::vector<std::vector<int32_t>> tables;
  std::vector<SeqAttn> seqs;
  std::vector<int32_t> positions, slots;
};

CalibIndex calib_index(const CalibPositions& p) {
  const int64_t ppr = (p.max_len + kCalibPageSize - 1) / kCalibPageSize;
  EXL_CHECK(p.pos_start + p.n_tokens <= p.max_len, "engine: quantize: calibration positions up to ",
            p.pos_start + p.n_tokens, " beyond the pool's ", p.max_len);
  CalibIndex ix;
  ix.tables.resize(size_t(p.rows));
  for (int64_t r = 0; r < p.rows; ++r) {
    auto& t = ix.tables[size_t(r)];
    for (int64_t i = 0; i < ppr; ++i) t.push_back(int32_t(r * ppr + i));
  }
  for (int64_t r = 0; r < p.rows; ++r) {
    ix.seqs.push_back({r * p.n_tokens, p.n_tokens, p.pos_start, ix.tables[size_t(r)]});
    for (int64_t i = 0; i < p.n_tokens; ++i) {
      const int64_t pos = p.pos_start + i;
      ix.positions.push_back(int32_t(pos));
      ix.slots.push_back(ix.tables[size_t(r)][size_t(pos / kCalibPageSize)] * kCalibPageSize +
                         int32_t(pos % kCalibPageSize));
    }
  }
  return ix;
}

}  // namespace calib_model_impl

using calib_model_impl::calib_download;
using calib_model_impl::calib_upload;

CalibModel::CalibModel(const ModelDir& dir, Backend& backend, RopeTable rope)
    : be_(backend), cfg_(dir.config()), rope_(std::move(rope)) {
  const int64_t H = cfg_.hidden_size;
  auto emb = dir.require("model.embed_tokens.weight");
  EXL_CHECK(emb.info->shape.size() == 2 && emb.info->shape[0] == cfg_.vocab_size && emb.info->shape[1] == H,
            "engine: quantize: tensor 'model.embed_tokens.weight' has shape ", shape_to_string(emb.info->shape));
  embed_ = be_.prepare_embedding({cfg_.vocab_size, H, emb.info->dtype, emb.data.data()});
  const int64_t hshape[1] = {H};
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    Layer L;
    L.attn_norm = calib_upload(be_, load_f32(dir, p + "input_layernorm.weight", hshape));
    L.mlp_norm = calib_upload(be_, load_f32(dir, p + "post_attention_layernorm.weight", hshape));
    const auto specs = decoder_layer_linears(cfg_, l);
    for (size_t i = 0; i < specs.size(); ++i)
      L.lin[i] = be_.prepare_linear(load_linear(dir, specs[i].name, specs[i].in_features, specs[i].out_features));
    layers_.push_back(std::move(L));
  }
  final_norm_ = calib_upload(be_, load_f32(dir, "model.norm.weight", hshape));
  const LinearSpec head = head_linear(cfg_);
  head_ = be_.prepare_linear(load_linear(dir, head.name, head.in_features, head.out_features));
}

CalibModel::~CalibModel() = default;

const PreparedLinear& CalibModel::source(int64_t layer, int which) const {
  return *layers_.at(size_t(layer)).lin[which];
}

Buffer CalibModel::embed(std::span<const int32_t> ids) const {
  for (int32_t id : ids)
    EXL_CHECK(id >= 0 && id < cfg_.vocab_size, "engine: quantize: calibration token id ", id, " out of range [0, ",
              cfg_.vocab_size, ")");
  Buffer x = be_.alloc(std::max<size_t>(ids.size(), 1) * size_t(cfg_.hidden_size) * 4);
  be_.embedding(*embed_, ids, x.f32());
  be_.synchronize();
  return x;
}

Buffer CalibModel::to_backend(std::span<const float> host) const { return calib_upload(be_, host); }

std::vector<float> CalibModel::to_host(const Buffer& b, size_t n) const {
  EXL_CHECK(n * sizeof(float) <= b.bytes(), "engine: quantize: ", n, " floats asked of a buffer of ", b.bytes(),
            " bytes");
  return calib_download(be_, b, n);
}

std::unique_ptr<KvPool> CalibModel::kv_pool(int64_t rows, int64_t max_len, int n_layers) const {
  KvLayout l;
  l.n_layers = n_layers;
  l.n_kv_heads = int(cfg_.num_kv_heads);
  l.head_dim = int(cfg_.head_dim);
  l.page_size = calib_model_impl::kCalibPageSize;
  l.format = KvFormat::f32;
  const int64_t ppr = (max_len + l.page_size - 1) / l.page_size;
  return be_.alloc_kv_pool(l, int(rows * ppr));
}

Buffer CalibModel::attention_block(int64_t layer, const Buffer& x, const CalibPositions& p, KvPool& pool, int kv_layer,
                                   std::span<const PreparedLinear* const> qkvo, Buffer* xn_out, Buffer* att_out) const {
  const Layer& L = layers_.at(size_t(layer));
  const int64_t T = p.tokens(), H = cfg_.hidden_size, D = cfg_.head_dim;
  const int NH = int(cfg_.num_heads), NKV = int(cfg_.num_kv_heads);
  EXL_CHECK(x.bytes() >= size_t(T * H) * 4, "engine: quantize: attention block input of ", x.bytes(), " bytes for ",
            T, " tokens");
  const PreparedLinear* w[kAttnLinears];
  for (int i = 0; i < kAttnLinears; ++i) w[i] = size_t(i) < qkvo.size() && qkvo[size_t(i)] ? qkvo[size_t(i)] : L.lin[i].get();
  const calib_model_impl::CalibIndex ix = calib_model_impl::calib_index(p);
  Buffer xn = be_.alloc(size_t(T * H) * 4);
  Buffer q = be_.alloc(size_t(T * NH * D) * 4), k = be_.alloc(size_t(T * NKV * D) * 4),
         v = be_.alloc(size_t(T * NKV * D) * 4), att = be_.alloc(size_t(T * NH * D) * 4),
         out = be_.alloc(size_t(T * H) * 4);
  const float eps = float(cfg_.rms_norm_eps);
  be_.rms_norm(x.f32(), L.attn_norm.f32(), xn.f32(), T, H, eps);
  float* outs[3] = {q.f32(), k.f32(), v.f32()};
  be_.linears_exact(std::span<const PreparedLinear* const>(w, 3), xn.f32(), outs, T);
  be_.rope_qk_kv_write(q.f32(), k.f32(), v.f32(), T, NH, NKV, int(D), ix.positions, rope_, pool, kv_layer, ix.slots);
  be_.attention(pool, kv_layer, q.f32(), att.f32(), ix.seqs, NH, float(1.0 / std::sqrt(double(D))),
                cfg_.sliding_window ? int(*cfg_.sliding_window) : 0);
  be_.linear_exact(*w[3], att.f32(), out.f32(), T);
  be_.add(out.f32(), x.f32(), T * H);
  be_.synchronize();
  if (xn_out) *xn_out = std::move(xn);
  if (att_out) *att_out = std::move(att);
  return out;
}

Buffer CalibModel::mlp_block(int64_t layer, const Buffer& x, const CalibPositions& p,
                             std::span<const PreparedLinear* const> gud, Buffer* xn_out, Buffer* act_out) const {
  const Layer& L = layers_.at(size_t(layer));
  const int64_t T = p.tokens(), H = cfg_.hidden_size, I = cfg_.intermediate_size;
  EXL_CHECK(x.bytes() >= size_t(T * H) * 4, "engine: quantize: MLP block input of ", x.bytes(), " bytes for ", T,
            " tokens");
  const PreparedLinear* w[kMlpLinears];
  for (int i = 0; i < kMlpLinears; ++i)
    w[i] = size_t(i) < gud.size() && gud[size_t(i)] ? gud[size_t(i)] : L.lin[kAttnLinears + i].get();
  Buffer xn = be_.alloc(size_t(T * H) * 4), g = be_.alloc(size_t(T * I) * 4), u = be_.alloc(size_t(T * I) * 4),
         out = be_.alloc(size_t(T * H) * 4);
  be_.rms_norm(x.f32(), L.mlp_norm.f32(), xn.f32(), T, H, float(cfg_.rms_norm_eps));
  float* outs[2] = {g.f32(), u.f32()};
  be_.linears_exact(std::span<const PreparedLinear* const>(w, 2), xn.f32(), outs, T);
  be_.swiglu(g.f32(), u.f32(), g.f32(), T * I);
  u.reset();
  be_.linear_exact(*w[2], g.f32(), out.f32(), T);
  be_.add(out.f32(), x.f32(), T * H);
  be_.synchronize();
  if (xn_out) *xn_out = std::move(xn);
  if (act_out) *act_out = std::move(g);
  return out;
}

Buffer CalibModel::final_norm(const Buffer& x, int64_t tokens) const {
  const int64_t H = cfg_.hidden_size;
  EXL_CHECK(x.bytes() >= size_t(tokens * H) * 4, "engine: quantize: final norm input of ", x.bytes(), " bytes for ",
            tokens, " tokens");
  Buffer y = be_.alloc(std::max<size_t>(size_t(tokens * H), 1) * 4);
  be_.rms_norm(x.f32(), final_norm_.f32(), y.f32(), tokens, H, float(cfg_.rms_norm_eps));
  be_.synchronize();
  return y;
}

std::vector<float> CalibModel::logits(std::span<const float> x) const {
  const int64_t T = int64_t(x.size()) / cfg_.hidden_size;
  const Buffer xn = final_norm(to_backend(x), T);
  Buffer out = be_.alloc(std::max<size_t>(size_t(T * cfg_.vocab_size), 1) * 4);
  be_.linear_exact(*head_, xn.f32(), out.f32(), T);
  return calib_download(be_, out, size_t(T * cfg_.vocab_size));
}

std::vector<std::vector<int32_t>> CalibModel::generate(
    std::span<const std::vector<int32_t>> prompts, int64_t length,
    const std::function<int32_t(int64_t, std::span<const float>)>& next, ThreadPool* tp) const {
  const int64_t rows = int64_t(prompts.size());
  EXL_CHECK(rows > 0 && !prompts[0].empty(), "engine: quantize: generate: no prompts");
  std::vector<std::vector<int32_t>> out(prompts.begin(), prompts.end());
  const int64_t plen = int64_t(prompts[0].size());
  for (const auto& pr : prompts)
    EXL_CHECK(int64_t(pr.size()) == plen, "engine: quantize: generate: prompts of unequal length");
  const int64_t max_len = std::max(length, plen);
  if (const auto mem = be_.device_memory()) {
    // A KV pool of every layer for all rows may not fit (7B-shaped, 344 rows of 256: 92 GB in f32);
    // rows are independent, so they go in batches whose pool takes at most half the free memory.
    const int64_t per_row = max_len * cfg_.num_layers * 2 * cfg_.num_kv_heads * cfg_.head_dim * int64_t(sizeof(float));
    const int64_t batch = std::max<int64_t>(1, int64_t(mem->free_bytes / 2) / std::max<int64_t>(per_row, 1));
    if (batch < rows) {
      std::vector<std::vector<int32_t>> all;
      for (int64_t r0 = 0; r0 < rows; r0 += batch) {
        auto part = generate(prompts.subspan(size_t(r0), size_t(std::min(batch, rows - r0))), length,
                             [&](int64_t row, std::span<const float> logits) { return next(r0 + row, logits); }, tp);
        for (auto& r : part) all.push_back(std::move(r));
      }
      return all;
    }
  }
  auto pool = kv_pool(rows, max_len, int(cfg_.num_layers));
  int64_t pos = 0;
  std::vector<int32_t> step_ids;
  for (const auto& pr : prompts) step_ids.insert(step_ids.end(), pr.begin(), pr.end());
  while (true) {
    const int64_t n = int64_t(step_ids.size()) / rows;
    const CalibPositions p{rows, n, pos, std::max(length, plen)};
    Buffer xb = embed(step_ids);
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      xb = attention_block(l, xb, p, *pool, int(l));
      xb = mlp_block(l, xb, p);
    }
    const std::vector<float> x = to_host(xb, size_t(p.tokens() * cfg_.hidden_size));
    pos += n;
    if (pos >= length) break;
    const int64_t H = cfg_.hidden_size;
    std::vector<float> last(size_t(rows * H));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(x.begin() + ((r + 1) * n - 1) * H, H, last.begin() + r * H);
    const std::vector<float> lg = logits(last);
    step_ids.assign(size_t(rows), 0);
    auto pick = [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        step_ids[size_t(r)] =
            next(r, std::span<const float>(lg).subspan(size_t(r * cfg_.vocab_size), size_t(cfg_.vocab_size)));
    };
    if (tp) tp->parallel_for(rows, 1, pick);
    else pick(0, rows);
    for (int64_t r = 0; r < rows; ++r) out[size_t(r)].push_back(step_ids[size_t(r)]);
    if (int64_t(out[0].size()) >= length) break;
  }
  for (auto& o : out) o.resize(size_t(length));
  return out;
}

}  // namespace exl
