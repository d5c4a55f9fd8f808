// A Backend that forwards every op to a CPU backend, for tests that change one or two ops (inject a
// fault, sample "on the device"): a subclass overrides what it changes and calls cpu() for the rest.
// Thread-safety: that of the CPU backend.
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace exl::test {

class CpuForwardingBackend : public Backend {
 public:
  explicit CpuForwardingBackend(int threads) : be_(make_cpu_backend(threads)) {}

  std::string name() const override { return be_->name(); }
  Buffer alloc(size_t bytes) override { return be_->alloc(bytes); }
  void upload(void* d, const void* s, size_t n) override { be_->upload(d, s, n); }
  void download(void* d, const void* s, size_t n) override { be_->download(d, s, n); }
  void synchronize() override { be_->synchronize(); }
  std::unique_ptr<PreparedLinear> prepare_linear(const LinearWeights& w) override { return be_->prepare_linear(w); }
  std::unique_ptr<PreparedEmbedding> prepare_embedding(const EmbeddingWeights& e) override {
    return be_->prepare_embedding(e);
  }
  std::unique_ptr<KvPool> alloc_kv_pool(const KvLayout& l, int n) override { return be_->alloc_kv_pool(l, n); }
  void embedding(const PreparedEmbedding& e, std::span<const int32_t> ids, float* out) override {
    be_->embedding(e, ids, out);
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t r, int64_t d, float eps) override {
    be_->rms_norm(x, w, y, r, d, eps);
  }
  void linear(const PreparedLinear& w, const float* x, float* y, int64_t rows) override { be_->linear(w, x, y, rows); }
  void rope(float* x, int64_t rows, int nh, int hd, std::span<const int32_t> pos, const RopeTable& t) override {
    be_->rope(x, rows, nh, hd, pos, t);
  }
  void swiglu(const float* g, const float* u, float* o, int64_t n) override { be_->swiglu(g, u, o, n); }
  void add(float* x, const float* y, int64_t n) override { be_->add(x, y, n); }
  void add_rms_norm(float* x, const float* y, const float* w, float* o, int64_t r, int64_t d, float eps) override {
    be_->add_rms_norm(x, y, w, o, r, d, eps);
  }
  void linears(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
               int64_t rows) override {
    be_->linears(ws, x, ys, rows);
  }
  void rope_qk(float* q, float* k, int64_t rows, int nh, int nkv, int hd, std::span<const int32_t> pos,
               const RopeTable& t) override {
    be_->rope_qk(q, k, rows, nh, nkv, hd, pos, t);
  }
  void kv_write(KvPool& p, int layer, const float* k, const float* v, std::span<const int32_t> slots) override {
    be_->kv_write(p, layer, k, v, slots);
  }
  void kv_copy(KvPool& p, int from, int to, int n) override { be_->kv_copy(p, from, to, n); }
  void attention(const KvPool& p, int layer, const float* q, float* out, std::span<const SeqAttn> seqs, int nh,
                 float scale, int window) override {
    be_->attention(p, layer, q, out, seqs, nh, scale, window);
  }

 protected:
  Backend& cpu() { return *be_; }
  const Backend& cpu() const { return *be_; }

 private:
  std::unique_ptr<Backend> be_;
};

}  // namespace exl::test
