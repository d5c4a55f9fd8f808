// MLPs with gate/up in down_proj's order (engine/mlp_order.h), on the CPU backend: against the
// matrices as stored (real EXL2 files from ExLlamaV2's converter, whose down_proj rows are in
// act-order), bit for bit; what is left as stored; bad shapes.
#include "engine/mlp_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/formats/linear_loader.h"
#include "engine/formats/model_dir.h"
#include "kernels/error.h"
#include "linear_apply.h"
#include "test_support.h"

namespace exl {
namespace {

// (silu(x · gateᵀ) ⊙ x · upᵀ) · downᵀ on `be`, as a model's exact forward computes it.
std::vector<float> mlp(Backend& be, const LinearWeights& gate, const LinearWeights& up, const LinearWeights& down,
                       const std::vector<float>& x, int64_t rows) {
  const int64_t I = in_features(down), H = out_features(down);
  auto g = test::apply(be, gate, x, rows), u = test::apply(be, up, x, rows);
  auto pd = be.prepare_linear(down);
  Buffer bg = be.alloc(g.size() * 4), bu = be.alloc(u.size() * 4), by = be.alloc(size_t(rows * H) * 4);
  be.upload(bg.data(), g.data(), g.size() * 4);
  be.upload(bu.data(), u.data(), u.size() * 4);
  be.swiglu_linear(*pd, bg.f32(), bu.f32(), by.f32(), rows, I, true);
  std::vector<float> y(size_t(rows * H));
  be.download(y.data(), by.data(), y.size() * 4);
  return y;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(MlpOrder, GateUpInDownOrderGiveTheStoredMlpBitForBit) {
  for (const char* model : {"data/exl2-ref/llama-gqa/exl2-4.0bpw", "data/exl2-ref/qwen2-bias/exl2-4.0bpw"}) {
    EXL_REQUIRE_SHARED(model);
    ModelDir dir(test::shared_dir() / model);
    const ModelConfig& c = dir.config();
    const int64_t H = c.hidden_size, I = c.intermediate_size, rows = 5;
    auto be = make_cpu_backend(1);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      const LinearWeights gate = load_linear(dir, p + "gate_proj", H, I), up = load_linear(dir, p + "up_proj", H, I),
                          down = load_linear(dir, p + "down_proj", I, H);
      const std::vector<int32_t>& perm = std::get<Exl2Matrix>(down).perm;
      ASSERT_FALSE(std::is_sorted(perm.begin(), perm.end())) << model << " layer " << l << ": down_proj in stored order";
      const OrderedMlp m = order_mlp_by_down(gate, up, down);
      ASSERT_TRUE(m.ordered);
      const std::vector<int32_t>& in_order = std::get<Exl2Matrix>(m.down).perm;
      EXPECT_TRUE(std::is_sorted(in_order.begin(), in_order.end()) && in_order.front() == 0 && in_order.back() == I - 1);
      const auto x = test::random_rows(rows, H, uint32_t(11 + l));
      // Gate's column j is the stored column perm[j], bit for bit.
      const auto full = test::apply(*be, gate, x, rows), ordered = test::apply(*be, m.gate.weights, x, rows);
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t j = 0; j < I; ++j)
          ASSERT_EQ(ordered[size_t(t * I + j)], full[size_t(t * I + perm[size_t(j)])]) << model << " column " << j;
      const auto want = mlp(*be, gate, up, down, x, rows);
      EXPECT_TRUE(bitwise_equal(mlp(*be, m.gate.weights, m.up.weights, m.down, x, rows), want)) << model << " layer " << l;
      // Gate/up in the wrong order (the stored one) against the ordered down: not the MLP.
      EXPECT_FALSE(bitwise_equal(mlp(*be, gate, up, m.down, x, rows), want));
    }
  }
}

TEST(MlpOrder, DenseDownAndBadShapes) {
  const char* model = "data/exl2-ref/llama-gqa/hf";
  EXL_REQUIRE_SHARED(model);
  ModelDir dir(test::shared_dir() / model);
  const int64_t H = dir.config().hidden_size, I = dir.config().intermediate_size;
  const LinearWeights gate = load_linear(dir, "model.layers.0.mlp.gate_proj", H, I),
                      up = load_linear(dir, "model.layers.0.mlp.up_proj", H, I),
                      down = load_linear(dir, "model.layers.0.mlp.down_proj", I, H);
  const OrderedMlp m = order_mlp_by_down(gate, up, down);
  EXPECT_FALSE(m.ordered);
  EXPECT_EQ(std::get<DenseMatrix>(m.gate.weights).data, std::get<DenseMatrix>(gate).data);
  EXPECT_EQ(std::get<DenseMatrix>(m.down).data, std::get<DenseMatrix>(down).data);
  // gate as down's input side: I output features expected, H given.
  EXPECT_THROW(order_mlp_by_down(down, up, down), Error);
}

}  // namespace
}  // namespace exl
