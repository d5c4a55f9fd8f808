// The NCCL communicator (kernels/communicator.h) against the host one: the same sums and column
// gathers, on one rank per CUDA device (one rank on a one-GPU machine). Skips without NCCL in the
// build or without a CUDA device.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/communicator.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"

namespace exl {
namespace nccl_communicator_test {

TEST(NcclCommunicator, SumsAndGathersAsTheHostCommunicatorDoes) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_device_description();
  const int n = std::min(cuda_device_count(), 4);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> ranks;
  std::vector<int> devices;
  for (int d = 0; d < n; ++d) owned.push_back(make_cuda_backend(d)), ranks.push_back(owned.back().get()), devices.push_back(d);
  auto nccl = make_nccl_communicator(ranks, devices);
  auto host = make_host_communicator(ranks);
  const int64_t rows = 3;
  std::vector<int64_t> widths;
  for (int r = 0; r < n; ++r) widths.push_back(32 * (r + 1));
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  // Rank r's input [rows, widths[r]] and a [rows, total] buffer to sum.
  std::vector<Buffer> in, out_nccl, out_host, sum_nccl, sum_host;
  std::vector<const float*> in_ptrs;
  std::vector<float*> on, oh, sn, sh;
  for (int r = 0; r < n; ++r) {
    Backend& be = *ranks[size_t(r)];
    std::vector<float> x(size_t(rows * widths[size_t(r)])), s(size_t(rows * total));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(r * 1000 + int(i));
    for (size_t i = 0; i < s.size(); ++i) s[i] = float(r + 1) * 0.5f + float(i);
    in.push_back(be.alloc(x.size() * 4)), be.upload(in.back().data(), x.data(), x.size() * 4);
    for (auto* v : {&sum_nccl, &sum_host}) v->push_back(be.alloc(s.size() * 4)), be.upload(v->back().data(), s.data(), s.size() * 4);
    out_nccl.push_back(be.alloc(size_t(rows * total) * 4)), out_host.push_back(be.alloc(size_t(rows * total) * 4));
    in_ptrs.push_back(in.back().f32()), on.push_back(out_nccl.back().f32()), oh.push_back(out_host.back().f32());
    sn.push_back(sum_nccl.back().f32()), sh.push_back(sum_host.back().f32());
  }
  nccl->all_gather_columns(in_ptrs, on, rows, widths);
  host->all_gather_columns(in_ptrs, oh, rows, widths);
  nccl->all_reduce_sum(sn, rows * total);
  host->all_reduce_sum(sh, rows * total);
  for (int r = 0; r < n; ++r) {
    std::vector<float> a(size_t(rows * total)), b(a.size());
    ranks[size_t(r)]->download(a.data(), on[size_t(r)], a.size() * 4);
    ranks[size_t(r)]->download(b.data(), oh[size_t(r)], b.size() * 4);
    EXPECT_EQ(a, b) << "gather, rank " << r;
    ranks[size_t(r)]->download(a.data(), sn[size_t(r)], a.size() * 4);
    ranks[size_t(r)]->download(b.data(), sh[size_t(r)], b.size() * 4);
    EXPECT_EQ(a, b) << "sum, rank " << r;
  }
}

}  // namespace nccl_communicator_test
}  // namespace exl
