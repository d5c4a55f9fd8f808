// The memory plan's arithmetic (engine/memory_plan.h) on the exl2-ref models without a GPU:
// weight bytes against a reference computed from the safetensors tensor table alone (and one
// total by hand), the scratch reserve against what Model really allocates for a step, the clear
// error with nothing allocated when an injected device is too small, and automatic cache sizing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/memory_plan.h"
#include "engine/model.h"
#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace memory_plan_test {

int64_t round_buf(int64_t b) {
  const int64_t g = b >= (1 << 20) ? (2 << 20) : 512;
  return b <= 0 ? 0 : (b + g - 1) / g * g;
}

TEST(MemoryPlan, AllocationRounding) {
  EXPECT_EQ(device_alloc_bytes(0), 0);
  EXPECT_EQ(device_alloc_bytes(1), 512);
  EXPECT_EQ(device_alloc_bytes(513), 1024);
  EXPECT_EQ(device_alloc_bytes((1 << 20) - 1), 1 << 20);
  EXPECT_EQ(device_alloc_bytes(1 << 20), 2 << 20);
  EXPECT_EQ(device_alloc_bytes((2 << 20) + 1), 4 << 20);
}

// Device bytes of the weights from the file's tensor table: each tensor's stored bytes, with the
// CUDA backend's conversions (norms and biases to f32, q_groups pairs to 16-byte group records,
// q_invperm to int32 perm and group_of_row), and the tied head uploaded a second time.
int64_t reference_weight_bytes(const ModelDir& dir) {
  const ModelConfig& c = dir.config();
  auto bytes = [&](const std::string& n) { return int64_t(dir.require(n).info->nbytes); };
  auto numel = [&](const std::string& n) { return dir.require(n).info->numel(); };
  auto linear = [&](const std::string& p) {
    int64_t b = dir.has(p + ".bias") ? round_buf(numel(p + ".bias") * 4) : 0;
    if (dir.has(p + ".q_weight"))
      return b + round_buf(bytes(p + ".q_weight")) + round_buf(bytes(p + ".q_scale")) +
             round_buf(bytes(p + ".q_scale_max")) + round_buf(numel(p + ".q_groups") / 2 * 16) +
             2 * round_buf(numel(p + ".q_invperm") * 4);
    return b + round_buf(bytes(p + ".weight"));
  };
  int64_t total = round_buf(bytes("model.embed_tokens.weight"));
  for (const std::string& n : dir.tensor_names())
    if (n.ends_with("norm.weight")) total += round_buf(numel(n) * 4);
  const char* mods[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (const char* m : mods) total += linear(cat("model.layers.", l, ".", m));
  total += dir.has("lm_head.q_weight") || dir.has("lm_head.weight") ? linear("lm_head") : linear("model.embed_tokens");
  return total;
}

std::filesystem::path ref(const std::string& model, const std::string& kind) {
  return test::shared_dir() / "data/exl2-ref" / model / kind;
}

class PlanModels : public ::testing::TestWithParam<std::string> {};

TEST_P(PlanModels, WeightBytesMatchTheTensorTable) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  for (const char* kind : {"exl2-4.0bpw", "hf"}) {
    ModelDir dir(ref(GetParam(), kind));
    MemoryPlan p = plan_memory(dir, {}, std::nullopt);
    EXPECT_EQ(p.weight_bytes, reference_weight_bytes(dir)) << GetParam() << " " << kind;
    EXPECT_EQ(p.weight_bytes, p.embedding_bytes + p.norm_bytes + p.linear_bytes);
    EXPECT_TRUE(p.fits);
  }
}

INSTANTIATE_TEST_SUITE_P(ExlRef, PlanModels, ::testing::Values("llama-gqa", "qwen2-bias", "llama3-rope"));

TEST(MemoryPlan, DenseTiedQwenWeightsByHand) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  // hidden 256, intermediate 768, 2 layers, q 256 / kv 128 outputs, vocab 512, f16, tied head.
  // Per layer: 786432 f16 linear weights = 1572864 B; q/k/v biases 1024 + 512 + 512 B; 2 norms
  // of 1024 B. Embedding 262144 B, final norm 1024 B, the tied head another 262144 B.
  ModelDir dir(ref("qwen2-bias", "hf"));
  MemoryPlan p = plan_memory(dir, {}, std::nullopt);
  EXPECT_EQ(p.embedding_bytes, 262144);
  EXPECT_EQ(p.norm_bytes, 5 * 1024);
  EXPECT_EQ(p.linear_bytes, 2 * (1572864 + 2048) + 262144);
  EXPECT_EQ(p.weight_bytes, 3679232);
}

// Forwards to the CPU backend; reports an injected device and counts what is allocated.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::optional<DeviceMemory> mem) : cpu_(make_cpu_backend(1)), mem_(mem) {}
  std::string name() const override { return "counting"; }
  std::optional<DeviceMemory> device_memory() const override { return mem_; }
  Buffer alloc(size_t bytes) override {
    ++allocs;
    alloc_bytes += int64_t(bytes);
    return cpu_->alloc(bytes);
  }
  void upload(void* d, const void* s, size_t n) override { cpu_->upload(d, s, n); }
  void download(void* d, const void* s, size_t n) override { cpu_->download(d, s, n); }
  std::unique_ptr<PreparedLinear> prepare_linear(const LinearWeights& w) override {
    ++prepared;
    return cpu_->prepare_linear(w);
  }
  std::unique_ptr<PreparedEmbedding> prepare_embedding(const EmbeddingWeights& e) override {
    ++prepared;
    return cpu_->prepare_embedding(e);
  }
  std::unique_ptr<KvPool> alloc_kv_pool(const KvLayout& l, int n) override {
    ++allocs;
    return cpu_->alloc_kv_pool(l, n);
  }
  void embedding(const PreparedEmbedding& e, std::span<const int32_t> ids, float* out) override {
    cpu_->embedding(e, ids, out);
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t r, int64_t d, float eps) override {
    cpu_->rms_norm(x, w, y, r, d, eps);
  }
  void linear(const PreparedLinear& w, const float* x, float* y, int64_t rows) override { cpu_->linear(w, x, y, rows); }
  void rope(float* x, int64_t rows, int nh, int hd, std::span<const int32_t> pos, const RopeTable& t) override {
    cpu_->rope(x, rows, nh, hd, pos, t);
  }
  void swiglu(const float* g, const float* u, float* o, int64_t n) override { cpu_->swiglu(g, u, o, n); }
  void add(float* x, const float* y, int64_t n) override { cpu_->add(x, y, n); }
  void kv_write(KvPool& p, int l, const float* k, const float* v, std::span<const int32_t> s) override {
    cpu_->kv_write(p, l, k, v, s);
  }
  void kv_copy(KvPool& p, int from, int to, int n) override { cpu_->kv_copy(p, from, to, n); }
  void attention(const KvPool& p, int l, const float* q, float* o, std::span<const SeqAttn> s, int nh, float sc,
                 int w) override {
    cpu_->attention(p, l, q, o, s, nh, sc, w);
  }

  int allocs = 0, prepared = 0;
  int64_t alloc_bytes = 0;

 private:
  std::unique_ptr<Backend> cpu_;
  std::optional<DeviceMemory> mem_;
};

DeviceMemory device_with(int64_t free_b) { return {0, size_t(free_b), size_t(free_b)}; }

TEST(MemoryPlan, TooLittleFreeMemoryFailsBeforeAnyAllocation) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/config.json");
  ModelDir dir(ref("llama-gqa", "exl2-4.0bpw"));
  MemoryRequest req;
  req.cache_pages = 40;
  req.max_batch_seqs = 4;
  req.max_step_tokens = 128;
  req.max_seq_len = 1024;
  const MemoryPlan base = plan_memory(dir, req, std::nullopt);
  // llama-gqa: 3 layers · K and V · 2 kv heads · 64 slots · 64 dims · 2 bytes (fp16) per page.
  ASSERT_EQ(base.page_bytes, 3 * 2 * 2 * 64 * 64 * 2);
  ASSERT_EQ(base.cache_bytes, 40 * base.page_bytes);
  ASSERT_EQ(base.cache_tokens, 40 * 64);

  // Free memory one page short of weights + cache + scratch + margin (256 MiB + 1% of total).
  const int64_t need = base.total_bytes();
  const int64_t free_b = (need + (int64_t(256) << 20) - base.page_bytes) * 100 / 99;
  CountingBackend be(device_with(free_b));
  MemoryPlan plan;
  try {
    auto m = load_planned_model(dir, be, req, plan);
    FAIL() << "loaded a model that does not fit";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("engine: memory plan: model '" + dir.path().string() + "' needs ", 0), 0u) << msg;
    EXPECT_NE(msg.find(format_bytes(base.weight_bytes) + " of weights + " + format_bytes(base.cache_bytes) +
                       " of cache (2560 tokens, fp16) + " + format_bytes(base.scratch_bytes) +
                       " of scratch, but device 0 has " + format_bytes(free_b) + " free"),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(plan.fits);
  EXPECT_EQ(be.allocs, 0);
  EXPECT_EQ(be.prepared, 0);

  // A page more of free memory fits: the model loads with 7 linears per layer, the head, the
  // embedding and 2 norms per layer plus the final one.
  CountingBackend ok(device_with(free_b + 2 * base.page_bytes));
  auto m = load_planned_model(dir, ok, req, plan);
  EXPECT_TRUE(plan.fits);
  EXPECT_EQ(plan.cache_pages, 40);
  EXPECT_EQ(ok.prepared, 7 * 3 + 1 + 1);
  EXPECT_EQ(ok.allocs, 2 * 3 + 1);
  EXPECT_EQ(ok.alloc_bytes, int64_t(7) * 384 * 4);
  EXPECT_EQ(plan.norm_bytes, 7 * round_buf(384 * 4));
}

TEST(MemoryPlan, AutomaticCacheTakesTheFreePagesUpToTheCap) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/config.json");
  ModelDir dir(ref("llama-gqa", "exl2-4.0bpw"));
  MemoryRequest req;
  req.max_batch_seqs = 2;
  req.max_step_tokens = 128;
  req.max_seq_len = 2048;  // cap: 2 · 2048 / 64 = 64 pages; the minimum: 128 / 64 = 2 pages
  const MemoryPlan base = plan_memory(dir, req, std::nullopt);
  EXPECT_TRUE(base.cache_auto);
  EXPECT_EQ(base.max_pages, 64);
  EXPECT_EQ(base.cache_pages, 64);  // no device: min(cap, cpu_default_pages = 512)

  const int64_t total = int64_t(8) << 30, margin = (int64_t(256) << 20) + total / 100;
  auto with_pages = [&](int64_t pages_free, int64_t extra) {
    DeviceMemory d{0, size_t(base.weight_bytes + base.scratch_bytes + margin + pages_free * base.page_bytes + extra),
                   size_t(total)};
    return plan_memory(dir, req, d);
  };
  MemoryPlan p = with_pages(37, base.page_bytes / 2);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.margin_bytes, margin);
  EXPECT_EQ(p.cache_pages, 37);
  EXPECT_EQ(p.cache_tokens, 37 * 64);
  EXPECT_NO_THROW(check_fits(p));
  EXPECT_EQ(with_pages(1000, 0).cache_pages, 64);
  EXPECT_EQ(with_pages(2, 0).cache_pages, 2);

  MemoryPlan none = with_pages(1, 0);
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.cache_pages, 2);
  EXPECT_NE(none.error.find("(128 tokens, fp16, the smallest automatic cache)"), std::string::npos) << none.error;
  EXPECT_THROW(check_fits(none), Error);

  req.cache_format = KvFormat::q4;
  MemoryPlan q4 = plan_memory(dir, req, DeviceMemory{0, size_t(p.weight_bytes + p.scratch_bytes + margin +
                                                                10 * base.page_bytes), size_t(total)});
  // q4: per 64-dim vector 32 bytes of elements + two fp16 block scales instead of 128 bytes, so
  // the memory of 10 fp16 pages (983040 B) holds 35 q4 pages of 27648 B.
  EXPECT_EQ(q4.page_bytes, 27648);
  EXPECT_EQ(q4.cache_pages, 35);
}

TEST(MemoryPlan, ScratchCoversWhatAStepAllocates) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  auto ids = nlohmann::json::parse(test::read_file(test::shared_dir() / "data/exl2-ref/input_ids.json"))["input_ids"]
                 .get<std::vector<int32_t>>();
  ModelDir dir(ref("llama-gqa", "exl2-4.0bpw"));
  MemoryRequest req;
  req.max_step_tokens = int(ids.size());
  req.max_batch_seqs = 1;
  req.max_seq_len = 128;
  CountingBackend be(std::nullopt);
  MemoryPlan plan;
  auto m = load_planned_model(dir, be, req, plan);
  const int64_t before = be.alloc_bytes;
  auto pool = be.alloc_kv_pool(m->kv_layout(KvFormat::f32, 64), 2);
  const int32_t pages[2] = {0, 1};
  ForwardSeq s{ids, 0, pages, false};
  m->forward(std::span<const ForwardSeq>(&s, 1), *pool);
  const int64_t step = be.alloc_bytes - before;
  EXPECT_GT(step, 0);
  EXPECT_LE(step, plan.scratch_bytes);
  // The reserve grows with the step size and the sequence length.
  MemoryRequest bigger = plan.request;
  bigger.max_step_tokens *= 2;
  EXPECT_GT(scratch_reserve_bytes(dir.config(), bigger), plan.scratch_bytes);
  bigger.max_seq_len *= 64;
  EXPECT_GT(scratch_reserve_bytes(dir.config(), bigger), scratch_reserve_bytes(dir.config(), plan.request));
}

TEST(MemoryPlan, BadOptionsAreErrors) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/config.json");
  ModelDir dir(ref("llama-gqa", "exl2-4.0bpw"));
  MemoryRequest r;
  r.page_size = 0;
  EXPECT_THROW(plan_memory(dir, r, std::nullopt), Error);
  r = {};
  r.cache_pages = -1;
  EXPECT_THROW(plan_memory(dir, r, std::nullopt), Error);
  r = {};
  r.max_step_tokens = 0;
  EXPECT_THROW(plan_memory(dir, r, std::nullopt), Error);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(int64_t(3) << 29), "1.50 GiB");
  EXPECT_EQ(format_bytes(int64_t(12) << 20), "12.0 MiB");
}

}  // namespace memory_plan_test
}  // namespace exl
