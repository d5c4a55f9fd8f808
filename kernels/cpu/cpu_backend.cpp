// The CPU backend: host memory, fp32 activations, quantized weights decoded on the fly.
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/error.h"

namespace exl {

namespace {

// Host copies of weight bytes that the prepared weights point into; shared where two prepared
// weights read the same bytes (a tied embedding and head).
using HostCopies = std::vector<std::shared_ptr<const Buffer>>;

struct CpuLinear : PreparedLinear {
  LinearWeights w;  // raw pointers into `owned`
  HostCopies owned;
};
struct CpuEmbedding : PreparedEmbedding {
  EmbeddingWeights e;  // data points into `owned`
  HostCopies owned;
};
struct CpuKvPool : KvPool {
  Buffer mem;
  std::byte* data() const { return static_cast<std::byte*>(mem.data()); }
};

Buffer host_alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  EXL_CHECK(p != nullptr, "kernels: cpu: cannot allocate ", bytes, " bytes");
  return Buffer(p, bytes, [](void* q) { std::free(q); });
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : tp_(n_threads) {}

  std::string name() const override { return cat("cpu (", tp_.size(), " threads)"); }
  // The host samples the downloaded logits itself.
  BackendCapabilities capabilities() const override { return {}; }
  Buffer alloc(size_t bytes) override { return host_alloc(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  // The weights are copied into host memory this backend owns, so that a forward pass never reads
  // the caller's memory (a model file's mapping, which a truncated file turns into SIGBUS).
  std::unique_ptr<PreparedLinear> prepare_linear(const LinearWeights& w) override {
    auto p = std::make_unique<CpuLinear>();
    p->w = w;
    if (auto* m = std::get_if<Exl2Matrix>(&p->w)) {
      const size_t G = m->groups.size(), Np = size_t(m->padded_out);
      m->q_weight = own(p->owned, m->q_weight, size_t(m->q_rows) * Np);
      m->q_scale = own(p->owned, m->q_scale, G * (Np / 8));
      m->q_scale_max = own(p->owned, m->q_scale_max, G);
    } else if (auto* g = std::get_if<GptqMatrix>(&p->w)) {
      const size_t K = size_t(g->in_features), N = size_t(g->out_features), G = size_t(g->num_groups);
      g->qweight = own(p->owned, g->qweight, K / 8 * N);
      g->qzeros = own(p->owned, g->qzeros, G * (N / 8));
      g->scales = own(p->owned, g->scales, G * N);
    } else {
      auto& d = std::get<DenseMatrix>(p->w);
      d.data = own_bytes(p->owned, d.data, size_t(d.in_features * d.out_features) * dtype_size(d.dtype));
    }
    p->in_features = in_features(w);
    p->out_features = out_features(w);
    return p;
  }
  std::unique_ptr<PreparedEmbedding> prepare_embedding(const EmbeddingWeights& e) override {
    auto p = std::make_unique<CpuEmbedding>();
    p->e = e;
    p->e.data = own_bytes(p->owned, e.data, size_t(e.vocab * e.dim) * dtype_size(e.dtype));
    p->vocab = e.vocab;
    p->dim = e.dim;
    return p;
  }
  std::unique_ptr<KvPool> alloc_kv_pool(const KvLayout& layout, int num_pages) override {
    auto p = std::make_unique<CpuKvPool>();
    p->layout = layout;
    p->num_pages = num_pages;
    p->mem = host_alloc(layout.page_bytes() * size_t(num_pages));
    std::memset(p->mem.data(), 0, p->mem.bytes());
    return p;
  }

  void embedding(const PreparedEmbedding& e, std::span<const int32_t> ids, float* out) override {
    cpu::embedding(static_cast<const CpuEmbedding&>(e).e, ids, out);
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) override {
    cpu::rms_norm(tp_, x, w, y, rows, dim, eps);
  }
  void linear(const PreparedLinear& w, const float* x, float* y, int64_t rows) override {
    cpu::linear(tp_, static_cast<const CpuLinear&>(w).w, x, y, rows);
  }
  void rope(float* x, int64_t rows, int n_heads, int head_dim, std::span<const int32_t> positions,
            const RopeTable& table) override {
    cpu::rope(x, rows, n_heads, head_dim, positions, table);
  }
  void swiglu(const float* gate, const float* up, float* out, int64_t n) override { cpu::swiglu(gate, up, out, n); }
  void add(float* x, const float* y, int64_t n) override { cpu::add(x, y, n); }
  void kv_write(KvPool& pool, int layer, const float* k, const float* v, std::span<const int32_t> slots) override {
    auto& p = static_cast<CpuKvPool&>(pool);
    cpu::kv_write(p.layout, p.data(), layer, k, v, slots);
  }
  void kv_copy(KvPool& pool, int from, int to, int n_rows) override {
    auto& p = static_cast<CpuKvPool&>(pool);
    cpu::kv_copy_rows(p.layout, p.data(), from, to, n_rows);
  }
  void attention(const KvPool& pool, int layer, const float* q, float* out, std::span<const SeqAttn> seqs,
                 int n_heads, float scale, int sliding_window) override {
    const auto& p = static_cast<const CpuKvPool&>(pool);
    cpu::attention(tp_, p.layout, p.data(), layer, q, out, seqs, n_heads, scale, sliding_window);
  }

 private:
  // A host copy of src[0, bytes), appended to `into`; the copy of identical bytes at the same
  // address is shared (the memcmp guards against a different buffer reusing a freed address).
  const void* own_bytes(HostCopies& into, const void* src, size_t bytes) {
    if (src == nullptr || bytes == 0) return src;
    auto& slot = copies_[{src, bytes}];
    std::shared_ptr<const Buffer> copy = slot.lock();
    if (!copy || std::memcmp(copy->data(), src, bytes) != 0) {
      auto fresh = std::make_shared<Buffer>(host_alloc(bytes));
      std::memcpy(fresh->data(), src, bytes);
      copy = fresh;
      slot = copy;
    }
    into.push_back(copy);
    return copy->data();
  }
  template <typename T>
  const T* own(HostCopies& into, const T* src, size_t count) {
    return static_cast<const T*>(own_bytes(into, src, count * sizeof(T)));
  }

  ThreadPool tp_;
  std::map<std::pair<const void*, size_t>, std::weak_ptr<const Buffer>> copies_;  // by source range
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace exl
