#include "engine/tp_model.h"

#include <cmath>

#include "engine/formats/linear_loader.h"
#include "engine/rope.h"
#include "kernels/error.h"

namespace exl {

namespace {

Buffer tp_upload_vector(Backend& be, const std::vector<float>& v) {
  Buffer b = be.alloc(v.size() * sizeof(float));
  be.upload(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// K/V of a tensor-parallel model: one pool per rank with its kv heads, under one page table.
class TpKvPool final : public KvPool {
 public:
  std::vector<std::unique_ptr<KvPool>> ranks;
};

}  // namespace

// One rank's weights of every layer, and its activations.
struct TpModel::Rank {
  struct Layer {
    Buffer attn_norm, mlp_norm;
    std::unique_ptr<PreparedLinear> q, k, v, o, gate, up, down;
    int n_heads = 0, n_kv_heads = 0;
    int64_t o_cols = 0, mlp_cols = 0;
  };
  Backend* be = nullptr;
  std::unique_ptr<PreparedEmbedding> embed;
  std::vector<Layer> layers;
  // x, xn [T, H]; q [T, QD_r]; k, v [T, KVD_r]; att_local [T, QD_r]; att [T, QD]; o_part [T, H_r];
  // y [T, H]; g, u [T, I_r]: sized for the widest layer share.
  Buffer x, xn, q, k, v, att_local, att, o_part, y, g, u;
};

TpModel::TpModel(const ModelDir& dir, std::span<Backend* const> ranks, Communicator& comm)
    : cfg_(dir.config()), comm_(comm) {
  const int N = int(ranks.size());
  EXL_CHECK(N >= 1 && comm.n_ranks() == N, "engine: tensor parallel: ", N, " ranks but a communicator of ",
            comm.n_ranks());
  plan_ = plan_tensor_parallel(dir, N);
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, D = cfg_.head_dim;
  const int64_t QD = cfg_.num_heads * D, KVD = cfg_.num_kv_heads * D;
  rope_ = make_rope_table(cfg_.rope, int(D), cfg_.max_position_embeddings);
  const TensorView emb = dir.require("model.embed_tokens.weight");
  const int64_t hshape[1] = {H};
  for (int r = 0; r < N; ++r) {
    EXL_CHECK(ranks[size_t(r)] != nullptr, "engine: tensor parallel: rank ", r, " has no backend");
    auto rank = std::make_unique<Rank>();
    Backend& be = *ranks[size_t(r)];
    rank->be = &be;
    rank->embed = be.prepare_embedding({cfg_.vocab_size, H, emb.info->dtype, emb.data.data()});
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
      const TpLayerSlice& s = plan_.slices[size_t(l)][size_t(r)];
      const std::string p = cat("model.layers.", l, ".");
      auto cols = [](int64_t b, int64_t e) {
        std::vector<int32_t> c;
        for (int64_t i = b; i < e; ++i) c.push_back(int32_t(i));
        return c;
      };
      auto prep_cols = [&](const std::string& name, int64_t in, int64_t out, const std::vector<int32_t>& c) {
        return be.prepare_linear(slice_linear_columns(load_linear(dir, p + name, in, out), c).weights);
      };
      Rank::Layer L;
      L.attn_norm = tp_upload_vector(be, load_f32(dir, p + "input_layernorm.weight", hshape));
      L.mlp_norm = tp_upload_vector(be, load_f32(dir, p + "post_attention_layernorm.weight", hshape));
      L.q = prep_cols("self_attn.q_proj", H, QD, cols(s.q_head_begin * D, s.q_head_end * D));
      L.k = prep_cols("self_attn.k_proj", H, KVD, cols(s.kv_head_begin * D, s.kv_head_end * D));
      L.v = prep_cols("self_attn.v_proj", H, KVD, cols(s.kv_head_begin * D, s.kv_head_end * D));
      L.o = prep_cols("self_attn.o_proj", QD, H, cols(s.o_col_begin, s.o_col_end));
      L.gate = prep_cols("mlp.gate_proj", H, I, s.mlp_cols);
      L.up = prep_cols("mlp.up_proj", H, I, s.mlp_cols);
      L.down = be.prepare_linear(
          slice_linear_rows(load_linear(dir, p + "mlp.down_proj", I, H), s.down_row_begin, s.down_row_end, r == 0)
              .weights);
      L.n_heads = int(s.q_head_end - s.q_head_begin);
      L.n_kv_heads = int(s.kv_head_end - s.kv_head_begin);
      L.o_cols = s.o_col_end - s.o_col_begin;
      L.mlp_cols = int64_t(s.mlp_cols.size());
      rank->layers.push_back(std::move(L));
    }
    ranks_.push_back(std::move(rank));
  }
  Backend& be0 = *ranks_.front()->be;
  final_norm_ = tp_upload_vector(be0, load_f32(dir, "model.norm.weight", hshape));
  head_ = be0.prepare_linear(load_linear(dir, "lm_head", H, cfg_.vocab_size));
  for (const auto& f : dir.files()) f->release_pages();
}

TpModel::~TpModel() = default;

std::unique_ptr<KvPool> TpModel::alloc_kv_pool(KvFormat format, int page_size, int num_pages) {
  auto pool = std::make_unique<TpKvPool>();
  pool->layout.n_layers = int(cfg_.num_layers);
  pool->layout.n_kv_heads = int(cfg_.num_kv_heads);
  pool->layout.head_dim = int(cfg_.head_dim);
  pool->layout.page_size = page_size;
  pool->layout.format = format;
  pool->num_pages = num_pages;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    KvLayout l = pool->layout;
    l.n_kv_heads = ranks_[r]->layers.front().n_kv_heads;
    for (const auto& L : ranks_[r]->layers)
      EXL_CHECK(L.n_kv_heads == l.n_kv_heads, "engine: tensor parallel: rank ", r, " holds ", L.n_kv_heads,
                " kv heads in one layer and ", l.n_kv_heads, " in another");
    pool->ranks.push_back(ranks_[r]->be->alloc_kv_pool(l, num_pages));
  }
  return pool;
}

void TpModel::ensure_scratch(int64_t T, int64_t R) {
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, QD = cfg_.num_heads * D, V = cfg_.vocab_size;
  if (T > tokens_) {
    T = std::max(T, tokens_ * 2);
    for (auto& rp : ranks_) {
      Rank& r = *rp;
      Backend& be = *r.be;
      int64_t qd = 0, kvd = 0, oc = 0, ic = 0;
      for (const auto& L : r.layers) {
        qd = std::max(qd, L.n_heads * D), kvd = std::max(kvd, L.n_kv_heads * D);
        oc = std::max(oc, L.o_cols), ic = std::max(ic, L.mlp_cols);
      }
      auto f32 = [&](int64_t n) { return be.alloc(size_t(T * n) * 4); };
      r.x = f32(H), r.xn = f32(H), r.q = f32(qd), r.k = f32(kvd), r.v = f32(kvd), r.att_local = f32(qd);
      r.att = f32(QD), r.o_part = f32(oc), r.y = f32(H), r.g = f32(ic), r.u = f32(ic);
    }
    tokens_ = T;
  }
  if (R > rows_) {
    R = std::max(R, rows_ * 2);
    Backend& be0 = *ranks_.front()->be;
    last_ = be0.alloc(size_t(R * H) * 4), logits_ = be0.alloc(size_t(R * V) * 4);
    rows_ = R;
  }
}

Backend& TpModel::rank_backend(int rank) const { return *ranks_.at(size_t(rank))->be; }

KvPool& TpModel::rank_pool(KvPool& whole_pool, size_t rank) const {
  auto* pool = dynamic_cast<TpKvPool*>(&whole_pool);
  EXL_CHECK(pool != nullptr && pool->ranks.size() == ranks_.size(),
            "engine: tensor parallel: a model over ", ranks_.size(),
            " ranks needs a K/V pool from its own alloc_kv_pool()");
  return *pool->ranks[rank];
}

void TpModel::kv_copy(KvPool& pool, int from, int to, int n_rows) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ranks_[r]->be->make_current();
    ranks_[r]->be->kv_copy(rank_pool(pool, r), from, to, n_rows);
  }
}

std::vector<float> TpModel::forward(std::span<const ForwardSeq> batch, KvPool& pool) {
  const int64_t R = forward_device(batch, pool);
  std::vector<float> logits(size_t(R * cfg_.vocab_size));
  Backend& be0 = *ranks_.front()->be;
  be0.make_current();
  be0.download(logits.data(), logits_.f32(), logits.size() * 4);
  return logits;
}

int64_t TpModel::forward_device(std::span<const ForwardSeq> batch, KvPool& whole_pool) {
  rank_pool(whole_pool, 0);
  auto* pool = static_cast<TpKvPool*>(&whole_pool);
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, V = cfg_.vocab_size;
  const int page_size = pool->layout.page_size;
  std::vector<int32_t> ids, positions, slots;
  std::vector<SeqAttn> seqs;
  std::vector<int64_t> logit_rows;
  for (const ForwardSeq& s : batch) {
    EXL_CHECK(!s.tokens.empty(), "engine: tensor parallel: forward: empty sequence in batch");
    const int64_t end = s.pos_start + int64_t(s.tokens.size());
    EXL_CHECK(int64_t(s.page_table.size()) * page_size >= end, "engine: tensor parallel: forward: page table of ",
              s.page_table.size(), " pages cannot hold ", end, " positions");
    seqs.push_back({int64_t(ids.size()), int64_t(s.tokens.size()), s.pos_start, s.page_table});
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      EXL_CHECK(s.tokens[i] >= 0 && s.tokens[i] < V, "engine: tensor parallel: token id ", s.tokens[i],
                " out of range [0, ", V, ")");
      const int64_t pos = s.pos_start + int64_t(i);
      if (s.all_logits || i + 1 == s.tokens.size()) logit_rows.push_back(int64_t(ids.size()));
      ids.push_back(s.tokens[i]);
      positions.push_back(int32_t(pos));
      slots.push_back(s.page_table[size_t(pos / page_size)] * page_size + int32_t(pos % page_size));
    }
  }
  const int64_t T = int64_t(ids.size()), R = int64_t(logit_rows.size());
  ensure_scratch(T, R);
  const float eps = float(cfg_.rms_norm_eps), scale = float(1.0 / std::sqrt(double(D)));
  const int window = cfg_.sliding_window ? int(*cfg_.sliding_window) : 0;
  const bool exact = pool->layout.format == KvFormat::q8 || pool->layout.format == KvFormat::q4;
  const size_t N = ranks_.size();
  auto linears = [&](Backend& be, std::span<const PreparedLinear* const> ws, const float* in,
                     std::span<float* const> outs) {
    if (exact) be.linears_exact(ws, in, outs, T);
    else be.linears(ws, in, outs, T);
  };
  std::vector<const float*> in(N);
  std::vector<float*> out(N);
  std::vector<int64_t> widths(N);

  for (size_t r = 0; r < N; ++r) {
    ranks_[r]->be->make_current();
    ranks_[r]->be->embedding(*ranks_[r]->embed, ids, ranks_[r]->x.f32());
  }
  for (size_t l = 0; l < size_t(cfg_.num_layers); ++l) {
    for (size_t r = 0; r < N; ++r) {  // attention of each rank's heads
      Rank& k = *ranks_[r];
      Backend& be = *k.be;
      const Rank::Layer& L = k.layers[l];
      be.make_current();
      be.rms_norm(k.x.f32(), L.attn_norm.f32(), k.xn.f32(), T, H, eps);
      const PreparedLinear* qkv[3] = {L.q.get(), L.k.get(), L.v.get()};
      float* qkv_out[3] = {k.q.f32(), k.k.f32(), k.v.f32()};
      linears(be, qkv, k.xn.f32(), qkv_out);
      be.rope_qk_kv_write(k.q.f32(), k.k.f32(), k.v.f32(), T, L.n_heads, L.n_kv_heads, int(D), positions, rope_,
                          *pool->ranks[r], int(l), slots);
      be.attention(*pool->ranks[r], int(l), k.q.f32(), k.att_local.f32(), seqs, L.n_heads, scale, window);
      in[r] = k.att_local.f32(), out[r] = k.att.f32(), widths[r] = L.n_heads * D;
    }
    comm_.all_gather_columns(in, out, T, widths);
    for (size_t r = 0; r < N; ++r) {  // each rank's o_proj columns from the whole attention output
      Rank& k = *ranks_[r];
      const Rank::Layer& L = k.layers[l];
      k.be->make_current();
      const PreparedLinear* o[1] = {L.o.get()};
      float* o_out[1] = {k.o_part.f32()};
      linears(*k.be, o, k.att.f32(), o_out);
      in[r] = k.o_part.f32(), out[r] = k.y.f32(), widths[r] = L.o_cols;
    }
    comm_.all_gather_columns(in, out, T, widths);
    std::vector<float*> partial(N);
    for (size_t r = 0; r < N; ++r) {  // residual, then each rank's share of the MLP
      Rank& k = *ranks_[r];
      Backend& be = *k.be;
      const Rank::Layer& L = k.layers[l];
      be.make_current();
      be.add_rms_norm(k.x.f32(), k.y.f32(), L.mlp_norm.f32(), k.xn.f32(), T, H, eps);
      const PreparedLinear* gate_up[2] = {L.gate.get(), L.up.get()};
      float* gate_up_out[2] = {k.g.f32(), k.u.f32()};
      linears(be, gate_up, k.xn.f32(), gate_up_out);
      be.swiglu_linear(*L.down, k.g.f32(), k.u.f32(), k.y.f32(), T, L.mlp_cols, exact);
      partial[r] = k.y.f32();
    }
    comm_.all_reduce_sum(partial, T * H);
    for (size_t r = 0; r < N; ++r) {
      ranks_[r]->be->make_current();
      ranks_[r]->be->add(ranks_[r]->x.f32(), ranks_[r]->y.f32(), T * H);
    }
  }
  Rank& k0 = *ranks_.front();
  Backend& be0 = *k0.be;
  be0.make_current();
  for (int64_t r = 0; r < R; ++r)
    be0.rms_norm(k0.x.f32() + logit_rows[size_t(r)] * H, final_norm_.f32(), last_.f32() + r * H, 1, H, eps);
  if (exact) be0.linear_exact(*head_, last_.f32(), logits_.f32(), R);
  else be0.linear(*head_, last_.f32(), logits_.f32(), R);
  return R;
}

}  // namespace exl
