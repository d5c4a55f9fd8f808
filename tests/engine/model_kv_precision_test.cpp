// Model::forward runs every linear through Backend::linears_exact exactly when the cache quantizes
// K/V (q8, q4), in every layer, the head and every batch size, and never for fp16/f32 caches (which
// keep linear/linears); the choice does not change what the CPU backend computes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "test_support.h"

namespace exl {
namespace model_kv_precision_test {

// The CPU backend, recording the output widths of every linear, linears and linears_exact call.
class LinearRecorder final : public Backend {
 public:
  std::vector<std::vector<int64_t>> plain, exact;  // one entry per call

  std::string name() const override { return "linear recorder"; }
  Buffer alloc(size_t bytes) override { return cpu_->alloc(bytes); }
  void upload(void* d, const void* s, size_t n) override { cpu_->upload(d, s, n); }
  void download(void* d, const void* s, size_t n) override { cpu_->download(d, s, n); }
  std::unique_ptr<PreparedLinear> prepare_linear(const LinearWeights& w) override { return cpu_->prepare_linear(w); }
  std::unique_ptr<PreparedEmbedding> prepare_embedding(const EmbeddingWeights& e) override {
    return cpu_->prepare_embedding(e);
  }
  std::unique_ptr<KvPool> alloc_kv_pool(const KvLayout& l, int n) override { return cpu_->alloc_kv_pool(l, n); }
  void embedding(const PreparedEmbedding& e, std::span<const int32_t> ids, float* out) override {
    cpu_->embedding(e, ids, out);
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps) override {
    cpu_->rms_norm(x, w, y, rows, dim, eps);
  }
  void linear(const PreparedLinear& w, const float* x, float* y, int64_t rows) override {
    plain.push_back({w.out_features});
    cpu_->linear(w, x, y, rows);
  }
  void linears(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
               int64_t rows) override {
    plain.push_back(widths(ws));
    cpu_->linears(ws, x, ys, rows);
  }
  void linears_exact(std::span<const PreparedLinear* const> ws, const float* x, std::span<float* const> ys,
                     int64_t rows) override {
    exact.push_back(widths(ws));
    cpu_->linears_exact(ws, x, ys, rows);
  }
  void rope(float* x, int64_t rows, int n_heads, int head_dim, std::span<const int32_t> positions,
            const RopeTable& table) override {
    cpu_->rope(x, rows, n_heads, head_dim, positions, table);
  }
  void swiglu(const float* g, const float* u, float* out, int64_t n) override { cpu_->swiglu(g, u, out, n); }
  void add(float* x, const float* y, int64_t n) override { cpu_->add(x, y, n); }
  void kv_write(KvPool& pool, int layer, const float* k, const float* v, std::span<const int32_t> slots) override {
    cpu_->kv_write(pool, layer, k, v, slots);
  }
  void kv_copy(KvPool& pool, int from, int to, int n_rows) override { cpu_->kv_copy(pool, from, to, n_rows); }
  void attention(const KvPool& pool, int layer, const float* q, float* out, std::span<const SeqAttn> seqs,
                 int n_heads, float scale, int sliding_window) override {
    cpu_->attention(pool, layer, q, out, seqs, n_heads, scale, sliding_window);
  }

 private:
  static std::vector<int64_t> widths(std::span<const PreparedLinear* const> ws) {
    std::vector<int64_t> n;
    for (const auto* w : ws) n.push_back(w->out_features);
    return n;
  }
  std::unique_ptr<Backend> cpu_ = make_cpu_backend(2);
};

std::vector<float> forward_all(Model& m, Backend& be, std::span<const int32_t> ids, KvFormat fmt) {
  auto pool = be.alloc_kv_pool(m.kv_layout(fmt, 16), 8);
  const std::vector<int32_t> table = {3, 0, 5, 1, 7, 2, 6, 4};
  ForwardSeq s{ids, 0, table, true};
  return m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
}

TEST(ModelKvPrecision, EveryLinearIsExactExactlyForQuantizedCaches) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  const auto ids = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"))["input_ids"]
                       .get<std::vector<int32_t>>();
  ModelDir dir(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  const ModelConfig& c = dir.config();
  const int64_t QD = c.num_heads * c.head_dim, KVD = c.num_kv_heads * c.head_dim;
  std::vector<std::vector<int64_t>> per_layer = {
      {QD, KVD, KVD}, {c.hidden_size}, {c.intermediate_size, c.intermediate_size}, {c.hidden_size}};
  std::vector<std::vector<int64_t>> all;
  for (int64_t l = 0; l < c.num_layers; ++l) all.insert(all.end(), per_layer.begin(), per_layer.end());
  all.push_back({c.vocab_size});
  LinearRecorder rec;
  auto cpu = make_cpu_backend(2);
  Model mr(dir, rec), mc(dir, *cpu);
  for (KvFormat fmt : {KvFormat::f32, KvFormat::fp16, KvFormat::q8, KvFormat::q4})
    for (size_t n : {size_t(1), size_t(40)}) {
      rec.plain.clear();
      rec.exact.clear();
      const auto span = std::span<const int32_t>(ids).first(n);
      EXPECT_EQ(forward_all(mr, rec, span, fmt), forward_all(mc, *cpu, span, fmt)) << to_string(fmt) << " n " << n;
      const bool quantized = fmt == KvFormat::q8 || fmt == KvFormat::q4;
      EXPECT_EQ(rec.exact, quantized ? all : std::vector<std::vector<int64_t>>{}) << to_string(fmt) << " n " << n;
      EXPECT_EQ(rec.plain, quantized ? std::vector<std::vector<int64_t>>{} : all) << to_string(fmt) << " n " << n;
    }
}

}  // namespace model_kv_precision_test
}  // namespace exl
