// A tensor-parallel model on two CUDA devices (NCCL when the build has it) against one device:
// logits within 1e-3 relative in prefill, decode and chunked prefill. Skips with fewer than two
// CUDA devices.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_support.h"
#include "engine/model.h"
#include "kernels/communicator.h"
#include "test_support.h"

namespace exl {
namespace tp_cuda_test {

std::vector<float> run_chunks(Model& m, const std::vector<int32_t>& ids, int64_t chunk) {
  auto pool = m.alloc_kv_pool(KvFormat::fp16, 16, 4);
  const std::vector<int32_t> table{3, 0, 2, 1};
  std::vector<float> out;
  for (size_t b = 0; b < ids.size(); b += size_t(chunk)) {
    const size_t e = std::min(ids.size(), b + size_t(chunk));
    ForwardSeq s{std::span<const int32_t>(ids).subspan(b, e - b), int64_t(b), table, true};
    auto l = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(d / std::max(n, 1e-30));
}

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
    EXPECT_LE(rel_l2(run_chunks(tp, ids, chunk), run_chunks(single, ids, chunk)), 1e-3) << "chunk " << chunk;
}

}  // namespace tp_cuda_test
}  // namespace exl
