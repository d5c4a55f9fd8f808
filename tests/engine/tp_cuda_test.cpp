// A tensor-parallel model on two CUDA devices (NCCL when the build has it) against one device:
// logits within 1e-3 relative in prefill, decode and chunked prefill. Skips with fewer than two
// CUDA devices.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_support.h"
#include "engine/model.h"
#include "kernels/communicator.h"
#include "model_logits.h"
#include "test_support.h"

namespace exl {
namespace tp_cuda_test {

TEST(TensorParallelCuda, TwoDevicesComputeWhatOneComputes) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices (" << cuda_device_description() << ")";
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  ModelDir dir(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  auto one = make_cuda_backend(0);
  Model single(dir, *one);
  auto a = make_cuda_backend(0), b = make_cuda_backend(1);
  Backend* ranks[2] = {a.get(), b.get()};
  const int devices[2] = {0, 1};
  auto comm = nccl_available() ? make_nccl_communicator(ranks, devices) : make_host_communicator(ranks);
  Model tp(dir, ranks, *comm);
  std::vector<int32_t> ids{1};
  for (int i = 1; i < 40; ++i) ids.push_back(int32_t(3 + (i * 53) % 500));
  for (int64_t chunk : {40, 1, 9})
    EXPECT_LE(test::rel_l2(test::run_chunked(tp, ids, chunk), test::run_chunked(single, ids, chunk)), 1e-3)
        << "chunk " << chunk;
}

}  // namespace tp_cuda_test
}  // namespace exl
