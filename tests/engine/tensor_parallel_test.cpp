// Tensor parallelism on CPU backends (engine/tensor_parallel.h, engine/tp_model.h): the plan's
// head, column and group splits; EXL2 and dense slices whose products put together give the
// unsplit linear's (columns side by side, row partials summed, act-order rows included); the host
// communicator's collectives; and TpModel's logits on 2 and 3 ranks against the unsplit model.
#include "engine/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/formats/linear_loader.h"
#include "engine/generate/generator.h"
#include "engine/model.h"
#include "engine/tp_model.h"
#include "kernels/communicator.h"
#include "kernels/error.h"
#include "generation_harness.h"
#include "linear_apply.h"
#include "model_logits.h"
#include "test_support.h"

namespace exl {
namespace tensor_parallel_test {

using test::apply;
using test::random_rows;

const char* const k_exl2 = "data/exl2-ref/llama-gqa/exl2-4.0bpw";
const char* const k_dense = "data/exl2-ref/llama-gqa/hf";

TEST(TensorParallelPlan, SplitsWholeKvHeadGroupsAlignedColumnsAndDownGroups) {
  EXL_REQUIRE_SHARED(k_exl2);
  ModelDir dir(test::shared_dir() / k_exl2);  // 6 heads, 2 kv heads, hidden 384, intermediate 1024
  const TpPlan p = plan_tensor_parallel(dir, 2);
  ASSERT_EQ(p.slices.size(), 3u);
  for (size_t l = 0; l < 3; ++l) {
    const TpLayerSlice &a = p.slices[l][0], &b = p.slices[l][1];
    EXPECT_EQ(a.kv_head_end - a.kv_head_begin, 1);
    EXPECT_EQ(a.q_head_begin, 0);
    EXPECT_EQ(a.q_head_end, 3);
    EXPECT_EQ(b.q_head_begin, 3);
    EXPECT_EQ(b.q_head_end, 6);
    EXPECT_EQ(a.o_col_end, 192);
    EXPECT_EQ(b.o_col_begin, 192);
    EXPECT_EQ(b.o_col_end, 384);
    EXPECT_EQ(a.down_row_begin, 0);
    EXPECT_EQ(a.down_row_end, b.down_row_begin);
    EXPECT_EQ(b.down_row_end, 1024);
    EXPECT_GT(a.down_row_end, 256);
    EXPECT_LT(a.down_row_end, 768);
    // Between them the ranks' MLP columns are every intermediate feature once.
    std::vector<int32_t> all = a.mlp_cols;
    all.insert(all.end(), b.mlp_cols.begin(), b.mlp_cols.end());
    std::sort(all.begin(), all.end());
    for (int32_t i = 0; i < 1024; ++i) ASSERT_EQ(all[size_t(i)], i);
  }
  EXPECT_THROW(plan_tensor_parallel(dir, 3), Error);  // 2 kv heads over 3 ranks
  EXPECT_THROW(plan_tensor_parallel(dir, 0), Error);
}

TEST(TensorParallelSlices, ColumnAndRowSlicesReassembleTheLinear) {
  for (const char* model : {k_exl2, k_dense}) {
    EXL_REQUIRE_SHARED(model);
    ModelDir dir(test::shared_dir() / model);
    auto be = make_cpu_backend(1);
    const int64_t rows = 3;
    // down_proj [1024 → 384]: rows split as the plan says; its input in the rows' feature order.
    const TpPlan plan = plan_tensor_parallel(dir, 2);
    const LinearWeights down = load_linear(dir, "model.layers.1.mlp.down_proj", 1024, 384);
    const auto x = random_rows(rows, 1024, 7);
    const auto want = apply(*be, down, x, rows);
    std::vector<float> sum(want.size(), 0.0f);
    for (int r = 0; r < 2; ++r) {
      const TpLayerSlice& s = plan.slices[1][size_t(r)];
      const int64_t n = int64_t(s.mlp_cols.size());
      std::vector<float> xr(size_t(rows * n));
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t i = 0; i < n; ++i) xr[size_t(t * n + i)] = x[size_t(t * 1024 + s.mlp_cols[size_t(i)])];
      const auto part = apply(*be, slice_linear_rows(down, s.down_row_begin, s.down_row_end, r == 0).weights, xr, rows);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_LE(test::rel_err(sum, want), 1e-5) << model;
    // gate_proj [384 → 1024]: an arbitrary column subset (the down rows' order) gives those columns.
    const LinearWeights gate = load_linear(dir, "model.layers.1.mlp.gate_proj", 384, 1024);
    const auto xg = random_rows(rows, 384, 9);
    const auto full = apply(*be, gate, xg, rows);
    const std::vector<int32_t>& cols = plan.slices[1][1].mlp_cols;
    const auto got = apply(*be, slice_linear_columns(gate, cols).weights, xg, rows);
    const int64_t n = int64_t(cols.size());
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[size_t(t * n + i)], full[size_t(t * 1024 + cols[size_t(i)])]) << model << " column " << i;
  }
}

TEST(TensorParallelSlices, BadSlicesAreErrors) {
  EXL_REQUIRE_SHARED(k_exl2);
  ModelDir dir(test::shared_dir() / k_exl2);
  const LinearWeights down = load_linear(dir, "model.layers.0.mlp.down_proj", 1024, 384);
  const std::vector<int32_t> out_of_range{0, 384};
  EXPECT_THROW(slice_linear_columns(down, out_of_range), Error);
  EXPECT_THROW(slice_linear_columns(down, {}), Error);
  EXPECT_THROW(slice_linear_rows(down, 0, 17, true), Error);  // inside a group
  EXPECT_THROW(slice_linear_rows(down, 5, 5, true), Error);
}

TEST(HostCommunicator, SumsAndGathersInRankOrder) {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> ranks;
  for (int r = 0; r < 3; ++r) owned.push_back(make_cpu_backend(1)), ranks.push_back(owned.back().get());
  auto comm = make_host_communicator(ranks);
  EXPECT_EQ(comm->n_ranks(), 3);
  std::vector<Buffer> bufs, gathered;
  std::vector<float*> ptrs, outs;
  std::vector<const float*> ins;
  const std::vector<int64_t> widths{1, 2, 1};
  for (int r = 0; r < 3; ++r) {
    const std::vector<float> v{float(r + 1), float(10 * (r + 1))};
    bufs.push_back(ranks[size_t(r)]->alloc(8));
    ranks[size_t(r)]->upload(bufs.back().data(), v.data(), 8);
    ptrs.push_back(bufs.back().f32());
    gathered.push_back(ranks[size_t(r)]->alloc(2 * 4 * 4));
    outs.push_back(gathered.back().f32());
  }
  for (int r = 0; r < 3; ++r) ins.push_back(ptrs[size_t(r)]);
  // One row: rank r's block of widths[r] columns, read from its buffer before the sum.
  comm->all_gather_columns(ins, outs, 1, widths);
  std::vector<float> g(4);
  ranks[2]->download(g.data(), outs[2], 16);
  EXPECT_EQ(g, (std::vector<float>{1, 2, 20, 3}));
  comm->all_reduce_sum(ptrs, 2);
  for (int r = 0; r < 3; ++r) {
    std::vector<float> v(2);
    ranks[size_t(r)]->download(v.data(), ptrs[size_t(r)], 8);
    EXPECT_EQ(v, (std::vector<float>{6, 60})) << r;
  }
  EXPECT_THROW(comm->all_reduce_sum(std::span<float* const>(ptrs).first(2), 2), Error);
}

std::vector<float> run_chunks(std::vector<float> (*fwd)(void*, std::span<const ForwardSeq>, KvPool&), void* m,
                              KvPool& pool, const std::vector<int32_t>& ids, int64_t chunk) {
  std::vector<int32_t> table{3, 0, 2, 1};
  std::vector<float> out;
  for (size_t b = 0; b < ids.size(); b += size_t(chunk)) {
    const size_t e = std::min(ids.size(), b + size_t(chunk));
    ForwardSeq s{std::span<const int32_t>(ids).subspan(b, e - b), int64_t(b), table, true};
    auto l = fwd(m, std::span<const ForwardSeq>(&s, 1), pool);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

std::vector<float> model_fwd(void* m, std::span<const ForwardSeq> b, KvPool& p) {
  return static_cast<Model*>(m)->forward(b, p);
}
std::vector<float> tp_fwd(void* m, std::span<const ForwardSeq> b, KvPool& p) {
  return static_cast<TpModel*>(m)->forward(b, p);
}

struct TpCase {
  const char* model;
  int ranks;
  friend std::ostream& operator<<(std::ostream& os, const TpCase& c) { return os << c.model << " on " << c.ranks; }
};
class TpModels : public ::testing::TestWithParam<TpCase> {};

TEST_P(TpModels, LogitsMatchTheUnsplitModel) {
  const TpCase& c = GetParam();
  EXL_REQUIRE_SHARED(c.model);
  ModelDir dir(test::shared_dir() / c.model);
  auto one = make_cpu_backend(1);
  Model single(dir, *one);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> ranks;
  for (int r = 0; r < c.ranks; ++r) owned.push_back(make_cpu_backend(1)), ranks.push_back(owned.back().get());
  auto comm = make_host_communicator(ranks);
  TpModel tp(dir, ranks, *comm);
  std::vector<int32_t> ids{1};
  for (int i = 1; i < 40; ++i) ids.push_back(int32_t(3 + (i * 53) % 500));
  for (int64_t chunk : {40, 1, 9}) {
    auto p1 = single.alloc_kv_pool(KvFormat::f32, 16, 4);
    auto pt = tp.alloc_kv_pool(KvFormat::f32, 16, 4);
    const auto want = run_chunks(model_fwd, &single, *p1, ids, chunk);
    const auto got = run_chunks(tp_fwd, &tp, *pt, ids, chunk);
    EXPECT_LE(test::rel_err(got, want), 1e-5) << c.model << " ranks " << c.ranks << " chunk " << chunk;
  }
  auto foreign = single.alloc_kv_pool(KvFormat::f32, 16, 4);
  const std::vector<int32_t> table{0};
  ForwardSeq s{std::span<const int32_t>(ids).first(3), 0, table, false};
  EXPECT_THROW(tp.forward(std::span<const ForwardSeq>(&s, 1), *foreign), Error);
}

INSTANTIATE_TEST_SUITE_P(Models, TpModels,
                         ::testing::Values(TpCase{k_exl2, 2}, TpCase{k_dense, 2}, TpCase{"models/stories260K-hf", 2},
                                           TpCase{"data/exl2-ref/qwen2-bias/hf", 1}));

// Two jobs sharing a 40-token prefix (the second from the prefix cache, a partial page copied on
// write), greedy with device sampling where the backend offers it.
std::vector<test::GenerationRecord> generate_pair(Model& m, const Tokenizer& tok) {
  GeneratorOptions o;
  o.page_size = 16;
  o.num_pages = 16;
  Generator g(m, tok, o);
  std::vector<int32_t> a{1};
  for (int i = 1; i < 40; ++i) a.push_back(int32_t(3 + (i * 53) % 500));
  std::vector<int32_t> b = a;
  a.insert(a.end(), {7, 8, 9});
  b.insert(b.end(), {70, 80});
  std::vector<test::GenerationRecord> r(2);
  for (size_t j = 0; j < 2; ++j) {
    GenerationJob job;
    job.prompt = j == 0 ? a : b;
    job.sampling.temperature = 0;
    job.max_new_tokens = 8;
    job.on_event = test::record_events(&r[j]);
    g.submit(std::move(job));
    g.run_until_idle();
  }
  return r;
}

TEST(TensorParallelModel, GenerationThroughModelMatchesOneBackend) {
  EXL_REQUIRE_SHARED(k_exl2);
  const auto path = test::shared_dir() / k_exl2;
  test::CpuModel single(path);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> ranks;
  for (int r = 0; r < 2; ++r) owned.push_back(make_cpu_backend(1)), ranks.push_back(owned.back().get());
  auto comm = make_host_communicator(ranks);
  Model tp(single.dir, ranks, *comm);
  EXPECT_EQ(tp.n_ranks(), 2);
  EXPECT_FALSE(tp.can_sample_deferred());
  const auto want = generate_pair(*single.model, *single.tok);
  const auto got = generate_pair(tp, *single.tok);
  ASSERT_TRUE(got[1].done) << got[1].error;
  EXPECT_GE(got[1].stats.n_cached_tokens, 32);
  for (size_t j = 0; j < 2; ++j) EXPECT_EQ(got[j].tokens, want[j].tokens) << "job " << j;
}

}  // namespace tensor_parallel_test
}  // namespace exl

namespace exl {
namespace tensor_parallel_test {

TEST(TensorParallelMemory, EachRankHoldsItsShareAndTheTightestRankDecides) {
  EXL_REQUIRE_SHARED(k_exl2);
  ModelDir dir(test::shared_dir() / k_exl2);
  MemoryRequest req;
  req.cache_format = KvFormat::fp16;
  const MemoryPlan whole = plan_memory(dir, req, std::nullopt);
  const TpPlan plan = plan_tensor_parallel(dir, 2);
  const std::vector<std::optional<DeviceMemory>> none(2);
  const MemoryPlan p = plan_tp_memory(dir, plan, req, none);
  ASSERT_TRUE(p.fits) << p.error;
  EXPECT_EQ(p.page_bytes * 2, whole.page_bytes);  // one of the two kv heads per rank
  EXPECT_LT(p.weight_bytes, whole.weight_bytes);
  EXPECT_GT(p.weight_bytes, whole.embedding_bytes + whole.norm_bytes + whole.linear_bytes / 3);
  EXPECT_EQ(p.cache_pages, whole.cache_pages);

  // Rank 1's device holds rank 0's weights, the scratch and 10 pages; rank 0's has room to spare.
  const size_t roomy = size_t(4) << 30;
  const size_t snug = size_t(k_margin_fixed + int64_t(roomy / 100) + p.weight_bytes + p.scratch_bytes + 10 * p.page_bytes);
  const std::vector<std::optional<DeviceMemory>> mem{DeviceMemory{0, roomy, roomy}, DeviceMemory{1, snug, roomy}};
  const MemoryPlan q = plan_tp_memory(dir, plan, req, mem);
  ASSERT_TRUE(q.fits) << q.error;
  ASSERT_TRUE(q.device.has_value());
  EXPECT_EQ(q.device->device, 1);  // the rank with less free memory sets the page count
  EXPECT_GE(q.cache_pages, 10);
  EXPECT_LT(q.cache_pages, p.cache_pages);
  EXPECT_LE(q.total_bytes() + q.margin_bytes, int64_t(snug));

  const std::vector<std::optional<DeviceMemory>> tight{DeviceMemory{0, roomy, roomy},
                                                       DeviceMemory{1, size_t(k_margin_fixed) + 1000, roomy}};
  const MemoryPlan t = plan_tp_memory(dir, plan, req, tight);
  EXPECT_FALSE(t.fits);
  EXPECT_NE(t.error.find("engine: tensor parallel: memory plan: rank 1 of model '"), std::string::npos) << t.error;
  EXPECT_NE(t.error.find("but device 1 has "), std::string::npos) << t.error;
  EXPECT_THROW(check_fits(t), Error);
}

}  // namespace tensor_parallel_test
}  // namespace exl
