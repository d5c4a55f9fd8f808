#include "engine/model.h"

#include <cmath>
#include <string>

#include "engine/formats/linear_loader.h"
#include "engine/mlp_order.h"
#include "engine/rope.h"
#include "engine/tp_model.h"
#include "kernels/env_switch.h"
#include "kernels/error.h"

namespace exl {

struct Model::Layer {
  Buffer attn_norm, mlp_norm;
  std::unique_ptr<PreparedLinear> q, k, v, o, gate, up, down;
};

namespace {

Buffer upload_vector(Backend& be, const std::vector<float>& v) {
  Buffer b = be.alloc(v.size() * sizeof(float));
  be.upload(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Whether MLPs load with gate/up in down_proj's order (mlp_order.h): yes unless EXL_MLP_DOWN_ORDER=0
// (for comparisons; the results are the same bits either way).
bool mlp_in_down_order() {
  static const bool on = !env_is("EXL_MLP_DOWN_ORDER", "0");
  return on;
}

// K/V of a split model: one pool per part, each with the part's layers, under one page table.
class SplitKvPool final : public KvPool {
 public:
  std::vector<std::unique_ptr<KvPool>> parts;
};

}  // namespace

Model::Model(const ModelDir& dir, Backend& backend) : cfg_(dir.config()) {
  parts_.push_back({&backend, 0, cfg_.num_layers, {}});
  load(dir);
}

Model::Model(const ModelDir& dir, std::span<const ModelPart> parts) : cfg_(dir.config()) {
  EXL_CHECK(!parts.empty(), "engine: model: a split model needs at least one part");
  int64_t next = 0;
  for (const ModelPart& p : parts) {
    EXL_CHECK(p.backend != nullptr && p.layer_begin == next && p.layer_end > p.layer_begin,
              "engine: model: part of layers [", p.layer_begin, ", ", p.layer_end, ") does not follow layer ", next,
              " (parts must be non-empty, in order and contiguous, each with a backend)");
    next = p.layer_end;
    parts_.push_back({p.backend, p.layer_begin, p.layer_end, {}});
  }
  EXL_CHECK(next == cfg_.num_layers, "engine: model: the parts hold layers [0, ", next, ") of ", cfg_.num_layers);
  load(dir);
}

Model::Model(const ModelDir& dir, std::span<Backend* const> ranks, Communicator& comm) : cfg_(dir.config()) {
  EXL_CHECK(!ranks.empty() && ranks.front() != nullptr, "engine: model: a tensor-parallel model needs ranks");
  parts_.push_back({ranks.front(), 0, cfg_.num_layers, {}});
  identity_ = std::filesystem::absolute(dir.path()).lexically_normal().string();
  for (const auto& f : dir.files())
    identity_ += cat("|", f->path().filename().string(), ":", std::filesystem::file_size(f->path()));
  tp_ = std::make_unique<TpModel>(dir, ranks, comm);
}

int Model::n_ranks() const { return tp_ ? tp_->n_ranks() : 1; }

const float* Model::device_logits() const { return tp_ ? tp_->device_logits() : last_part().scratch.logits.f32(); }

void Model::load(const ModelDir& dir) {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, D = cfg_.head_dim;
  const int64_t QD = cfg_.num_heads * D, KVD = cfg_.num_kv_heads * D;
  identity_ = std::filesystem::absolute(dir.path()).lexically_normal().string();
  for (const auto& f : dir.files())
    identity_ += cat("|", f->path().filename().string(), ":", std::filesystem::file_size(f->path()));
  rope_ = make_rope_table(cfg_.rope, int(D), cfg_.max_position_embeddings);

  auto emb = dir.require("model.embed_tokens.weight");
  const int64_t emb_shape[2] = {cfg_.vocab_size, H};
  EXL_CHECK(emb.info->shape == std::vector<int64_t>(emb_shape, emb_shape + 2), "engine: model: '", emb.file,
            "': tensor 'model.embed_tokens.weight' has shape ", shape_to_string(emb.info->shape), ", expected ",
            shape_to_string(emb_shape));
  EXL_CHECK(emb.info->dtype == DType::f16 || emb.info->dtype == DType::bf16 || emb.info->dtype == DType::f32,
            "engine: model: tensor 'model.embed_tokens.weight' has unsupported dtype ", to_string(emb.info->dtype));
  embed_ = parts_.front().be->prepare_embedding({cfg_.vocab_size, H, emb.info->dtype, emb.data.data()});

  const int64_t hshape[1] = {H};
  for (const Part& part : parts_) {
    Backend& backend = *part.be;
    for (int64_t l = part.begin; l < part.end; ++l) {
      const std::string p = cat("model.layers.", l, ".");
      Layer L;
      L.attn_norm = upload_vector(backend, load_f32(dir, p + "input_layernorm.weight", hshape));
      L.mlp_norm = upload_vector(backend, load_f32(dir, p + "post_attention_layernorm.weight", hshape));
      L.q = backend.prepare_linear(load_linear(dir, p + "self_attn.q_proj", H, QD));
      L.k = backend.prepare_linear(load_linear(dir, p + "self_attn.k_proj", H, KVD));
      L.v = backend.prepare_linear(load_linear(dir, p + "self_attn.v_proj", H, KVD));
      L.o = backend.prepare_linear(load_linear(dir, p + "self_attn.o_proj", QD, H));
      LinearWeights gate = load_linear(dir, p + "mlp.gate_proj", H, I), up = load_linear(dir, p + "mlp.up_proj", H, I),
                    down = load_linear(dir, p + "mlp.down_proj", I, H);
      if (mlp_in_down_order()) {
        OrderedMlp mlp = order_mlp_by_down(std::move(gate), std::move(up), std::move(down));
        L.gate = backend.prepare_linear(mlp.gate.weights);
        L.up = backend.prepare_linear(mlp.up.weights);
        L.down = backend.prepare_linear(mlp.down);
      } else {
        L.gate = backend.prepare_linear(gate);
        L.up = backend.prepare_linear(up);
        L.down = backend.prepare_linear(down);
      }
      layers_.push_back(std::move(L));
    }
  }
  Backend& last = *parts_.back().be;
  final_norm_ = upload_vector(last, load_f32(dir, "model.norm.weight", hshape));
  head_ = last.prepare_linear(load_linear(dir, "lm_head", H, cfg_.vocab_size));
  for (const auto& f : dir.files()) f->release_pages();
}

Model::~Model() = default;

KvLayout Model::kv_layout(KvFormat format, int page_size) const {
  KvLayout l;
  l.n_layers = int(cfg_.num_layers);
  l.n_kv_heads = int(cfg_.num_kv_heads);
  l.head_dim = int(cfg_.head_dim);
  l.page_size = page_size;
  l.format = format;
  return l;
}

std::unique_ptr<KvPool> Model::alloc_kv_pool(KvFormat format, int page_size, int num_pages) {
  if (tp_) return tp_->alloc_kv_pool(format, page_size, num_pages);
  const KvLayout layout = kv_layout(format, page_size);
  if (parts_.size() == 1) return parts_.front().be->alloc_kv_pool(layout, num_pages);
  auto pool = std::make_unique<SplitKvPool>();
  pool->layout = layout;
  pool->num_pages = num_pages;
  for (const Part& p : parts_) {
    KvLayout pl = layout;
    pl.n_layers = int(p.end - p.begin);
    pool->parts.push_back(p.be->alloc_kv_pool(pl, num_pages));
  }
  return pool;
}

KvPool& Model::part_pool(KvPool& pool, size_t part) const {
  if (parts_.size() == 1) return pool;
  auto* split = dynamic_cast<SplitKvPool*>(&pool);
  EXL_CHECK(split != nullptr && split->parts.size() == parts_.size(),
            "engine: model: a model split over ", parts_.size(),
            " backends needs a K/V pool from its own alloc_kv_pool()");
  return *split->parts[part];
}

void Model::record_steps_at_once(bool on) {
  if (tp_) return;
  for (Part& p : parts_) p.be->record_steps_at_once(on);
}

void Model::kv_copy(KvPool& pool, int from, int to, int n_rows) {
  if (tp_) return tp_->kv_copy(pool, from, to, n_rows);
  for (size_t i = 0; i < parts_.size(); ++i) parts_[i].be->kv_copy(part_pool(pool, i), from, to, n_rows);
}

std::vector<ModelPart> Model::parts() const {
  std::vector<ModelPart> out;
  for (const Part& p : parts_) out.push_back({p.be, p.begin, p.end});
  return out;
}

void Model::ensure_scratch(Part& part, int64_t T, int64_t R) {
  Backend& be = *part.be;
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, D = cfg_.head_dim, V = cfg_.vocab_size;
  const int64_t QD = cfg_.num_heads * D, KVD = cfg_.num_kv_heads * D;
  Scratch& s = part.scratch;
  if (T > s.tokens) {
    T = std::max(T, s.tokens * 2);
    s.x = be.alloc(size_t(T * H) * 4), s.xn = be.alloc(size_t(T * H) * 4), s.tmp = be.alloc(size_t(T * H) * 4);
    s.q = be.alloc(size_t(T * QD) * 4), s.att = be.alloc(size_t(T * QD) * 4);
    s.k = be.alloc(size_t(T * KVD) * 4), s.v = be.alloc(size_t(T * KVD) * 4);
    s.g = be.alloc(size_t(T * I) * 4), s.u = be.alloc(size_t(T * I) * 4);
    s.tokens = T;
  }
  if (R > s.rows) {
    R = std::max(R, s.rows * 2);
    s.last = be.alloc(size_t(R * H) * 4), s.logits = be.alloc(size_t(R * V) * 4);
    s.rows = R;
  }
}

std::vector<float> Model::forward(std::span<const ForwardSeq> batch, KvPool& pool) {
  const int64_t R = forward_device(batch, pool);
  device_rows_ = 0;
  std::vector<float> out(size_t(R * cfg_.vocab_size));
  if (parts_.size() > 1 || tp_) last_part().be->make_current();
  last_part().be->download(out.data(), device_logits(), out.size() * 4);
  return out;
}

bool Model::can_sample_on_device() const { return last_part().be->capabilities().sample_rows; }

bool Model::can_sample_deferred() const {
  return parts_.size() == 1 && !tp_ && parts_.front().be->capabilities().sample_rows_deferred;
}

bool Model::sample_device(std::span<const RowSampling> rows, std::span<int32_t> out) {
  EXL_CHECK(out.size() == rows.size(), "engine: model: sample_device: ", rows.size(), " rows but ", out.size(),
            " outputs");
  for (const RowSampling& r : rows)
    EXL_CHECK(r.row >= 0 && r.row < device_rows_, "engine: model: sample_device: logits row ", r.row,
              " not in the last forward_device() (", device_rows_, " rows)");
  if (parts_.size() > 1 || tp_) last_part().be->make_current();
  return last_part().be->sample_rows(device_logits(), cfg_.vocab_size, rows, out);
}

bool Model::sample_device_deferred(std::span<const RowSampling> rows) {
  for (const RowSampling& r : rows)
    EXL_CHECK(r.row >= 0 && r.row < device_rows_, "engine: model: sample_device_deferred: logits row ", r.row,
              " not in the last forward_device() (", device_rows_, " rows)");
  if (parts_.size() != 1 || tp_) return false;
  return backend().sample_rows_deferred(last_part().scratch.logits.f32(), cfg_.vocab_size, rows);
}

void Model::collect_samples(std::span<int32_t> out) { backend().collect_samples(out); }

int64_t Model::forward_device(std::span<const ForwardSeq> batch, KvPool& pool) {
  if (tp_) {
    device_rows_ = 0;
    device_rows_ = tp_->forward_device(batch, pool);
    return device_rows_;
  }
  return run_forward(batch, pool, false);
}

int64_t Model::forward_device_fed(std::span<const ForwardSeq> batch, KvPool& pool) {
  EXL_CHECK(parts_.size() == 1 && !tp_, "engine: model: forward_device_fed: a model split over ",
            std::max<int64_t>(int64_t(parts_.size()), n_ranks()), " backends cannot decode from deferred samples");
  for (const ForwardSeq& s : batch)
    EXL_CHECK(s.tokens.size() == 1, "engine: model: forward_device_fed: a sequence of ", s.tokens.size(),
              " tokens (a fed step decodes one per sequence)");
  return run_forward(batch, pool, true);
}

// One forward call's host metadata, shared by every part.
struct Model::Step {
  std::vector<int32_t> ids, positions, slots;
  std::vector<SeqAttn> seqs;
  std::vector<int64_t> logit_rows;
  int64_t T = 0, R = 0;
  bool fed = false;
  bool fused = false;  // layers as the fused ops: decode steps and passes of up to k_step_max_tokens
  bool exact = false;  // a q8/q4 cache (see run_part)
};

int64_t Model::run_forward(std::span<const ForwardSeq> batch, KvPool& pool, bool fed) {
  device_rows_ = 0;
  const int64_t V = cfg_.vocab_size;
  const int page_size = pool.layout.page_size;

  Step st;
  st.fed = fed;
  for (const ForwardSeq& s : batch) {
    EXL_CHECK(!s.tokens.empty(), "engine: model: forward: empty sequence in batch");
    const int64_t end = s.pos_start + int64_t(s.tokens.size());
    EXL_CHECK(int64_t(s.page_table.size()) * page_size >= end, "engine: model: forward: page table of ",
              s.page_table.size(), " pages cannot hold ", end, " positions");
    SeqAttn a;
    a.token_begin = int64_t(st.ids.size());
    a.n_tokens = int64_t(s.tokens.size());
    a.pos_start = s.pos_start;
    a.page_table = s.page_table;
    st.seqs.push_back(a);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      EXL_CHECK(fed || (s.tokens[i] >= 0 && s.tokens[i] < V), "engine: model: token id ", s.tokens[i],
                " out of range [0, ", V, ")");
      const int64_t pos = s.pos_start + int64_t(i);
      st.ids.push_back(s.tokens[i]);
      st.positions.push_back(int32_t(pos));
      st.slots.push_back(s.page_table[size_t(pos / page_size)] * page_size + int32_t(pos % page_size));
      if (s.all_logits || i + 1 == s.tokens.size()) st.logit_rows.push_back(a.token_begin + int64_t(i));
    }
  }
  st.T = int64_t(st.ids.size()), st.R = int64_t(st.logit_rows.size());
  st.fused = st.T == int64_t(batch.size()) || st.T <= k_step_max_tokens;
  st.exact = pool.layout.format == KvFormat::q8 || pool.layout.format == KvFormat::q4;
  for (size_t i = 0; i < parts_.size(); ++i) ensure_scratch(parts_[i], st.T, i + 1 == parts_.size() ? st.R : 0);

  for (size_t i = 0; i < parts_.size(); ++i) {
    if (i > 0) hand_over(i - 1, st.T);
    Backend& be = *parts_[i].be;
    if (parts_.size() > 1) be.make_current();
    if (st.fused || st.T <= k_step_max_tokens) {  // decode, or a short pass: a step the backend may replay
      try {
        do {
          be.begin_step();
          run_part(i, st, pool);
        } while (!be.end_step());
      } catch (...) {
        be.cancel_step();
        throw;
      }
    } else {
      run_part(i, st, pool);
    }
  }
  device_rows_ = st.R;
  return st.R;
}

void Model::hand_over(size_t from, int64_t T) {
  Part &a = parts_[from], &b = parts_[from + 1];
  const size_t bytes = size_t(T * cfg_.hidden_size) * 4;
  a.be->make_current();
  if (a.be->copy_to(*b.be, b.scratch.x.data(), a.scratch.x.data(), bytes)) return;
  staging_.resize(bytes / 4);
  a.be->download(staging_.data(), a.scratch.x.data(), bytes);
  b.be->make_current();
  b.be->upload(b.scratch.x.data(), staging_.data(), bytes);
}

void Model::run_part(size_t part, const Step& st, KvPool& whole_pool) {
  const Part& P = parts_[part];
  Backend& be = *P.be;
  KvPool& pool = part_pool(whole_pool, part);
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, D = cfg_.head_dim;
  const int NH = int(cfg_.num_heads), NKV = int(cfg_.num_kv_heads);
  const int64_t T = st.T, R = st.R;
  const Scratch& S = P.scratch;
  const Buffer &x = S.x, &xn = S.xn, &q = S.q, &k = S.k, &v = S.v, &att = S.att, &tmp = S.tmp, &g = S.g, &u = S.u;
  const std::span<const int32_t> positions = st.positions, slots = st.slots;
  const std::span<const SeqAttn> seqs = st.seqs;

  const float eps = float(cfg_.rms_norm_eps), scale = float(1.0 / std::sqrt(double(D)));
  const int window = cfg_.sliding_window ? int(*cfg_.sliding_window) : 0;
  // A q8/q4 cache quantizes K/V: every linear runs exact (Backend::linears_exact), since 16-bit
  // rounding anywhere upstream of a layer's K/V moves values across the format's steps; the head
  // too (few rows outside all-logits prefill), so that q8/q4 logits stay at fp32 level.
  const bool exact = st.exact;
  auto linears = [&](std::span<const PreparedLinear* const> ws, const float* in, std::span<float* const> outs,
                     int64_t rows) {
    if (exact) be.linears_exact(ws, in, outs, rows);
    else be.linears(ws, in, outs, rows);
  };
  auto linear = [&](const PreparedLinear& w, const float* in, float* out, int64_t rows) {
    if (exact) be.linear_exact(w, in, out, rows);
    else be.linear(w, in, out, rows);
  };
  // Decode steps and short passes (verify passes, short prompts and suffixes) hand each norm to the
  // linears that read it and each projection into the residual stream to an op that adds into x
  // (one gemv each on the GPU at one or two rows, the norm writing the tensor-core kernel's input
  // beyond), exact with a q8/q4 cache. Longer prefill chunks keep them apart: there
  // add_rms_norm's single pass over the rows is what counts.
  // The MLP op also runs the o projection, and learns the next layer's attention inputs (on this
  // backend), so that a backend may chain them (MlpInputs).
  auto layer_fused = [&](const Layer& L, int l, const Layer* next) {
    const PreparedLinear* qkv[3] = {L.q.get(), L.k.get(), L.v.get()};
    be.attention_inputs({qkv, x.f32(), L.attn_norm.f32(), xn.f32(), q.f32(), k.f32(), v.f32(), T, H, eps, NH, NKV,
                         int(D), positions, &rope_, &pool, l, slots, exact});
    be.attention(pool, l, q.f32(), att.f32(), seqs, NH, scale, window);
    MlpInputs m{L.gate.get(), L.up.get(), L.down.get(), x.f32(), L.mlp_norm.f32(), xn.f32(), g.f32(), u.f32(), tmp.f32(),
                T, H, I, eps, exact};
    m.o = L.o.get();
    m.att = att.f32();
    const PreparedLinear* next_qkv[3] = {};
    if (next) {
      next_qkv[0] = next->q.get(), next_qkv[1] = next->k.get(), next_qkv[2] = next->v.get();
      m.next_qkv = next_qkv;
      m.next_norm_w = next->attn_norm.f32();
    }
    be.rms_norm_mlp_residual(m);
  };
  auto layer_apart = [&](const Layer& L, int l, const Buffer* next_norm) {
    const PreparedLinear* qkv[3] = {L.q.get(), L.k.get(), L.v.get()};
    float* qkv_out[3] = {q.f32(), k.f32(), v.f32()};
    linears(qkv, xn.f32(), qkv_out, T);
    be.rope_qk_kv_write(q.f32(), k.f32(), v.f32(), T, NH, NKV, int(D), positions, rope_, pool, l, slots);
    be.attention(pool, l, q.f32(), att.f32(), seqs, NH, scale, window);
    linear(*L.o, att.f32(), tmp.f32(), T);
    be.add_rms_norm(x.f32(), tmp.f32(), L.mlp_norm.f32(), xn.f32(), T, H, eps);
    const PreparedLinear* gate_up[2] = {L.gate.get(), L.up.get()};
    float* gate_up_out[2] = {g.f32(), u.f32()};
    linears(gate_up, xn.f32(), gate_up_out, T);
    be.swiglu_linear(*L.down, g.f32(), u.f32(), tmp.f32(), T, I, exact);
    if (next_norm) be.add_rms_norm(x.f32(), tmp.f32(), next_norm->f32(), xn.f32(), T, H, eps);
    else be.add(x.f32(), tmp.f32(), T * H);
  };

  if (part == 0) {
    if (st.fed) be.embedding_of_samples(*embed_, T, x.f32());
    else be.embedding(*embed_, st.ids, x.f32());
  }
  if (!st.fused) be.rms_norm(x.f32(), layers_[size_t(P.begin)].attn_norm.f32(), xn.f32(), T, H, eps);
  for (int64_t l = P.begin; l < P.end; ++l) {
    const int local = int(l - P.begin);
    if (st.fused) layer_fused(layers_[size_t(l)], local, l + 1 < P.end ? &layers_[size_t(l + 1)] : nullptr);
    else layer_apart(layers_[size_t(l)], local, l + 1 < P.end ? &layers_[size_t(l + 1)].attn_norm : nullptr);
  }
  if (part + 1 < parts_.size()) return;
  // Final norm and head only for the rows whose logits are wanted.
  const Buffer &last = S.last, &logits = S.logits;
  for (int64_t r = 0; r < R;) {  // runs of consecutive rows in one call
    int64_t n = 1;
    while (r + n < R && st.logit_rows[size_t(r + n)] == st.logit_rows[size_t(r)] + n) ++n;
    be.rms_norm(x.f32() + st.logit_rows[size_t(r)] * H, final_norm_.f32(), last.f32() + r * H, n, H, eps);
    r += n;
  }
  linear(*head_, last.f32(), logits.f32(), R);
}

}  // namespace exl
