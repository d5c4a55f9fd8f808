// The memory plan against a real device (skips without one): the planned weight bytes match the
// device memory Model construction takes, an impossible explicit cache fails before anything is
// allocated, and an automatic cache that fills the device leaves the scratch reserve free.
// The model is a synthetic EXL2 model (~550 MB) large enough that the driver's 2 MiB pages are
// noise against the 3% tolerance.
#include <gtest/gtest.h>

#include "engine/formats/exl2_synth.h"
#include "engine/memory_plan.h"
#include "engine/model.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "kernels/error.h"
#include "cuda_test_support.h"
#include "test_support.h"

namespace exl {
namespace memory_plan_cuda_test {

const std::filesystem::path& synth_model() {
  static const std::filesystem::path dir = [] {
    auto d = test::temp_dir("memplan-synth");
    SynthShape s{"memplan", "LlamaForCausalLM", 4096, 11008, 2, 32, 8, 128, 32000, 4096, 10000.0, nullptr, false};
    write_synth_exl2(s, 4.0, 6, {}, d, 11);
    return d;
  }();
  return dir;
}

int64_t free_bytes(const Backend& be) { return int64_t(be.device_memory().value().free_bytes); }

TEST(MemoryPlanCuda, WeightBytesMatchTheDeviceMemoryModelTakes) {
  EXL_REQUIRE_CUDA();
  ModelDir dir(synth_model());
  auto be = make_cuda_backend(0);
  ASSERT_TRUE(be->device_memory().has_value());
  const MemoryPlan plan = plan_memory(dir, {}, be->device_memory());
  be->synchronize();
  const int64_t before = free_bytes(*be);
  {
    Model m(dir, *be);
    be->synchronize();
    const int64_t used = before - free_bytes(*be);
    std::cout << "planned " << plan.weight_bytes << " B, device used " << used << " B\n";
    EXPECT_GT(plan.weight_bytes, int64_t(400) << 20);
    EXPECT_NEAR(double(used), double(plan.weight_bytes), 0.03 * double(plan.weight_bytes) + double(4 << 20));
  }
  be->synchronize();
  EXPECT_NEAR(double(free_bytes(*be)), double(before), double(4 << 20));
}

TEST(MemoryPlanCuda, ImpossibleExplicitCacheFailsBeforeAllocating) {
  EXL_REQUIRE_CUDA();
  ModelDir dir(synth_model());
  auto be = make_cuda_backend(0);
  const DeviceMemory mem = be->device_memory().value();
  MemoryRequest req;
  const MemoryPlan probe = plan_memory(dir, req, mem);
  req.cache_pages = int(std::min<int64_t>(int64_t(mem.total_bytes) / probe.page_bytes + 1, (int64_t(1) << 31) / 64 - 1));
  be->synchronize();
  const int64_t before = free_bytes(*be);
  MemoryPlan plan;
  try {
    auto m = load_planned_model(dir, *be, req, plan);
    FAIL() << "loaded with " << req.cache_pages << " cache pages";
  } catch (const Error& e) {
    const std::string msg = e.what();
    std::cout << msg << "\n";
    EXPECT_EQ(msg.rfind("engine: memory plan: model '", 0), 0u) << msg;
    EXPECT_NE(msg.find(cat(plan.cache_tokens, " tokens, fp16) + ")), std::string::npos) << msg;
    EXPECT_NE(msg.find("but device 0 has "), std::string::npos) << msg;
  }
  EXPECT_FALSE(plan.fits);
  be->synchronize();
  EXPECT_NEAR(double(free_bytes(*be)), double(before), double(4 << 20));
}

TEST(MemoryPlanCuda, AutomaticCacheFillsTheDeviceButLeavesTheReserve) {
  EXL_REQUIRE_CUDA();
  ModelDir dir(synth_model());
  auto be = make_cuda_backend(0);
  MemoryRequest req;
  req.max_batch_seqs = 64;
  req.max_seq_len = int64_t(1) << 20;  // a cap far above the device: memory decides
  MemoryPlan plan;
  auto m = load_planned_model(dir, *be, req, plan);
  ASSERT_TRUE(plan.fits);
  ASSERT_TRUE(plan.cache_auto);
  EXPECT_LT(plan.cache_pages, plan.max_pages);
  auto pool = be->alloc_kv_pool(m->kv_layout(KvFormat::fp16, 64), plan.cache_pages);
  be->synchronize();
  const int64_t left = free_bytes(*be);
  std::cout << plan.cache_pages << " pages, " << left << " B left, reserve " << plan.scratch_bytes << " + margin "
            << plan.margin_bytes << "\n";
  EXPECT_GE(double(left), 0.97 * double(plan.scratch_bytes + plan.margin_bytes) - double(4 << 20));
  EXPECT_LE(double(left), double(plan.scratch_bytes + plan.margin_bytes + plan.page_bytes) +
                              0.03 * double(plan.weight_bytes) + double(8 << 20));
}

}  // namespace memory_plan_cuda_test
}  // namespace exl
