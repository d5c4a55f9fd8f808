// exlagent synth: the random-weight EXL2 model loads through the strict loaders, has the
// requested bit layout, and runs to finite logits.
#include "engine/formats/exl2_synth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/model_summary.h"
#include "engine/formats/safetensors.h"
#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace exl2_synth_test {

TEST(Exl2Synth, TinyModelLoadsWithTheRequestedBitsAndRuns) {
  for (double bpw : {3.0, 4.0, 5.5}) {
    const auto dir = test::temp_dir(cat("synth-", bpw));
    write_synth_exl2(*synth_shape("tiny"), bpw, 6, {}, dir, 7);
    ModelDir md(dir);
    auto summary = summarize_model(md);
    EXPECT_NEAR(summary.avg_bpw_layers, bpw + 0.2, 0.2) << bpw;  // +0.125 bpw of invperm at this tiny width
    EXPECT_EQ(summary.head_bits, 6);
    auto be = make_cpu_backend(2);
    Model m(md, *be);
    auto pool = be->alloc_kv_pool(m.kv_layout(KvFormat::f32, 16), 2);
    std::vector<int32_t> ids = {1, 5, 9, 200, 300}, table = {0, 1};
    ForwardSeq s{ids, 0, table, true};
    auto logits = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    // Linears that read the same input share its act-order permutation, as in converter output.
    SafetensorsFile f(dir / "output.safetensors");
    auto perm = [&](const std::string& name) {
      const TensorInfo* t = f.find("model.layers.1." + name + ".q_invperm");
      EXPECT_NE(t, nullptr) << name;
      const auto d = t ? f.view(*t).data : std::span<const std::byte>{};
      return std::vector<std::byte>(d.begin(), d.end());
    };
    EXPECT_EQ(perm("self_attn.k_proj"), perm("self_attn.q_proj"));
    EXPECT_EQ(perm("self_attn.v_proj"), perm("self_attn.q_proj"));
    EXPECT_EQ(perm("mlp.up_proj"), perm("mlp.gate_proj"));
    EXPECT_NE(perm("mlp.gate_proj"), perm("self_attn.q_proj"));
    EXPECT_NE(perm("self_attn.o_proj"), perm("self_attn.q_proj"));
  }
  EXPECT_FALSE(synth_shape("gpt5").has_value());
  EXPECT_THROW(write_synth_exl2(*synth_shape("tiny"), 9.0, 6, {}, test::temp_dir("synth-bad"), 1), Error);
}

}  // namespace exl2_synth_test
}  // namespace exl
