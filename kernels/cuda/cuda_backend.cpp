// The CUDA backend (kernels/cuda_backend.h): validates host-side arguments, stages host metadata
// (ids, positions, slots, page tables) and queues the kernels of kernels/cuda/ on one stream.
#include "kernels/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <unordered_set>
#include <utility>

#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_linear.h"
#include "kernels/cuda/cuda_prefill_attention.h"
#include "kernels/cuda/cuda_sampler.h"
#include "kernels/cuda/dense_gemm.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/handoff.h"
#include "kernels/cuda/norm_rope_act.h"
#include "kernels/cuda/op_profiler.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/step_graph.h"
#include "kernels/cuda/step_op.h"
#include "kernels/env_switch.h"
#include "kernels/int_math.h"

namespace exl {

namespace {

using cuda::CudaContext;

struct CudaEmbedding : PreparedEmbedding {
  Buffer table;
  cuda::DenseType type = cuda::DenseType::f16;
};

struct CudaKvPool : KvPool {
  Buffer mem;
  int device = 0;
};

cuda::KvDeviceLayout device_layout(const KvLayout& L, int layer) {
  cuda::KvDeviceLayout d;
  d.n_kv_heads = L.n_kv_heads;
  d.head_dim = L.head_dim;
  d.page_size = L.page_size;
  d.format = int(L.format);
  d.block = L.block();
  d.layer = layer;
  d.page_bytes = int64_t(L.page_bytes());
  d.vec_bytes = int64_t(L.vec_bytes());
  d.vec_scale_bytes = int64_t(L.vec_scale_bytes());
  d.scales_offset = int64_t(L.scale_offset(0));
  return d;
}

class CudaBackend final : public Backend {
  using StepOp = cuda::StepOp;

 public:
  explicit CudaBackend(int device) : ctx_(device) {
    cudaDeviceProp p{};
    EXL_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    name_ = cat("cuda (", p.name, ", sm_", p.major, p.minor, ", device ", device, ")");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(ctx_.stream());
    if (prof_.enabled()) {
      prof_.collect();
      std::cerr << prof_.report();
    }
    if (env_is("EXL_CUDA_GRAPH_STATS", "1")) {
      const auto& o = steps_.one_position();
      const auto& m = steps_.multi_position();
      std::cerr << "cuda: step graphs: one position per sequence: " << o.steps << " steps, " << o.launches
                << " run as graphs, " << o.captures << " captures; several positions: " << m.steps << " steps, "
                << m.launches << " run as graphs, " << m.captures << " captures; captures took "
                << 1e3 * (o.capture_s + m.capture_s) << " ms; graphs dropped by allocations " << steps_.clears()
                << " times\n";
    }
  }

  std::string name() const override { return name_; }
  BackendCapabilities capabilities() const override { return {.sample_rows = true, .sample_rows_deferred = true}; }

  Buffer alloc(size_t bytes) override { return ctx_.alloc(std::max<size_t>(bytes, 1)); }
  void upload(void* dst, const void* src, size_t bytes) override {
    handoff_.other();
    ctx_.make_current();
    EXL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
    ctx_.sync();
  }
  void download(void* dst, const void* src, size_t bytes) override {
    ctx_.make_current();
    EXL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.sync();
    prof_.collect();
  }
  void make_current() override { ctx_.make_current(); }
  void synchronize() override {
    ctx_.sync();
    prof_.collect();
  }
  std::optional<DeviceMemory> device_memory() const override {
    ctx_.make_current();
    size_t free_b = 0, total_b = 0;
    EXL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return DeviceMemory{ctx_.device(), free_b, total_b};
  }

  std::unique_ptr<PreparedLinear> prepare_linear(const LinearWeights& w) override {
    return cuda::prepare_cuda_linear(ctx_, w);
  }

  std::unique_ptr<PreparedEmbedding> prepare_embedding(const EmbeddingWeights& e) override {
    EXL_CHECK(e.dtype == DType::f32 || e.dtype == DType::f16 || e.dtype == DType::bf16,
              "kernels: cuda: embedding: unsupported table dtype ", to_string(e.dtype));
    EXL_CHECK(e.vocab > 0 && e.dim > 0, "kernels: cuda: embedding: empty table [", e.vocab, ", ", e.dim, "]");
    auto p = std::make_unique<CudaEmbedding>();
    p->vocab = e.vocab;
    p->dim = e.dim;
    p->type = e.dtype == DType::f32 ? cuda::DenseType::f32
              : e.dtype == DType::f16 ? cuda::DenseType::f16
                                      : cuda::DenseType::bf16;
    p->table = ctx_.upload_new(e.data, size_t(e.vocab * e.dim) * dtype_size(e.dtype));
    return p;
  }

  std::unique_ptr<KvPool> alloc_kv_pool(const KvLayout& layout, int num_pages) override {
    EXL_CHECK(layout.n_layers > 0 && layout.n_kv_heads > 0 && layout.page_size > 0 && num_pages > 0,
              "kernels: cuda: kv pool: empty layout or no pages");
    EXL_CHECK(layout.head_dim > 0 && layout.head_dim <= cuda::k_attn_max_head_dim, "kernels: cuda: kv pool: head_dim ",
              layout.head_dim, " is outside 1..", cuda::k_attn_max_head_dim);
    EXL_CHECK(int64_t(num_pages) * layout.page_size < (int64_t(1) << 31), "kernels: cuda: kv pool: ", num_pages,
              " pages of ", layout.page_size, " slots exceed int32 slot ids");
    auto p = std::make_unique<CudaKvPool>();
    p->layout = layout;
    p->num_pages = num_pages;
    p->device = ctx_.device();
    p->mem = ctx_.alloc(layout.page_bytes() * size_t(num_pages));
    EXL_CUDA_CHECK(cudaMemsetAsync(p->mem.data(), 0, p->mem.bytes(), ctx_.stream()));
    ctx_.sync();
    return p;
  }

  void embedding(const PreparedEmbedding& pe, std::span<const int32_t> ids, float* out) override {
    handoff_.other();
    const auto& e = static_cast<const CudaEmbedding&>(pe);
    for (size_t i = 0; i < ids.size(); ++i)
      EXL_CHECK(ids[i] >= 0 && ids[i] < e.vocab, "kernels: cuda: embedding: token id ", ids[i], " at ", i,
                " is outside the vocabulary of ", e.vocab);
    if (ids.empty()) return;
    ctx_.make_current();
    const auto* d_ids = static_cast<const int32_t*>(ctx_.stage(ids.data(), ids.size_bytes()));
    steps_.note(StepOp::embedding, &e, d_ids, ids.size(), out);
    if (steps_.recording()) return;
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(
        cuda::embedding(e.type, e.table.data(), e.vocab, e.dim, d_ids, int64_t(ids.size()), out, ctx_.stream()));
    prof_.end(ctx_.stream(), "embedding");
  }

  void embedding_of_samples(const PreparedEmbedding& pe, int64_t n, float* out) override {
    handoff_.other();
    const auto& e = static_cast<const CudaEmbedding&>(pe);
    const int32_t* d_ids = sampler_.deferred_ids(n);
    if (n == 0) return;
    ctx_.make_current();
    steps_.note(StepOp::embedding_of_samples, &e, d_ids, n, out);
    if (steps_.recording()) return;
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::embedding(e.type, e.table.data(), e.vocab, e.dim, d_ids, n, out, ctx_.stream()));
    prof_.end(ctx_.stream(), "embedding");
  }

  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) override {
    handoff_.other();
    steps_.note(StepOp::rms_norm, x, w, y, rows, dim, eps);
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::rms_norm(x, w, y, rows, dim, eps, ctx_.stream()));
    prof_.end(ctx_.stream(), "rms_norm");
  }

  void linear(const PreparedLinear& w, const float* x, float* y, int64_t rows) override {
    handoff_.other();
    if (rows == 0) return;
    const auto& l = static_cast<const cuda::CudaLinear&>(w);
    steps_.note(StepOp::linear, &l, x, y, rows);
    if (l.calls_cublas(rows, false)) steps_.forbid_capture();
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    l.run(ctx_, x, y, rows);
    if (prof_.enabled())
      prof_.end(ctx_.stream(), cat("linear ", l.out_features, "x", l.in_features, " rows ", rows), double(l.weight_bytes));
  }

  void linears(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
               int64_t rows) override {
    queue_linears(ws, x, ys, rows, false);
  }
  void linears_exact(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
                     int64_t rows) override {
    queue_linears(ws, x, ys, rows, true);
  }
  // linears() and linears_exact(): ys[i] = x · W_iᵀ, through CudaLinear::run_exact when `exact`.
  void queue_linears(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
                     int64_t rows, bool exact) {
    handoff_.other();
    EXL_CHECK(ws.size() == ys.size(), "kernels: cuda: linears: ", ws.size(), " matrices for ", ys.size(), " outputs");
    if (rows == 0 || ws.empty()) return;
    std::vector<const cuda::CudaLinear*> ls;
    steps_.note(StepOp::linears, x, rows, ws.size(), exact);
    for (size_t i = 0; i < ws.size(); ++i) {
      ls.push_back(static_cast<const cuda::CudaLinear*>(ws[i]));
      steps_.note(ls.back(), ys[i]);
    }
    for (const auto* l : ls)
      if (l->calls_cublas(rows, exact)) steps_.forbid_capture();
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    cuda::run_linears(ctx_, ls, x, ys, rows, exact);
    if (prof_.enabled()) {
      double bytes = 0;
      std::string key = exact ? "linears exact" : "linears";
      for (const auto* l : ls) bytes += double(l->weight_bytes), key += cat(" ", l->out_features, "x", l->in_features);
      prof_.end(ctx_.stream(), cat(key, " rows ", rows), bytes);
    }
  }

  void rope(float* x, int64_t rows, int n_heads, int head_dim, std::span<const int32_t> positions,
            const RopeTable& table) override {
    handoff_.other();
    const auto [d_pos, d_freq] = rope_inputs(rows, head_dim, positions, table);
    if (rows == 0) return;
    steps_.note(StepOp::rope, x, rows, n_heads, head_dim, d_pos, d_freq, table.attn_factor);
    if (steps_.recording()) return;
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::rope(x, rows, n_heads, head_dim, d_pos, d_freq, table.attn_factor, ctx_.stream()));
    prof_.end(ctx_.stream(), "rope (with staging)");
  }

  void rope_qk(float* q, float* k, int64_t rows, int n_heads, int n_kv_heads, int head_dim,
               std::span<const int32_t> positions, const RopeTable& table) override {
    handoff_.other();
    const auto [d_pos, d_freq] = rope_inputs(rows, head_dim, positions, table);
    if (rows == 0) return;
    steps_.note(StepOp::rope_qk, q, k, rows, n_heads, n_kv_heads, head_dim, d_pos, d_freq, table.attn_factor);
    if (steps_.recording()) return;
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::rope_qk(q, k, rows, n_heads, n_kv_heads, head_dim, d_pos, d_freq, table.attn_factor,
                                 ctx_.stream()));
    prof_.end(ctx_.stream(), "rope q+k (with staging)");
  }

  void rope_qk_kv_write(float* q, float* k, const float* v, int64_t rows, int n_heads, int n_kv_heads, int head_dim,
                        std::span<const int32_t> positions, const RopeTable& table, KvPool& pool, int layer,
                        std::span<const int32_t> slots) override {
    handoff_.other();
    auto& p = checked_pool(pool);
    if (int64_t(slots.size()) != rows || p.layout.n_kv_heads != n_kv_heads || p.layout.head_dim != head_dim)
      return Backend::rope_qk_kv_write(q, k, v, rows, n_heads, n_kv_heads, head_dim, positions, table, pool, layer,
                                       slots);
    check_slots(p, layer, slots);
    const auto [d_pos, d_freq] = rope_inputs(rows, head_dim, positions, table);
    if (rows == 0) return;
    const auto* d_slots = static_cast<const int32_t*>(ctx_.stage(slots.data(), slots.size_bytes()));
    steps_.note(StepOp::rope_qk_kv_write, q, k, v, rows, n_heads, n_kv_heads, head_dim, d_pos, d_freq, table.attn_factor,
                p.mem.data(), layer, d_slots);
    if (steps_.recording()) return;
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::rope_qk_store(q, k, v, rows, n_heads, n_kv_heads, head_dim, d_pos, d_freq, table.attn_factor,
                                       static_cast<uint8_t*>(p.mem.data()), device_layout(p.layout, layer), d_slots,
                                       ctx_.stream()));
    prof_.end(ctx_.stream(), "rope q+k + kv_write (with staging)");
  }

  void attention_inputs(const AttnInputs& a) override {
    std::vector<const cuda::CudaLinear*> ls;
    for (const auto* w : a.qkv) ls.push_back(static_cast<const cuda::CudaLinear*>(w));
    auto& p = checked_pool(*a.pool);
    constexpr int D = cuda::k_exl2_gemv_cols_per_block;
    const bool shape = a.rows > 0 && ls.size() == 3 && ls[0]->in_features == a.dim && a.head_dim == D &&
                       ls[0]->out_features == int64_t(a.n_heads) * D &&
                       ls[1]->out_features == int64_t(a.n_kv_heads) * D && ls[2]->out_features == ls[1]->out_features &&
                       int64_t(a.slots.size()) == a.rows && p.layout.n_kv_heads == a.n_kv_heads &&
                       p.layout.head_dim == a.head_dim;
    if (shape && !cuda::fuse_norm(ls, a.rows) && !a.exact && staged_inputs_ && chains(a.rows) &&
        cuda::mma_serves(ls, a.rows))
      return attention_inputs_staged(a, ls, p);
    if (!shape || !cuda::fuse_norm(ls, a.rows)) return Backend::attention_inputs(a);
    const cuda::Handoff::In in = handoff_.read(ls, a.x, nullptr, a.norm_w, a.rows);
    check_slots(p, a.layer, a.slots);
    const auto [d_pos, d_freq] = rope_inputs(a.rows, a.head_dim, a.positions, *a.rope);
    const auto* d_slots = static_cast<const int32_t*>(ctx_.stage(a.slots.data(), a.slots.size_bytes()));
    steps_.note(StepOp::attention_inputs, a.x, a.norm_w, a.q, a.k, a.v, a.rows, a.dim, a.eps, a.n_heads, a.n_kv_heads,
                d_pos, d_freq, a.rope->attn_factor, p.mem.data(), a.layer, d_slots, ls[0], ls[1], ls[2]);
    note_handoff(in, {});
    if (steps_.recording()) return;
    prof_.begin(ctx_.stream());
    const cuda::Exl2RopeKv r{d_pos, d_freq, a.rope->attn_factor, static_cast<uint8_t*>(p.mem.data()),
                             device_layout(p.layout, a.layer), d_slots};
    float* outs[3] = {a.q, a.k, a.v};
    cuda::run_linears_normed(ctx_, ls, in.ok ? in.x : a.x, in.ok ? in.norm_w : a.norm_w, a.eps, outs, a.rows, &r,
                             &in.io);
    if (prof_.enabled()) prof_.end(ctx_.stream(), cat("rms_norm + q/k/v + rope + kv_write rows ", a.rows), set_bytes(ls));
  }

  // attention_inputs for a q/k/v tensor-core set: the norm stages its input, and its K-slice sums
  // rotate and store (cuda::run_linears_norm_staged with rope). The same values as the separate
  // ops (rms_norm_linears, rope_qk_kv_write), bit for bit.
  void attention_inputs_staged(const AttnInputs& a, std::span<const cuda::CudaLinear* const> ls, CudaKvPool& p) {
    const void* reader[3] = {ls[0], ls[1], ls[2]};
    const bool prestaged =
        handoff_.read_staged(a.x, a.norm_w, reader, a.rows, cuda::exl2_mma_staged_bytes(int(a.rows), int(a.dim), 3));
    forget_if_freed();
    staged_attention_.insert(ls[0]);
    check_slots(p, a.layer, a.slots);
    const auto [d_pos, d_freq] = rope_inputs(a.rows, a.head_dim, a.positions, *a.rope);
    const auto* d_slots = static_cast<const int32_t*>(ctx_.stage(a.slots.data(), a.slots.size_bytes()));
    steps_.note(StepOp::attention_inputs_staged, a.x, a.norm_w, a.q, a.k, a.v, a.rows, a.dim, a.eps, a.n_heads,
                a.n_kv_heads, d_pos, d_freq, a.rope->attn_factor, p.mem.data(), a.layer, d_slots, ls[0], ls[1], ls[2],
                prestaged);
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    const cuda::Exl2RopeKv r{d_pos, d_freq, a.rope->attn_factor, static_cast<uint8_t*>(p.mem.data()),
                             device_layout(p.layout, a.layer), d_slots};
    float* outs[3] = {a.q, a.k, a.v};
    cuda::run_linears_norm_staged(ctx_, ls, a.x, a.norm_w, a.eps, outs, a.rows, &r, prestaged);
    if (prof_.enabled())
      prof_.end(ctx_.stream(), cat(prestaged ? "q/k/v (prestaged)" : "rms_norm (staged) + q/k/v", " + rope + kv_write rows ",
                                   a.rows),
                set_bytes(ls));
  }

  void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t dim,
                    float eps) override {
    handoff_.other();
    if (x == out) return Backend::add_rms_norm(x, y, w, out, rows, dim, eps);
    steps_.note(StepOp::add_rms_norm, x, y, w, out, rows, dim, eps);
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::add_rms_norm(x, y, w, out, rows, dim, eps, ctx_.stream()));
    prof_.end(ctx_.stream(), "add + rms_norm");
  }

  void swiglu(const float* gate, const float* up, float* out, int64_t n) override {
    handoff_.other();
    steps_.note(StepOp::swiglu, gate, up, out, n);
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::swiglu(gate, up, out, n, ctx_.stream()));
    prof_.end(ctx_.stream(), "swiglu");
  }

  // The fused passes compute what linears_exact does with `exact` and what linears does without
  // (CudaLinear::fuses: the tensor-core kernel for batches of 3+ rows when not exact).
  void swiglu_linear(const PreparedLinear& w, float* gate, const float* up, float* y, int64_t rows, int64_t k,
                     bool exact) override {
    const auto& l = static_cast<const cuda::CudaLinear&>(w);
    if (rows == 0) return;
    if (!l.fuses(rows, exact)) return Backend::swiglu_linear(w, gate, up, y, rows, k, exact);
    fused_linear(StepOp::swiglu_linear, l, gate, up, y, rows, false, exact, "swiglu + linear ");
  }

  void swiglu_linear_residual(const PreparedLinear& w, float* gate, const float* up, float* x, float* tmp,
                              int64_t rows, int64_t k, bool exact) override {
    const auto& l = static_cast<const cuda::CudaLinear&>(w);
    if (rows == 0) return;
    if (!l.fuses(rows, exact)) return Backend::swiglu_linear_residual(w, gate, up, x, tmp, rows, k, exact);
    fused_linear(StepOp::swiglu_linear_residual, l, gate, up, x, rows, true, exact, "swiglu + linear + residual ");
  }

  void linear_residual(const PreparedLinear& w, const float* in, float* x, float* tmp, int64_t rows,
                       bool exact) override {
    const auto& l = static_cast<const cuda::CudaLinear&>(w);
    if (rows == 0) return;
    if (!l.fuses(rows, exact)) return Backend::linear_residual(w, in, x, tmp, rows, exact);
    fused_linear(StepOp::linear_residual, l, in, nullptr, x, rows, true, exact, "linear + residual ");
  }

  // One CudaLinear::run_fused launch, noted for step graphs under `op`.
  // It reads what the previous op handed off (cuda::Handoff) and, adding into the residual stream,
  // hands y on.
  void fused_linear(StepOp op, const cuda::CudaLinear& l, const float* in, const float* up, float* y, int64_t rows,
                    bool residual, bool exact, const char* what) {
    const cuda::CudaLinear* self[1] = {&l};
    const cuda::Handoff::In hin = handoff_.read(self, in, up, nullptr, rows);
    cuda::Handoff::Out hout;
    if (residual)
      hout = handoff_.produce(key_of(&l), y, nullptr, l.out_features, rows, cuda::handoff_perm(self, rows).inv_perm);
    steps_.note(op, &l, in, up, y, rows, exact);
    cuda::Exl2GemvHandoff io;
    if (!start_fused(hin, hout, io)) return;
    io.ssq_out = hout.ssq;
    l.run_fused(ctx_, hin.ok ? hin.x : in, hin.ok ? hin.up : up, y, rows, residual, exact, &io);
    if (prof_.enabled())
      prof_.end(ctx_.stream(), cat(what, l.out_features, "x", l.in_features, " rows ", rows), double(l.weight_bytes));
  }

  void rms_norm_linears(std::span<const PreparedLinear* const> ws, const float* x, const float* norm_w, float* xn,
                        std::span<float* const> ys, int64_t rows, int64_t dim, float eps, bool exact) override {
    if (rows == 0 || ws.empty()) return;
    std::vector<const cuda::CudaLinear*> ls;
    for (const auto* w : ws) ls.push_back(static_cast<const cuda::CudaLinear*>(w));
    const bool shape_ok = ls[0]->in_features == dim && ys.size() == ls.size();
    if (!shape_ok || !cuda::fuse_norm(ls, rows)) {
      if (!shape_ok || exact || !staged_inputs_ || !cuda::mma_serves(ls, rows))
        return Backend::rms_norm_linears(ws, x, norm_w, xn, ys, rows, dim, eps, exact);
      handoff_.other();
      steps_.note(StepOp::rms_norm_linears_staged, x, norm_w, rows, dim, eps, ls.size());
      for (size_t i = 0; i < ls.size(); ++i) steps_.note(ls[i], ys[i]);
      if (steps_.recording()) return;
      ctx_.make_current();
      prof_.begin(ctx_.stream());
      cuda::run_linears_norm_staged(ctx_, ls, x, norm_w, eps, ys, rows);
      if (prof_.enabled()) prof_.end(ctx_.stream(), cat("rms_norm (staged) + linears rows ", rows), set_bytes(ls));
      return;
    }
    const cuda::Handoff::In hin = handoff_.read(ls, x, nullptr, norm_w, rows);
    const bool two = ls.size() <= 2 && (ls.size() == 1 || ls[1]->out_features == ls[0]->out_features);
    const cuda::Handoff::Out hout =
        handoff_.produce(key_of(ls[0]), ys[0], ls.size() == 2 ? ys[1] : nullptr, ls[0]->out_features, rows,
                         two && cuda::handoff_perm(ls, rows).inv_perm);
    steps_.note(StepOp::rms_norm_linears, x, norm_w, rows, dim, eps, ls.size());
    for (size_t i = 0; i < ls.size(); ++i) steps_.note(ls[i], ys[i]);
    cuda::Exl2GemvHandoff io;
    if (!start_fused(hin, hout, io)) return;
    io.out_perm[1] = hout.up;
    cuda::run_linears_normed(ctx_, ls, hin.ok ? hin.x : x, hin.ok ? hin.norm_w : norm_w, eps, ys, rows, nullptr, &io);
    if (prof_.enabled()) {
      double bytes = 0;
      std::string key = "rms_norm + linears";
      for (const auto* l : ls) bytes += double(l->weight_bytes), key += cat(" ", l->out_features, "x", l->in_features);
      prof_.end(ctx_.stream(), cat(key, " rows ", rows), bytes);
    }
  }

  // The layer's output block (the o projection when given, the MLP) as a chain of tensor-core
  // launches, each writing the next one's staged input (cuda::run_layer_output_staged), where
  // gate/up and down are tensor-core sets at m.rows; o joins the chain where it is one too (else
  // its own pass runs first), and so do the next layer's q/k/v: the next attention_inputs then
  // finds its input staged (Handoff::read_staged).
  void rms_norm_mlp_residual(const MlpInputs& m) override {
    if (m.rows == 0) return;
    const auto& gate = static_cast<const cuda::CudaLinear&>(*m.gate);
    const auto& up = static_cast<const cuda::CudaLinear&>(*m.up);
    const auto& down = static_cast<const cuda::CudaLinear&>(*m.down);
    const cuda::CudaLinear* gu[2] = {&gate, &up};
    const cuda::CudaLinear* dn[1] = {&down};
    if (m.exact || !staged_inputs_ || gate.in_features != m.dim || gate.out_features != m.k ||
        up.out_features != m.k || down.in_features != m.k || down.out_features != m.dim ||
        !cuda::mma_serves(gu, m.rows) || !cuda::mma_serves(dn, m.rows))
      return Backend::rms_norm_mlp_residual(m);
    const auto* o = static_cast<const cuda::CudaLinear*>(m.o);
    const cuda::CudaLinear* os[1] = {o};
    if (o && (!chains(m.rows) || o->out_features != m.dim || !cuda::mma_serves(os, m.rows))) {
      linear_residual(*o, m.att, m.x, m.tmp, m.rows, m.exact);
      o = nullptr;
    }
    forget_if_freed();
    std::vector<const cuda::CudaLinear*> next;
    for (const auto* w : m.next_qkv) next.push_back(static_cast<const cuda::CudaLinear*>(w));
    if (!chains(m.rows) || next.size() != 3 || !m.next_norm_w || next[0]->in_features != m.dim ||
        !staged_attention_.count(next[0]) ||
        !cuda::mma_serves(next, m.rows))
      next.clear();
    cuda::StagedLayerOutput chain{o, m.att, &gate, &up, &down, m.x, m.norm_w, m.eps, m.g, m.u, m.rows, next,
                                  next.empty() ? nullptr : m.next_norm_w};
    const size_t chain_bytes = cuda::layer_output_staged_bytes(chain);
    if (o) {  // the attention that wrote att learns to stage it for o from the next step on
      const cuda::Handoff::Key key = handoff_.producer_of(m.att, m.rows);
      if (key.first) {
        OutputChain& learned = att_readers_[key];
        learned = {o, &gate, &up, &down, {}, next.size()};
        std::copy(next.begin(), next.end(), learned.next);
      }
      const void* reader[1] = {o};
      chain.att_staged = handoff_.read_staged(m.att, nullptr, reader, m.rows, chain_bytes);
    }
    handoff_.other();
    steps_.note(StepOp::rms_norm_mlp_residual, m.x, m.norm_w, m.g, m.u, m.rows, m.dim, m.k, m.eps, &gate, &up, &down, o,
                o ? m.att : nullptr, next.size(), m.next_norm_w, chain.att_staged);
    for (const auto* l : next) steps_.note(l);
    if (!next.empty()) {
      const void* reader[3] = {next[0], next[1], next[2]};
      handoff_.produce_staged({}, m.x, m.next_norm_w, reader, m.rows, chain_bytes);
    }
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    cuda::run_layer_output_staged(ctx_, chain);
    if (prof_.enabled()) {
      std::vector<const cuda::CudaLinear*> all = {&gate, &up, &down};
      if (o) all.push_back(o);
      prof_.end(ctx_.stream(),
                cat(o ? (chain.att_staged ? "o (prestaged) + " : "o + ") : "", "rms_norm + mlp (staged) ", m.dim, "x", m.k, next.empty() ? "" : " + next norm",
                    " rows ", m.rows),
                set_bytes(all));
    }
  }

  void add(float* x, const float* y, int64_t n) override {
    handoff_.other();
    steps_.note(StepOp::add, x, y, n);
    if (steps_.recording()) return;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::add(x, y, n, ctx_.stream()));
    prof_.end(ctx_.stream(), "add");
  }

  void kv_write(KvPool& pool, int layer, const float* k, const float* v, std::span<const int32_t> slots) override {
    handoff_.other();
    auto& p = checked_pool(pool);
    check_slots(p, layer, slots);
    if (slots.empty()) return;
    ctx_.make_current();
    const auto* d_slots = static_cast<const int32_t*>(ctx_.stage(slots.data(), slots.size_bytes()));
    steps_.note(StepOp::kv_write, p.mem.data(), layer, k, v, d_slots, slots.size());
    if (steps_.recording()) return;
    prof_.begin(ctx_.stream());
    EXL_CUDA_CHECK(cuda::kv_write(static_cast<uint8_t*>(p.mem.data()), device_layout(p.layout, layer), k, v, d_slots,
                                  int(slots.size()), ctx_.stream()));
    prof_.end(ctx_.stream(), "kv_write (with staging)");
  }

  void kv_copy(KvPool& pool, int from, int to, int n_rows) override {
    handoff_.other();
    auto& p = static_cast<CudaKvPool&>(pool);
    const KvLayout& L = p.layout;
    EXL_CHECK(from >= 0 && to >= 0 && from < p.num_pages && to < p.num_pages && n_rows >= 0 && n_rows <= L.page_size,
              "kernels: cuda: kv_copy: pages ", from, " -> ", to, " rows ", n_rows, " out of range");
    steps_.note(StepOp::kv_copy, p.mem.data(), from, to, n_rows);
    if (steps_.recording()) return;
    ctx_.make_current();
    auto* base = static_cast<uint8_t*>(p.mem.data());
    for (int layer = 0; layer < L.n_layers; ++layer)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < L.n_kv_heads; ++h) {
          const size_t vec = L.vec_index(layer, kv, h, 0);
          EXL_CUDA_CHECK(cudaMemcpyAsync(base + size_t(to) * L.page_bytes() + L.data_offset(vec),
                                         base + size_t(from) * L.page_bytes() + L.data_offset(vec),
                                         size_t(n_rows) * L.vec_bytes(), cudaMemcpyDeviceToDevice, ctx_.stream()));
          if (L.vec_scale_bytes())
            EXL_CUDA_CHECK(cudaMemcpyAsync(base + size_t(to) * L.page_bytes() + L.scale_offset(vec),
                                           base + size_t(from) * L.page_bytes() + L.scale_offset(vec),
                                           size_t(n_rows) * L.vec_scale_bytes(), cudaMemcpyDeviceToDevice,
                                           ctx_.stream()));
        }
  }

  void attention(const KvPool& pool, int layer, const float* q, float* out, std::span<const SeqAttn> seqs,
                 int n_heads, float scale, int sliding_window) override;
  // Long prompts on an fp16 cache: flash_attention.h's kernel, queued op by op.
  void flash_attention(const CudaKvPool& p, const cuda::KvDeviceLayout& dl, const float* q, float* out,
                       std::span<const SeqAttn> seqs, int n_heads, float scale, int sliding_window);
  // The AttnArgs of `plan`, whose seqs, pages and works were staged at d_meta + o_seqs, o_pages,
  // o_works (pack), with a split plan's partials area from the scratch that grows in whole powers
  // of two from 1 MiB (so that step graphs are captured anew rarely).
  cuda::AttnArgs plan_args(const CudaKvPool& p, const cuda::KvDeviceLayout& dl, const cuda::AttnPlan& plan,
                           const int32_t* d_meta, size_t o_seqs, size_t o_pages, size_t o_works, const float* q,
                           float* out, int n_heads, float scale, int window);

  bool sample_rows(const float* logits, int64_t vocab, std::span<const RowSampling> rows,
                   std::span<int32_t> out) override {
    handoff_.other();
    prof_.begin(ctx_.stream());
    sampler_.run(logits, vocab, rows, out);
    if (prof_.enabled()) prof_.end(ctx_.stream(), cat("sample_rows ", rows.size()));
    return true;
  }

  bool sample_rows_deferred(const float* logits, int64_t vocab, std::span<const RowSampling> rows) override {
    if (rows.empty()) return true;
    handoff_.other();
    prof_.begin(ctx_.stream());
    sampler_.run_deferred(logits, vocab, rows);
    if (prof_.enabled()) prof_.end(ctx_.stream(), cat("sample_rows ", rows.size()));
    return true;
  }

  void collect_samples(std::span<int32_t> out) override { sampler_.collect(out); }

  CudaStepStats step_stats() const {
    const auto& m = steps_.multi_position();
    return {steps_.launches(), steps_.captures(), handoff_.reads(), m.steps, m.launches, m.captures};
  }

  void begin_step() override {
    attn_step_.valid = false;
    handoff_.begin_step();
    steps_.begin(ctx_);
  }
  bool end_step() override {
    attn_step_.valid = false;
    return steps_.end(ctx_);
  }
  void cancel_step() noexcept override {
    attn_step_.valid = false;
    steps_.cancel(ctx_);
  }
  void record_steps_at_once(bool on) override { steps_.set_record_at_once(on); }

 private:
  // Validates rope arguments, stages the positions and keeps the frequencies on the device.
  static void check_slots(const CudaKvPool& p, int layer, std::span<const int32_t> slots) {
    EXL_CHECK(layer >= 0 && layer < p.layout.n_layers, "kernels: cuda: kv_write: layer ", layer, " outside 0..",
              p.layout.n_layers - 1);
    const int64_t n_slots = int64_t(p.num_pages) * p.layout.page_size;
    for (size_t i = 0; i < slots.size(); ++i)
      EXL_CHECK(slots[i] >= 0 && slots[i] < n_slots, "kernels: cuda: kv_write: slot ", slots[i], " at ", i,
                " is outside the pool's ", n_slots, " slots");
  }

  std::pair<const int32_t*, const float*> rope_inputs(int64_t rows, int head_dim, std::span<const int32_t> positions,
                                                      const RopeTable& table) {
    EXL_CHECK(head_dim > 0 && head_dim % 2 == 0 && table.inv_freq.size() == size_t(head_dim / 2),
              "kernels: cuda: rope: head_dim ", head_dim, " does not match a table of ", table.inv_freq.size(),
              " frequencies");
    EXL_CHECK(positions.size() >= size_t(rows), "kernels: cuda: rope: ", positions.size(), " positions for ", rows,
              " rows");
    if (rows == 0) return {nullptr, nullptr};
    ctx_.make_current();
    const auto* d_pos = static_cast<const int32_t*>(ctx_.stage(positions.data(), size_t(rows) * sizeof(int32_t)));
    if (table.inv_freq != rope_freq_host_) {  // the frequencies stay on the device while unchanged
      rope_freq_host_ = table.inv_freq;
      rope_freq_ = ctx_.upload_new(rope_freq_host_);
    }
    return {d_pos, static_cast<const float*>(rope_freq_.data())};
  }

  const CudaKvPool& checked_pool(const KvPool& pool) const {
    const auto* p = dynamic_cast<const CudaKvPool*>(&pool);
    EXL_CHECK(p != nullptr && p->device == ctx_.device(), "kernels: cuda: kv pool was not made by this backend");
    return *p;
  }
  CudaKvPool& checked_pool(KvPool& pool) const {
    return const_cast<CudaKvPool&>(checked_pool(static_cast<const KvPool&>(pool)));
  }

  // The attention plan of the current step, staged once for all layers (the same sequences).
  struct AttnStepPlan {
    bool valid = false;
    const SeqAttn* seqs = nullptr;
    size_t n_seqs = 0;
    const KvPool* pool = nullptr;
    int n_heads = 0, window = 0;
    cuda::AttnPlan plan;
    const int32_t* d_meta = nullptr;
    size_t o_seqs = 0, o_pages = 0, o_works = 0, o_pos = 0, meta_size = 0;
  };

  CudaContext ctx_;
  cuda::OpProfiler prof_;
  // EXL_CUDA_GRAPHS=0 issues decode steps op by op (for comparisons); profiling does too.
  // EXL_CUDA_GRAPH_MULTI_AFTER=N: a multi-position step's shape is captured when seen N times
  // before (default 1; -1: never), for comparisons.
  cuda::StepGraphs steps_{!prof_.enabled() && !env_is("EXL_CUDA_GRAPHS", "0"),
                          env_is("EXL_CUDA_GRAPH_MULTI_AFTER", "") ? 1
                                                                    : int(env_int("EXL_CUDA_GRAPH_MULTI_AFTER", 1))};
  AttnStepPlan attn_step_;
  cuda::Handoff handoff_{ctx_};
  // The q projections of attention_inputs that took attention_inputs_staged: an MLP op whose next
  // q/k/v start with one stages their input (a pointer reused by other weights only costs a
  // staging the next op does not read).
  std::unordered_set<const void*> staged_attention_;
  // A layer's output chain (rms_norm_mlp_residual with o) as learned from the op that wrote its
  // att: decode attention of that layer stages att for o where the chain would take o at its
  // rows, in a scratch as large as the chain asks for.
  struct OutputChain {
    const cuda::CudaLinear *o = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr;
    const cuda::CudaLinear* next[3] = {};
    size_t n_next = 0;
  };
  std::map<cuda::Handoff::Key, OutputChain> att_readers_;
  uint64_t learned_frees_ = 0;  // CudaContext::frees() when the two above were last known current
  // Drops what was learned about linears (staged_attention_, att_readers_) once a device buffer was
  // freed: an address may now name other weights, or none.
  void forget_if_freed() {
    if (ctx_.frees() == learned_frees_) return;
    staged_attention_.clear();
    att_readers_.clear();
    learned_frees_ = ctx_.frees();
  }
  static cuda::Handoff::Key key_of(const void* linear) { return {linear, -1}; }
  // What a step graph's launches depend on in a hand-off.
  void note_handoff(const cuda::Handoff::In& in, const cuda::Handoff::Out& out) {
    steps_.note(in.ok, in.x, in.up, in.norm_w, in.io.ssq, out.inv_perm, out.x, out.up, out.ssq);
  }
  // Weight bytes one pass over the set reads (for the profiler's bandwidth).
  static double set_bytes(std::span<const cuda::CudaLinear* const> ls) {
    double bytes = 0;
    for (const auto* l : ls) bytes += double(l->weight_bytes);
    return bytes;
  }
  // A fused linear launch once its op is noted: notes the handoff; then, unless the step is being
  // recorded, makes the context current, starts the profiler, sets io from the handoff (what the
  // launch reads, its inverse permutation and first output) and returns true.
  bool start_fused(const cuda::Handoff::In& hin, const cuda::Handoff::Out& hout, cuda::Exl2GemvHandoff& io) {
    note_handoff(hin, hout);
    if (steps_.recording()) return false;
    ctx_.make_current();
    prof_.begin(ctx_.stream());
    io = hin.io;
    io.inv_perm = hout.inv_perm;
    io.out_perm[0] = hout.x;
    return true;
  }
  cuda::CudaSampler sampler_{ctx_};
  std::vector<float> rope_freq_host_;
  Buffer rope_freq_;
  // EXL_CUDA_STAGED_INPUTS=0: norms and the MLP's sums do not write the tensor-core kernel's input
  // (a staging kernel per set instead, for comparisons).
  bool staged_inputs_ = !env_is("EXL_CUDA_STAGED_INPUTS", "0");
  // The most rows at which a layer's ops at tensor-core sizes hand on their staged inputs across
  // ops (attention → o, o → gate/up's norm, down → the next layer's norm, q/k/v sums → rope and
  // cache store); at more rows each op stages its own. 64 unless EXL_CUDA_LAYER_CHAINS says
  // otherwise (0: never): once the norms stage whole rows through shared memory the chains gained
  // 8% at b = 32–64 over stopping at 16 rows (H100, BENCHMARKS.md, session 37; before that they
  // lost 4–6% there, session 31).
  int64_t chain_rows_ = std::max<int64_t>(0, env_int("EXL_CUDA_LAYER_CHAINS", 64));
  bool chains(int64_t rows) const { return rows <= chain_rows_; }
  // EXL_CUDA_PREFILL_ATTN=0 keeps long prompts on the paged kernel (for comparisons).
  bool prefill_attn_disabled_ = env_is("EXL_CUDA_PREFILL_ATTN", "0");
  // EXL_CUDA_FLASH_ATTN=0 keeps long prompts on fp16 caches on the cuBLAS path (for comparisons).
  bool flash_attn_ = !env_is("EXL_CUDA_FLASH_ATTN", "0");
  // EXL_CUDA_PREFILL_ATTN_MIN=N: the cuBLAS path from N tokens per sequence (for comparisons).
  int64_t prefill_attn_min_tokens_ = [] {
    const int64_t v = env_int("EXL_CUDA_PREFILL_ATTN_MIN", 0);
    return v > 0 ? v : cuda::k_prefill_attn_min_tokens;
  }();
  // EXL_CUDA_ATTN_DECODE=0 keeps decode steps on the tiled paged kernel (for comparisons).
  bool attn_decode_disabled_ = env_is("EXL_CUDA_ATTN_DECODE", "0");
  // Thread block clusters for short decode contexts (paged_attention.h: k_attn_decode_cluster_part)
  // on sm_90 and later; EXL_CUDA_ATTN_CLUSTER=0 keeps one block per partition (for comparisons).
  bool attn_clusters_ = ctx_.compute_major() >= 9 && !env_is("EXL_CUDA_ATTN_CLUSTER", "0");
  // EXL_CUDA_ATTN_DECODE_MMA=0 keeps the streaming decode partitions of fp16 caches on the FMA
  // kernel (for comparisons).
  bool attn_decode_mma_ = !env_is("EXL_CUDA_ATTN_DECODE_MMA", "0");
  // EXL_CUDA_ATTN_PDL=0 launches the streaming decode partitions after the previous kernel has
  // finished instead of overlapped with it (for comparisons).
  bool attn_overlapped_ = !env_is("EXL_CUDA_ATTN_PDL", "0");
  // EXL_CUDA_ATTN_MIN_PART sets the tiled kernel's smallest partition (for comparisons).
  int attn_min_part_ = [] {
    const int v = int(env_int("EXL_CUDA_ATTN_MIN_PART", 0));
    return v > 0 ? v : cuda::k_attn_min_part;
  }();
  // EXL_CUDA_ATTN_DECODE_PART=128/256/512 fixes the decode partition size (for comparisons); 0: the plan's.
  int attn_decode_part_ = [] {
    const int v = int(env_int("EXL_CUDA_ATTN_DECODE_PART", 0));
    return cuda::attention_decode_part(v) ? v : 0;
  }();
  std::string name_;
};

// Packs an array into the int32 staging vector at a 16-byte aligned offset; returns the offset.
template <typename T>
size_t pack(std::vector<int32_t>& buf, const std::vector<T>& v) {
  static_assert(sizeof(T) % sizeof(int32_t) == 0);
  buf.resize((buf.size() + 3) / 4 * 4);
  const size_t off = buf.size();
  buf.resize(off + v.size() * sizeof(T) / sizeof(int32_t));
  if (!v.empty()) std::memcpy(buf.data() + off, v.data(), v.size() * sizeof(T));
  return off;
}

cuda::AttnArgs CudaBackend::plan_args(const CudaKvPool& p, const cuda::KvDeviceLayout& dl, const cuda::AttnPlan& plan,
                                      const int32_t* d_meta, size_t o_seqs, size_t o_pages, size_t o_works,
                                      const float* q, float* out, int n_heads, float scale, int window) {
  cuda::AttnArgs a;
  a.pool = static_cast<const uint8_t*>(p.mem.data());
  a.layout = dl;
  a.seqs = reinterpret_cast<const cuda::AttnSeqDesc*>(d_meta + o_seqs);
  a.pages = d_meta + o_pages;
  a.works = reinterpret_cast<const cuda::AttnWork*>(d_meta + o_works);
  a.n_works = int(plan.works.size());
  a.q = q;
  a.out = out;
  a.n_heads = n_heads;
  a.scale = scale;
  a.window = window;
  a.part_size = plan.part_size;
  a.direct = plan.direct;
  a.max_parts = plan.max_parts;
  if (!plan.direct) {
    const size_t n_part_rows = size_t(plan.n_tokens) * size_t(n_heads) * size_t(plan.max_parts);
    const int64_t need = int64_t(n_part_rows * (2 + size_t(dl.head_dim)) * 4);
    const size_t bytes = size_t(pow2_ceil(std::max<int64_t>(int64_t(1) << 20, need)));
    auto* base = static_cast<float*>(ctx_.scratch(cuda::Scratch::partials, bytes));
    a.part_max = base;
    a.part_sum = base + n_part_rows;
    a.part_acc = base + 2 * n_part_rows;
  }
  return a;
}

void CudaBackend::flash_attention(const CudaKvPool& p, const cuda::KvDeviceLayout& dl, const float* q, float* out,
                                  std::span<const SeqAttn> seqs, int n_heads, float scale, int sliding_window) {
  const KvLayout& L = p.layout;
  const cuda::AttnPlan plan =
      cuda::plan_attention(seqs, n_heads, L.n_kv_heads, L.page_size, p.num_pages, sliding_window,
                           2 * ctx_.sm_count(), cuda::k_flash_min_part, false, 0, 1, cuda::k_flash_rows);
  if (plan.works.empty()) return;
  std::vector<int32_t> meta;
  const size_t o_seqs = pack(meta, plan.seqs), o_pages = pack(meta, plan.pages), o_works = pack(meta, plan.works),
               o_pos = pack(meta, plan.token_pos);
  const auto* d_meta = static_cast<const int32_t*>(ctx_.stage(meta));
  const cuda::AttnArgs a = plan_args(p, dl, plan, d_meta, o_seqs, o_pages, o_works, q, out, n_heads, scale, sliding_window);
  prof_.begin(ctx_.stream());
  EXL_CUDA_CHECK(cuda::flash_attention(a, ctx_.stream()));
  if (!plan.direct) EXL_CUDA_CHECK(cuda::attention_combine(a, d_meta + o_pos, plan.n_tokens, ctx_.stream()));
  if (prof_.enabled()) prof_.end(ctx_.stream(), cat("attention prefill (flash) rows ", plan.n_tokens));
}

void CudaBackend::attention(const KvPool& pool, int layer, const float* q, float* out, std::span<const SeqAttn> seqs,
                            int n_heads, float scale, int sliding_window) {
  const auto& p = checked_pool(pool);
  const KvLayout& L = p.layout;
  EXL_CHECK(layer >= 0 && layer < L.n_layers, "kernels: cuda: attention: layer ", layer, " outside 0..",
            L.n_layers - 1);
  AttnStepPlan& st = attn_step_;
  if (std::any_of(seqs.begin(), seqs.end(), [](const SeqAttn& s) { return s.n_tokens > 1; })) steps_.mark_multi();
  const bool in_step = steps_.mode() != cuda::StepMode::eager;
  const bool reuse = in_step && st.valid && st.seqs == seqs.data() && st.n_seqs == seqs.size() && st.pool == &pool &&
                     st.n_heads == n_heads && st.window == sliding_window;
  if (!reuse) {
    st.valid = false;
    const bool decode_ok = !attn_decode_disabled_ && cuda::attention_decode_serves(device_layout(L, layer));
    st.plan = cuda::plan_attention(seqs, n_heads, L.n_kv_heads, L.page_size, p.num_pages, sliding_window,
                                   2 * ctx_.sm_count(), attn_min_part_, decode_ok, attn_decode_part_,
                                   cuda::k_attn_decode_max_positions);
  }
  const cuda::AttnPlan& plan = st.plan;
  if (plan.works.empty() && !plan.decode) return handoff_.other();
  ctx_.make_current();
  const bool long_prompts = std::all_of(seqs.begin(), seqs.end(), [&](const SeqAttn& s) {
    return cuda::prefill_attention_serves(s.n_tokens, s.pos_start + s.n_tokens, n_heads, L.head_dim,
                                          prefill_attn_min_tokens_);
  });
  // q8/q4 caches take the exact (split-fp16) variant: rounding q and P to fp16 would reach the next
  // layers' K/V and their quantization (Backend::linears_exact).
  const bool quantized = L.format == KvFormat::q8 || L.format == KvFormat::q4;
  if (long_prompts && !prefill_attn_disabled_) {
    handoff_.other();
    steps_.forbid_capture();
    if (steps_.recording()) return;
    const cuda::KvDeviceLayout dl = device_layout(L, layer);
    if (flash_attn_ && cuda::flash_attention_serves(dl))
      return flash_attention(p, dl, q, out, seqs, n_heads, scale, sliding_window);
    prof_.begin(ctx_.stream());
    for (const SeqAttn& s : seqs) {
      const int64_t n_pages = (s.pos_start + s.n_tokens + L.page_size - 1) / L.page_size;
      const auto* d_pages = ctx_.stage(s.page_table.data(), size_t(n_pages) * sizeof(int32_t));
      cuda::prefill_attention(ctx_, static_cast<const uint8_t*>(p.mem.data()), device_layout(L, layer), q, out,
                              n_heads, scale, sliding_window,
                              {s.token_begin, s.n_tokens, s.pos_start, static_cast<const int32_t*>(d_pages)},
                              quantized);
    }
    if (prof_.enabled())
      prof_.end(ctx_.stream(), cat(quantized ? "attention prefill (cuBLAS, exact) rows " : "attention prefill (cuBLAS) rows ",
                                   plan.n_tokens));
    return;
  }
  if (!reuse) {
    std::vector<int32_t> meta;
    st.o_seqs = pack(meta, plan.seqs), st.o_pages = pack(meta, plan.pages), st.o_works = pack(meta, plan.works),
    st.o_pos = pack(meta, plan.token_pos);
    st.d_meta = static_cast<const int32_t*>(ctx_.stage(meta));
    st.meta_size = meta.size();
    st.seqs = seqs.data(), st.n_seqs = seqs.size(), st.pool = &pool, st.n_heads = n_heads, st.window = sliding_window;
    st.valid = in_step;
  }
  const int32_t* d_meta = st.d_meta;

  cuda::AttnArgs a = plan_args(p, device_layout(L, layer), plan, d_meta, st.o_seqs, st.o_pages, st.o_works, q, out,
                               n_heads, scale, sliding_window);
  const cuda::Handoff::Out hout = handoff_.produce({&pool, layer}, out, nullptr, int64_t(n_heads) * L.head_dim,
                                                   plan.n_tokens, plan.decode);
  a.out_perm = hout.x;
  a.out_inv_perm = hout.inv_perm;
  // The o projection's staged input, where the layer's output chain (learned) reads it.
  const cuda::CudaLinear* stage_o = nullptr;
  size_t stage_bytes = 0;
  forget_if_freed();
  if (const auto it = att_readers_.find({&pool, layer}); plan.decode && staged_inputs_ && chains(plan.n_tokens) &&
                                                           it != att_readers_.end()) {
    const OutputChain& c = it->second;
    const cuda::CudaLinear* os[1] = {c.o};
    if (!hout.x && c.o->in_features == int64_t(n_heads) * L.head_dim && cuda::mma_serves(os, plan.n_tokens)) {
      stage_o = c.o;
      stage_bytes = cuda::layer_output_staged_bytes({c.o, out, c.gate, c.up, c.down, nullptr, nullptr, 0.0f, nullptr,
                                                     nullptr, plan.n_tokens, std::span(c.next, c.n_next)});
      const void* reader[1] = {stage_o};
      handoff_.produce_staged({&pool, layer}, out, nullptr, reader, plan.n_tokens, stage_bytes);
    }
  }
  // Clusters while the grid stays small (b = 8 at 128 positions lost 2.6% with them, H200).
  a.cluster = attn_clusters_ && int64_t(L.n_kv_heads) * int64_t(plan.seqs.size()) *
                                        (plan.part_size / cuda::k_attn_decode_cluster_part) <=
                                    2 * int64_t(ctx_.sm_count());
  a.mma = attn_decode_mma_;
  a.overlapped = attn_overlapped_ && ctx_.overlapped_launches();
  note_handoff({}, hout);
  steps_.note(StepOp::attention, a.pool, layer, d_meta, st.meta_size, st.o_seqs, st.o_pages, st.o_works, st.o_pos,
              a.n_works, q, out, n_heads, scale, sliding_window, a.part_size, a.direct, a.max_parts, plan.n_tokens,
              a.part_max, plan.decode, a.cluster, stage_o, stage_bytes);
  if (steps_.recording()) return;
  if (stage_o) {
    const cuda::Exl2MmaStaging st = cuda::mma_staging_of(ctx_, *stage_o, plan.n_tokens, stage_bytes);
    a.stage = st.staged, a.stage_at = st.at[0], a.stage_rows = st.rows;
  }
  prof_.begin(ctx_.stream());
  if (plan.decode)
    EXL_CUDA_CHECK(cuda::attention_decode(a, int(plan.seqs.size()), ctx_.stream()));
  else
    EXL_CUDA_CHECK(cuda::attention(a, ctx_.stream()));
  if (!plan.direct) EXL_CUDA_CHECK(cuda::attention_combine(a, d_meta + st.o_pos, plan.n_tokens, ctx_.stream()));
  if (prof_.enabled())
    prof_.end(ctx_.stream(), cat("attention ", plan.n_tokens == int(seqs.size()) ? "decode" : "prefill", " (with staging) rows ",
                                 plan.n_tokens));
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

double cuda_copy_bandwidth(int device, size_t bytes) {
  CudaContext ctx(device);
  Buffer a = ctx.alloc(bytes), b = ctx.alloc(bytes);
  EXL_CUDA_CHECK(cudaMemsetAsync(a.data(), 0x5a, bytes, ctx.stream()));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  EXL_CUDA_CHECK(cudaEventCreate(&e0));
  EXL_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    EXL_CUDA_CHECK(cudaEventRecord(e0, ctx.stream()));
    EXL_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, ctx.stream()));
    EXL_CUDA_CHECK(cudaEventRecord(e1, ctx.stream()));
    EXL_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    EXL_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e-3);
}

CudaStepStats cuda_step_stats(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  EXL_CHECK(b != nullptr, "kernels: cuda: step stats: backend '", backend.name(), "' is not a CUDA backend");
  return b->step_stats();
}

void* cuda_kv_pool_data(KvPool& pool) {
  auto* p = dynamic_cast<CudaKvPool*>(&pool);
  EXL_CHECK(p != nullptr, "kernels: cuda: kv pool was not made by a CUDA backend");
  return p->mem.data();
}

}  // namespace exl
