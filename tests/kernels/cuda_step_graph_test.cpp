// Decode steps bracketed by Backend::begin_step/end_step on the CUDA backend (replayed as CUDA
// graphs) against the CPU backend: a small transformer layer stack over several steps whose
// positions, slots and page tables change every step while the shapes repeat, so that most
// steps replay a captured graph with new per-step data. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "kernels/error.h"
#include "random_weights.h"
#include "test_support.h"

namespace exl {
namespace cuda_step_graph_test {

using test::rel_err;

// A two-layer model with odd sizes (dim 96, 3 query heads over 1 kv head of 32, hidden 160,
// vocab 77) whose every op goes through the Backend interface.
struct TinyStack {
  static constexpr int64_t dim = 96, hidden = 160, vocab = 77, n_layers = 2;
  static constexpr int n_heads = 3, n_kv = 1, head_dim = 32, page = 4;
  static constexpr KvFormat kv = KvFormat::f32;
  std::vector<test::OwnedExl2> q, k, v, o, gate, up, down;
  test::OwnedExl2 head;
  std::vector<float> table, norm_w;
  RopeTable rope;

  TinyStack() : head(test::random_exl2(dim, vocab, {{6, 64}, {4, 32}}, 90)) {
    for (uint32_t l = 0; l < n_layers; ++l) {
      const uint32_t s = 100 * (l + 1);
      q.push_back(test::random_exl2(dim, n_heads * head_dim, {{4, 64}, {5, 32}}, s + 1));
      k.push_back(test::random_exl2(dim, n_kv * head_dim, {{3, 32}, {6, 64}}, s + 2));
      v.push_back(test::random_exl2(dim, n_kv * head_dim, {{8, 96}}, s + 3));
      o.push_back(test::random_exl2(n_heads * head_dim, dim, {{4, 96}}, s + 4));
      gate.push_back(test::random_exl2(dim, hidden, {{2, 32}, {4, 64}}, s + 5));
      up.push_back(test::random_exl2(dim, hidden, {{5, 96}}, s + 6));
      down.push_back(test::random_exl2(hidden, dim, {{4, 128}, {3, 32}}, s + 7));
    }
    table = test::random_floats(size_t(vocab * dim), 91);
    norm_w = test::random_floats(size_t(dim), 92);
    for (int i = 0; i < head_dim / 2; ++i) rope.inv_freq.push_back(float(std::pow(10000.0, -2.0 * i / head_dim)));
  }
};

// Three layers of 128-wide heads (dim 256, 2 query heads over 1 kv head, hidden 384), for the
// fused layer ops' tensor-core chain (attention_inputs → attention → o + MLP + the next layer's
// staged q/k/v input).
struct WideStack {
  static constexpr int64_t dim = 256, hidden = 384, vocab = 77, n_layers = 3;
  static constexpr int n_heads = 2, n_kv = 1, head_dim = 128, page = 4;
  static constexpr KvFormat kv = KvFormat::fp16;  // the decode attention kernel's
  std::vector<test::OwnedExl2> q, k, v, o, gate, up, down;
  test::OwnedExl2 head;
  std::vector<float> table, norm_w;
  RopeTable rope;

  WideStack() : head(test::random_exl2(dim, vocab, {{6, 128}, {4, 128}}, 190)) {
    for (uint32_t l = 0; l < n_layers; ++l) {
      const uint32_t s = 200 * (l + 1);
      q.push_back(test::random_exl2(dim, n_heads * head_dim, {{4, 128}, {5, 128}}, s + 1));
      k.push_back(test::random_exl2(dim, n_kv * head_dim, {{3, 64}, {6, 192}}, s + 2));
      v.push_back(test::random_exl2(dim, n_kv * head_dim, {{8, 256}}, s + 3));
      o.push_back(test::random_exl2(n_heads * head_dim, dim, {{4, 256}}, s + 4));
      gate.push_back(test::random_exl2(dim, hidden, {{2, 64}, {4, 192}}, s + 5));
      up.push_back(test::random_exl2(dim, hidden, {{5, 256}}, s + 6));
      down.push_back(test::random_exl2(hidden, dim, {{4, 256}, {3, 128}}, s + 7));
    }
    table = test::random_floats(size_t(vocab * dim), 191);
    norm_w = test::random_floats(size_t(dim), 192);
    for (int i = 0; i < head_dim / 2; ++i) rope.inv_freq.push_back(float(std::pow(10000.0, -2.0 * i / head_dim)));
  }
};

// Runs `steps` steps of 2 + `more` sequences after an op-by-op prefill, sequence 0 with `width`
// positions per step (a verify pass when above 1), the others with one; returns every step's
// logits. `fused`:
// each layer as the model runs decode steps (attention_inputs, attention, rms_norm_mlp_residual
// with the o projection and the next layer's q/k/v), else op by op.
template <typename T>
std::vector<std::vector<float>> run_steps(Backend& be, const T& m, bool bracket, int steps, int width = 1,
                                          bool fused = false, int more = 0) {
  std::vector<std::unique_ptr<PreparedLinear>> L;
  for (int64_t l = 0; l < T::n_layers; ++l)
    for (const auto* w : {&m.q[l], &m.k[l], &m.v[l], &m.o[l], &m.gate[l], &m.up[l], &m.down[l]})
      L.push_back(be.prepare_linear(w->m));
  auto head = be.prepare_linear(m.head.m);
  auto emb = be.prepare_embedding({T::vocab, T::dim, DType::f32, m.table.data()});
  const int max_rows = 16;
  auto alloc = [&](int64_t n) { return be.alloc(size_t(n) * 4); };
  Buffer x = alloc(max_rows * T::dim), xn = alloc(max_rows * T::dim), tmp = alloc(max_rows * T::dim);
  Buffer q = alloc(max_rows * T::n_heads * T::head_dim), att = alloc(max_rows * T::n_heads * T::head_dim);
  Buffer k = alloc(max_rows * T::n_kv * T::head_dim), v = alloc(max_rows * T::n_kv * T::head_dim);
  Buffer g = alloc(max_rows * T::hidden), u = alloc(max_rows * T::hidden), logits = alloc(max_rows * T::vocab);
  Buffer nw = alloc(T::dim);
  be.upload(nw.data(), m.norm_w.data(), m.norm_w.size() * 4);
  const KvLayout layout{int(T::n_layers), T::n_kv, T::head_dim, T::page, T::kv};
  auto pool = be.alloc_kv_pool(layout, 40 + 8 * more);
  // Scattered pages: sequence 0 uses even pages from the top, sequence 1 odd ones, the others 8
  // each past them.
  std::vector<std::vector<int32_t>> tables(size_t(2 + more));
  for (int p = 0; p < 16; ++p) tables[0].push_back(38 - 2 * p), tables[1].push_back(1 + 2 * p);
  for (int e = 0; e < more; ++e)
    for (int p = 0; p < 8; ++p) tables[size_t(2 + e)].push_back(40 + 8 * e + p);

  auto forward = [&](const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, const std::vector<SeqAttn>& seqs) {
    const int64_t n = int64_t(ids.size());
    std::vector<int32_t> slots;
    for (size_t i = 0; i < ids.size(); ++i) {
      size_t s = 0;
      while (int64_t(i) >= seqs[s].token_begin + seqs[s].n_tokens) ++s;
      slots.push_back(tables[s][size_t(pos[i] / T::page)] * T::page + pos[i] % T::page);
    }
    auto layer_fused = [&](int64_t l) {
      const auto* W = &L[size_t(l * 7)];
      const PreparedLinear* qkv[3] = {W[0].get(), W[1].get(), W[2].get()};
      be.attention_inputs({qkv, x.f32(), nw.f32(), xn.f32(), q.f32(), k.f32(), v.f32(), n, T::dim, 1e-5f, T::n_heads,
                           T::n_kv, T::head_dim, pos, &m.rope, pool.get(), int(l), slots});
      be.attention(*pool, int(l), q.f32(), att.f32(), seqs, T::n_heads, 0.2f, 0);
      MlpInputs mi{W[4].get(), W[5].get(), W[6].get(), x.f32(), nw.f32(), xn.f32(), g.f32(), u.f32(), tmp.f32(),
                   n, T::dim, T::hidden, 1e-5f, false};
      mi.o = W[3].get(), mi.att = att.f32();
      const PreparedLinear* next[3] = {};
      if (l + 1 < T::n_layers) {
        for (int j = 0; j < 3; ++j) next[j] = L[size_t((l + 1) * 7 + j)].get();
        mi.next_qkv = next, mi.next_norm_w = nw.f32();
      }
      be.rms_norm_mlp_residual(mi);
    };
    auto ops = [&] {
      be.embedding(*emb, ids, x.f32());
      for (int64_t l = 0; l < T::n_layers; ++l) {
        if (fused) {
          layer_fused(l);
          continue;
        }
        const auto* W = &L[size_t(l * 7)];
        be.rms_norm(x.f32(), nw.f32(), xn.f32(), n, T::dim, 1e-5f);
        const PreparedLinear* qkv[3] = {W[0].get(), W[1].get(), W[2].get()};
        float* qkv_out[3] = {q.f32(), k.f32(), v.f32()};
        be.linears(qkv, xn.f32(), qkv_out, n);
        be.rope_qk(q.f32(), k.f32(), n, T::n_heads, T::n_kv, T::head_dim, pos, m.rope);
        be.kv_write(*pool, int(l), k.f32(), v.f32(), slots);
        be.attention(*pool, int(l), q.f32(), att.f32(), seqs, T::n_heads, 0.2f, 0);
        be.linear(*W[3], att.f32(), tmp.f32(), n);
        be.add_rms_norm(x.f32(), tmp.f32(), nw.f32(), xn.f32(), n, T::dim, 1e-5f);
        be.linear(*W[4], xn.f32(), g.f32(), n);
        be.linear(*W[5], xn.f32(), u.f32(), n);
        be.swiglu(g.f32(), u.f32(), g.f32(), n * T::hidden);
        be.linear(*W[6], g.f32(), tmp.f32(), n);
        be.add(x.f32(), tmp.f32(), n * T::dim);
      }
      be.linear(*head, x.f32(), logits.f32(), n);
    };
    if (bracket) {
      do {
        be.begin_step();
        ops();
      } while (!be.end_step());
    } else {
      ops();
    }
    std::vector<float> out(size_t(n * T::vocab));
    be.download(out.data(), logits.data(), out.size() * 4);
    return out;
  };

  // Prefill: sequence 0 gets 5 tokens, sequence 1 gets 3, the others 2 (op by op, no bracketing).
  std::vector<int32_t> ids = {3, 70, 12, 9, 41, 5, 66, 20}, pos = {0, 1, 2, 3, 4, 0, 1, 2};
  std::vector<SeqAttn> seqs = {{0, 5, 0, tables[0]}, {5, 3, 0, tables[1]}};
  for (int e = 0; e < more; ++e) {
    seqs.push_back({int64_t(ids.size()), 2, 0, tables[size_t(2 + e)]});
    ids.push_back(int32_t(30 + e)), ids.push_back(int32_t(50 + e)), pos.push_back(0), pos.push_back(1);
  }
  forward(ids, pos, seqs);
  std::vector<std::vector<float>> out;
  for (int s = 0; s < steps; ++s) {
    const int32_t p0 = 5 + width * s, p1 = 3 + s;
    std::vector<int32_t> step_ids, step_pos;
    for (int i = 0; i < width; ++i) step_ids.push_back(int32_t((7 * s + 13 * i + 1) % T::vocab)), step_pos.push_back(p0 + i);
    step_ids.push_back(int32_t((11 * s + 4) % T::vocab));
    step_pos.push_back(p1);
    seqs = {{0, width, p0, tables[0]}, {width, 1, p1, tables[1]}};
    for (int e = 0; e < more; ++e) {
      seqs.push_back({int64_t(step_ids.size()), 1, 2 + s, tables[size_t(2 + e)]});
      step_ids.push_back(int32_t((5 * s + 17 * e + 2) % T::vocab));
      step_pos.push_back(2 + s);
    }
    out.push_back(forward(step_ids, step_pos, seqs));
  }
  return out;
}

TEST(CudaStepGraph, ReplayedDecodeStepsMatchOpByOpAndCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA GPU; " << cuda_device_description();
  const TinyStack m;
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(2);
  const int steps = 40;
  const auto ref = run_steps(*cpu, m, false, steps);
  const auto eager = run_steps(*gpu, m, false, steps);
  EXPECT_EQ(cuda_step_stats(*gpu).graph_launches, 0);
  const auto got = run_steps(*gpu, m, true, steps);
  ASSERT_EQ(got.size(), ref.size());
  for (int s = 0; s < steps; ++s) {
    // The same kernels with the same launches: replays are bit-identical to op-by-op steps.
    EXPECT_EQ(got[size_t(s)], eager[size_t(s)]) << "step " << s;
    // Two layers of fp16-activation gemvs (2/4/8-bit groups) against the CPU's fp32.
    EXPECT_LT(rel_err(got[size_t(s)], ref[size_t(s)]), 1e-2) << "step " << s;
  }
  const CudaStepStats st = cuda_step_stats(*gpu);
  // The attention plan's shape changes with the context length, so a few graphs are captured,
  // and most steps replay one.
  EXPECT_GT(st.graph_captures, 0);
  EXPECT_GT(st.graph_launches, steps / 2);
  EXPECT_LT(st.graph_captures, steps / 2);
}

// The fused layer ops at three rows (two positions of sequence 0 beside one of sequence 1): the
// tensor-core chain, in which each layer's MLP stages the next layer's q/k/v input once the backend
// has seen those q/k/v take the tensor-core path, replays as graphs with what the same steps give
// op by op, and the CPU's values at fp16 tolerance; so does a decode step of four sequences, in
// which decode attention also stages the o projection's input; at two rows (one position each)
// the same ops run the gemv with its act-order hand-offs.
TEST(CudaStepGraph, FusedLayerChainsReplayLikeOpByOpAndMatchCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA GPU; " << cuda_device_description();
  const WideStack m;
  auto cpu = make_cpu_backend(2);
  for (auto [width, more] : {std::pair{2, 0}, std::pair{1, 0}, std::pair{1, 2}}) {
    SCOPED_TRACE("width " + std::to_string(width) + ", " + std::to_string(2 + more) + " sequences");
    auto gpu = make_cuda_backend(0);
    const int steps = 8;
    const auto ref = run_steps(*cpu, m, false, steps, width, true, more);
    const auto eager = run_steps(*gpu, m, false, steps, width, true, more);
    const int64_t eager_handoffs = cuda_step_stats(*gpu).handoffs;
    const auto got = run_steps(*gpu, m, true, steps, width, true, more);
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(got[size_t(s)], eager[size_t(s)]) << "step " << s;
      EXPECT_LT(rel_err(got[size_t(s)], ref[size_t(s)]), 2e-2) << "step " << s;
    }
    const CudaStepStats st = cuda_step_stats(*gpu);
    EXPECT_GT(st.graph_launches, 0);
    // At three rows layers 1 and 2 read a staged hand-off in every step, op by op and bracketed
    // alike; at four decode rows every layer's o projection too (its input staged by decode
    // attention); at two rows the act-order hand-offs are learned in bracketed steps only.
    const int64_t bracketed_handoffs = st.handoffs - eager_handoffs;
    if (width == 2) {
      EXPECT_GE(eager_handoffs, 2 * steps);
      EXPECT_GE(bracketed_handoffs, 2 * steps);
    } else if (more > 0) {
      EXPECT_GE(eager_handoffs, 5 * (steps - 1));
      EXPECT_GE(bracketed_handoffs, 5 * (steps - 1));
    } else {
      EXPECT_EQ(eager_handoffs, 0);
      EXPECT_GT(bracketed_handoffs, 0);
    }
  }
}

// Verify passes (three positions of sequence 0 beside one of sequence 1): replayed graphs give
// what the same steps op by op give, and a shape is captured only once it has come back, and then
// replayed while the context grows (attention_plan.h buckets the plan's shape).
TEST(CudaStepGraph, ReplayedVerifyPassesMatchOpByOpAndCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA GPU; " << cuda_device_description();
  const TinyStack m;
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(2);
  const int steps = 18, width = 3;  // sequence 0 reaches position 58 of its 64
  const auto ref = run_steps(*cpu, m, false, steps, width);
  const auto eager = run_steps(*gpu, m, false, steps, width);
  const CudaStepStats before = cuda_step_stats(*gpu);
  EXPECT_EQ(before.multi_steps, 0);
  const auto got = run_steps(*gpu, m, true, steps, width);
  ASSERT_EQ(got.size(), ref.size());
  for (int s = 0; s < steps; ++s) {
    EXPECT_EQ(got[size_t(s)], eager[size_t(s)]) << "step " << s;
    // Four rows take the tensor-core kernel where the tests enable it (fp16 inputs).
    EXPECT_LT(rel_err(got[size_t(s)], ref[size_t(s)]), 2e-2) << "step " << s;
  }
  const CudaStepStats st = cuda_step_stats(*gpu);
  EXPECT_EQ(st.multi_steps, steps + 1);  // and the prefill, run op by op (its shape never comes back)
  // Shapes: direct up to 32 positions, then two partitions; page tables padded to 16 entries,
  // then 32: three shapes, each captured once after one pass op by op.
  EXPECT_GE(st.multi_graph_captures, 1);
  EXPECT_LE(st.multi_graph_captures, 4);
  EXPECT_GE(st.multi_graph_launches, steps - 2 * st.multi_graph_captures);
  EXPECT_EQ(st.graph_launches, st.multi_graph_launches);
}

// While recording at once (Generator::warm_up), a multi-position shape is captured the first
// time: every bracketed step (the prefill and the verify passes) runs as a graph, with the same
// results; afterwards shapes wait for their second sight again.
TEST(CudaStepGraph, RecordingAtOnceCapturesAShapeTheFirstTime) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA GPU; " << cuda_device_description();
  const TinyStack m;
  auto gpu = make_cuda_backend(0);
  const int steps = 18, width = 3;
  const auto eager = run_steps(*gpu, m, false, steps, width);
  gpu->record_steps_at_once(true);
  const auto got = run_steps(*gpu, m, true, steps, width);
  gpu->record_steps_at_once(false);
  for (int s = 0; s < steps; ++s) EXPECT_EQ(got[size_t(s)], eager[size_t(s)]) << "step " << s;
  const CudaStepStats st = cuda_step_stats(*gpu);
  EXPECT_EQ(st.multi_graph_launches, steps + 1);  // the prefill too
  EXPECT_GE(st.multi_graph_captures, 1);
  auto fresh = make_cuda_backend(0);
  fresh->record_steps_at_once(true);
  fresh->record_steps_at_once(false);
  run_steps(*fresh, m, true, 1, width);
  EXPECT_EQ(cuda_step_stats(*fresh).multi_graph_captures, 0) << "a shape seen once waits for its second sight";
}

TEST(CudaStepGraph, CpuBackendStepsAreNoOps) {
  auto cpu = make_cpu_backend(1);
  cpu->begin_step();
  EXPECT_TRUE(cpu->end_step());
  cpu->cancel_step();
  EXPECT_THROW(cuda_step_stats(*cpu), Error);
}

}  // namespace cuda_step_graph_test
}  // namespace exl
