// The op set a transformer step needs, behind one interface implemented by the CPU backend
// (kernels/cpu/) and the CUDA backend (kernels/cuda/). A Backend is owned and called by one thread
// (the engine thread). Conventions for every op:
//   - float tensors are row-major fp32 in backend memory (from alloc()); shapes in comments;
//   - integer metadata (token ids, positions, cache slots, page tables) are host memory;
//   - ops are asynchronous on backends that can be; download() and synchronize() wait.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/error.h"
#include "kernels/kv_layout.h"
#include "kernels/linear_weights.h"
#include "kernels/row_sampling.h"

namespace exl {

// RAII allocation of backend memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* p, size_t bytes, std::function<void(void*)> free_fn)
      : p_(p), bytes_(bytes), free_(std::move(free_fn)) {}
  Buffer(Buffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), free_(std::move(o.free_)) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      bytes_ = o.bytes_;
      free_ = std::move(o.free_);
      o.p_ = nullptr;
    }
    return *this;
  }
  ~Buffer() { reset(); }
  void reset() {
    if (p_ && free_) free_(p_);
    p_ = nullptr;
  }
  void* data() const { return p_; }
  float* f32() const { return static_cast<float*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> free_;
};

// A linear layer's weights in the backend's preferred in-memory form.
class PreparedLinear {
 public:
  virtual ~PreparedLinear() = default;
  int64_t in_features = 0, out_features = 0;
};

// Token embedding table [vocab, dim] as stored on disk (f16, bf16 or f32).
struct EmbeddingWeights {
  int64_t vocab = 0, dim = 0;
  DType dtype = DType::f16;
  const void* data = nullptr;
};
class PreparedEmbedding {
 public:
  virtual ~PreparedEmbedding() = default;
  int64_t vocab = 0, dim = 0;
};

// Paged K/V storage of `num_pages` pages in KvLayout's format.
class KvPool {
 public:
  virtual ~KvPool() = default;
  KvLayout layout;
  int num_pages = 0;
};

// Rotary embedding: angle(pos, i) = pos · inv_freq[i] for i < head_dim/2; cos and sin are
// multiplied by attn_factor (yarn). Pairs are (i, i + head_dim/2) ("rotate_half", HF layout).
struct RopeTable {
  std::vector<float> inv_freq;  // [head_dim / 2]
  float attn_factor = 1.0f;
};

// One sequence of an attention batch: its new tokens are rows [token_begin, token_begin+n_tokens)
// of q, at positions pos_start.. ; they attend causally to positions [0, pos]. The cache holds
// positions [0, pos_start + n_tokens) through `page_table` (page ids, page_size slots each).
struct SeqAttn {
  int64_t token_begin = 0;
  int64_t n_tokens = 0;
  int64_t pos_start = 0;
  std::span<const int32_t> page_table;
};

// Memory of the device a backend allocates from, in bytes, when it was asked.
struct DeviceMemory {
  int device = 0;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

// The operands of Backend::attention_inputs: x [rows, dim], xn [rows, dim] scratch, the q/k/v
// projections (in that order) with outputs q [rows, n_heads·head_dim], k and v [rows,
// n_kv_heads·head_dim]; positions and slots [rows] host memory, as for rope_qk_kv_write.
struct AttnInputs {
  std::span<const PreparedLinear* const> qkv;
  const float* x = nullptr;
  const float* norm_w = nullptr;
  float* xn = nullptr;
  float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t rows = 0, dim = 0;
  float eps = 0.0f;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  std::span<const int32_t> positions;
  const RopeTable* rope = nullptr;
  KvPool* pool = nullptr;
  int layer = 0;
  std::span<const int32_t> slots;
  bool exact = false;  // the projections as linears_exact (a q8/q4 cache)
};

// The operands of Backend::rms_norm_mlp_residual, a layer's MLP block: x [rows, dim] (the residual
// stream, added to), the gate/up projections (dim → k) and down (k → dim); xn [rows, dim], g and u
// [rows, k] and tmp [rows, dim] are scratch.
// o (optional): the attention output projection, run first as linear_residual(o, att, x, tmp).
// next_qkv, next_norm_w (optional): a promise that the next op on this backend is attention_inputs
// on x with these q/k/v projections, norm weights and eps, at the same rows, and that nothing
// writes x in between, so that a backend may prepare that op's input while it ends this one.
struct MlpInputs {
  const PreparedLinear* gate = nullptr;
  const PreparedLinear* up = nullptr;
  const PreparedLinear* down = nullptr;
  float* x = nullptr;
  const float* norm_w = nullptr;
  float* xn = nullptr;
  float *g = nullptr, *u = nullptr, *tmp = nullptr;
  int64_t rows = 0, dim = 0, k = 0;
  float eps = 0.0f;
  bool exact = false;  // the projections as linears_exact (a q8/q4 cache)
  const PreparedLinear* o = nullptr;
  const float* att = nullptr;  // o's input [rows, o.in_features]
  std::span<const PreparedLinear* const> next_qkv{};
  const float* next_norm_w = nullptr;
};

// What a backend can do beyond the op set every backend implements. It depends only on the
// backend, never on inputs or state, so a caller asks once.
struct BackendCapabilities {
  bool sample_rows = false;           // sample_rows() samples (else it returns false, doing nothing)
  bool sample_rows_deferred = false;  // sample_rows_deferred(), collect_samples(), embedding_of_samples()
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The default: nothing beyond the op set.
  virtual BackendCapabilities capabilities() const { return {}; }

  virtual Buffer alloc(size_t bytes) = 0;
  virtual void upload(void* dst, const void* src_host, size_t bytes) = 0;
  virtual void download(void* dst_host, const void* src, size_t bytes) = 0;
  virtual void synchronize() {}
  // Copies `bytes` at `src` (this backend's memory) to `dst` in `to`'s memory (a model split over
  // devices hands its residual stream over this way), after this backend's queued ops and before
  // `to`'s later ones. Returns false, doing nothing, when it cannot (the default): the caller then
  // goes through host memory (download, upload). A CUDA peer copy can implement it.
  virtual bool copy_to(Backend& /*to*/, void* /*dst*/, const void* /*src*/, size_t /*bytes*/) { return false; }
  // Makes the calling thread's ops go to this backend's device: a thread that drives several
  // backends (a model split over devices) calls it before each one's ops. No-op by default.
  virtual void make_current() {}
  // Free and total memory of the backend's device now (engine/memory_plan.h plans against it);
  // nullopt for backends that allocate host memory (CPU).
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }

  // The weights in backend memory: the result never reads the memory `w` and `e` point into once
  // these return (a model file's mapping may change or vanish after loading).
  virtual std::unique_ptr<PreparedLinear> prepare_linear(const LinearWeights& w) = 0;
  virtual std::unique_ptr<PreparedEmbedding> prepare_embedding(const EmbeddingWeights& e) = 0;
  virtual std::unique_ptr<KvPool> alloc_kv_pool(const KvLayout& layout, int num_pages) = 0;

  // out[n, dim] = table[ids[n]]; ids are host memory and < vocab.
  virtual void embedding(const PreparedEmbedding& e, std::span<const int32_t> ids, float* out) = 0;
  // y[rows, dim] = x / sqrt(mean(x²) + eps) ⊙ w[dim]   (x and y may alias)
  virtual void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) = 0;
  // y[rows, N] = x[rows, K] · Wᵀ (+ bias)
  virtual void linear(const PreparedLinear& w, const float* x, float* y, int64_t rows) = 0;
  // In place on x[rows, n_heads·head_dim]; positions[rows] host memory.
  virtual void rope(float* x, int64_t rows, int n_heads, int head_dim, std::span<const int32_t> positions,
                    const RopeTable& table) = 0;
  // out[n] = silu(gate[n]) · up[n]
  virtual void swiglu(const float* gate, const float* up, float* out, int64_t n) = 0;
  // x[n] += y[n]
  virtual void add(float* x, const float* y, int64_t n) = 0;
  // Fusions of the ops above that a backend may run as one op (the defaults call the ops):
  // x[rows, dim] += y; out = rms_norm(x) ⊙ w   (the residual add and the next layer's norm)
  virtual void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t dim,
                            float eps) {
    add(x, y, rows * dim);
    rms_norm(x, w, out, rows, dim, eps);
  }
  // ys[i][rows, N_i] = x · W_iᵀ for linears that read the same x (q/k/v, gate/up).
  virtual void linears(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
                       int64_t rows) {
    for (size_t i = 0; i < ws.size() && i < ys.size(); ++i) linear(*ws[i], x, ys[i], rows);
  }
  // The fused ops below take `exact`: their projections then compute what linears_exact would
  // (a backend fuses only where its fused kernel computes exactly that).
  // y[rows, N] = (silu(gate) ⊙ up)[rows, K] · Wᵀ (the MLP's down projection); gate may be
  // overwritten.
  virtual void swiglu_linear(const PreparedLinear& w, float* gate, const float* up, float* y, int64_t rows,
                             int64_t k, bool exact) {
    swiglu(gate, up, gate, rows * k);
    if (exact) linear_exact(w, gate, y, rows);
    else linear(w, gate, y, rows);
  }
  // ys[i] = (rms_norm(x) ⊙ norm_w) · W_iᵀ for x [rows, dim] (a layer's norm and the linears that
  // read it); xn [rows, dim] is scratch that may receive the normalized rows.
  virtual void rms_norm_linears(std::span<const PreparedLinear* const> ws, const float* x, const float* norm_w,
                                float* xn, std::span<float* const> ys, int64_t rows, int64_t dim, float eps,
                                bool exact) {
    rms_norm(x, norm_w, xn, rows, dim, eps);
    if (exact) linears_exact(ws, xn, ys, rows);
    else linears(ws, xn, ys, rows);
  }
  // x[rows, N] += in · Wᵀ (a projection into the residual stream); tmp [rows, N] is scratch.
  virtual void linear_residual(const PreparedLinear& w, const float* in, float* x, float* tmp, int64_t rows,
                               bool exact) {
    if (exact) linear_exact(w, in, tmp, rows);
    else linear(w, in, tmp, rows);
    add(x, tmp, rows * w.out_features);
  }
  // x[rows, N] += (silu(gate) ⊙ up) · Wᵀ; gate may be overwritten; tmp [rows, N] is scratch.
  virtual void swiglu_linear_residual(const PreparedLinear& w, float* gate, const float* up, float* x, float* tmp,
                                      int64_t rows, int64_t k, bool exact) {
    swiglu_linear(w, gate, up, tmp, rows, k, exact);
    add(x, tmp, rows * w.out_features);
  }
  // One layer's attention inputs: q, k, v = (rms_norm(x) ⊙ norm_w) · W_{q,k,v}ᵀ, then
  // rope_qk_kv_write (q and k rotated, k and v stored at `slots`). See AttnInputs.
  virtual void attention_inputs(const AttnInputs& a) {
    float* outs[3] = {a.q, a.k, a.v};
    rms_norm_linears(a.qkv, a.x, a.norm_w, a.xn, outs, a.rows, a.dim, a.eps, a.exact);
    rope_qk_kv_write(a.q, a.k, a.v, a.rows, a.n_heads, a.n_kv_heads, a.head_dim, a.positions, *a.rope, *a.pool,
                     a.layer, a.slots);
  }
  // x += (silu(g) ⊙ u) · W_downᵀ with g, u = (rms_norm(x) ⊙ norm_w) · W_{gate,up}ᵀ, after x += att ·
  // W_oᵀ with o. See MlpInputs.
  virtual void rms_norm_mlp_residual(const MlpInputs& m) {
    if (m.o) linear_residual(*m.o, m.att, m.x, m.tmp, m.rows, m.exact);
    const PreparedLinear* gate_up[2] = {m.gate, m.up};
    float* gate_up_out[2] = {m.g, m.u};
    rms_norm_linears(gate_up, m.x, m.norm_w, m.xn, gate_up_out, m.rows, m.dim, m.eps, m.exact);
    swiglu_linear_residual(*m.down, m.g, m.u, m.x, m.tmp, m.rows, m.k, m.exact);
  }
  // linears() at fp32-level precision for every batch size: no rounding of x or W to 16-bit floats
  // (a backend's large-batch tensor-core path may round to ~1e-3 relative). For forwards whose K/V
  // a q8/q4 cache quantizes: rounding differences move values across the format's steps, and on
  // random-weight models that grows to percent-level logit differences, so every linear feeding
  // the cache (the whole layer stack, through the next layers' inputs) asks for this. Backends that
  // are fp32 throughout keep the default.
  virtual void linears_exact(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
                             int64_t rows) {
    linears(ws, x, ys, rows);
  }
  void linear_exact(const PreparedLinear& w, const float* x, float* y, int64_t rows) {
    const PreparedLinear* ws[1] = {&w};
    float* ys[1] = {y};
    linears_exact(ws, x, ys, rows);
  }
  // rope() of q [rows, n_heads·head_dim] and of k [rows, n_kv_heads·head_dim] at the same positions.
  virtual void rope_qk(float* q, float* k, int64_t rows, int n_heads, int n_kv_heads, int head_dim,
                       std::span<const int32_t> positions, const RopeTable& table) {
    rope(q, rows, n_heads, head_dim, positions, table);
    rope(k, rows, n_kv_heads, head_dim, positions, table);
  }
  // rope_qk(), then kv_write() of the rotated k and of v.
  virtual void rope_qk_kv_write(float* q, float* k, const float* v, int64_t rows, int n_heads, int n_kv_heads,
                                int head_dim, std::span<const int32_t> positions, const RopeTable& table, KvPool& pool,
                                int layer, std::span<const int32_t> slots) {
    rope_qk(q, k, rows, n_heads, n_kv_heads, head_dim, positions, table);
    kv_write(pool, layer, k, v, slots);
  }
  // Stores k, v [n_tokens, kv_heads·head_dim] of `layer` into cache slots (page·page_size + offset).
  virtual void kv_write(KvPool& pool, int layer, const float* k, const float* v, std::span<const int32_t> slots) = 0;
  // Copies token slots [0, n_rows) of page `from` into page `to` (copy on write of a shared page).
  virtual void kv_copy(KvPool& pool, int from, int to, int n_rows) = 0;
  // out[T, n_heads·head_dim] = softmax(q·Kᵀ·scale) V per sequence, causal, reading K/V of `layer` from the
  // pool. Query head h uses kv head h / (n_heads / kv_heads). sliding_window > 0 limits each token to
  // the last `sliding_window` positions.
  virtual void attention(const KvPool& pool, int layer, const float* q, float* out, std::span<const SeqAttn> seqs,
                         int n_heads, float scale, int sliding_window) = 0;

  // Samples one token per entry of `rows` from logits [*, vocab] (backend memory) into out[i]
  // (host memory, rows.size() entries): a token id, or k_sample_nothing_allowed /
  // k_sample_bad_logit (kernels/row_sampling.h). Waits for the result. Returns false, doing
  // nothing, when the backend cannot sample (the default: the caller downloads the logits and
  // samples on the host); capabilities().sample_rows says beforehand. Not inside
  // begin_step()/end_step().
  virtual bool sample_rows(const float* /*logits*/, int64_t /*vocab*/, std::span<const RowSampling> /*rows*/,
                           std::span<int32_t> /*out*/) {
    return false;
  }

  // Pipelined decoding: the next step is queued before the host has read this step's tokens.
  // sample_rows_deferred() is sample_rows() without the wait: the ids stay in backend memory,
  // where embedding_of_samples() reads them, until collect_samples() waits for them and copies
  // them to out (rows.size() entries; each deferred sampling is collected before the next one).
  // Returns false, doing nothing, when the backend cannot (the default;
  // capabilities().sample_rows_deferred says beforehand).
  virtual bool sample_rows_deferred(const float* /*logits*/, int64_t /*vocab*/,
                                    std::span<const RowSampling> /*rows*/) {
    return false;
  }
  virtual void collect_samples(std::span<int32_t> /*out*/) {}
  // embedding() of the ids of the last deferred sampling (its first n entries, in entry order),
  // read where the sampling left them when the op runs. An entry that is not a token id (the
  // k_sample_* codes) embeds as zeros: that step's result is to be discarded.
  virtual void embedding_of_samples(const PreparedEmbedding& /*e*/, int64_t /*n*/, float* /*out*/) {
    fail("kernels: ", name(), ": embedding_of_samples: no deferred sampling on this backend");
  }

  // Step bracketing, for backends that can replay a recorded step instead of issuing every op
  // (the CUDA backend's graphs). The caller runs one step as
  //   do { begin_step(); <the step's ops>; } while (!end_step());
  // issuing the same ops again whenever end_step() returns false (their work was not queued).
  // Between begin_step() and end_step(): only ops (no alloc, upload, download or synchronize), and
  // the host arrays passed to them (ids, positions, slots, page tables) do not change. After an
  // exception inside a step the caller calls cancel_step(). Backends without replay keep these
  // no-ops: every op runs when called and end_step() returns true.
  virtual void begin_step() {}
  virtual bool end_step() { return true; }
  virtual void cancel_step() noexcept {}
  // While on, a backend that replays steps records a step of several positions per sequence the
  // first time it sees its shape, not when the shape comes back (Generator::warm_up runs each
  // shape once). No-op by default.
  virtual void record_steps_at_once(bool /*on*/) {}
};

// The CPU backend (always available). n_threads <= 0 uses all hardware threads.
std::unique_ptr<Backend> make_cpu_backend(int n_threads = 0);

}  // namespace exl
