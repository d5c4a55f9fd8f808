// The CPU backend: host memory, fp32 activations, quantized weights decoded on the fly.
#include <cstdlib>
#include <cstring>

#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/error.h"

namespace exl {

namespace {

struct CpuLinear : PreparedLinear {
  LinearWeights w;
};
struct CpuEmbedding : PreparedEmbedding {
  EmbeddingWeights e;
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

  std::unique_ptr<PreparedLinear> prepare_linear(const LinearWeights& w) override {
    auto p = std::make_unique<CpuLinear>();
    p->w = w;
    p->in_features = in_features(w);
    p->out_features = out_features(w);
    return p;
  }
  std::unique_ptr<PreparedEmbedding> prepare_embedding(const EmbeddingWeights& e) override {
    auto p = std::make_unique<CpuEmbedding>();
    p->e = e;
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
  ThreadPool tp_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace exl
