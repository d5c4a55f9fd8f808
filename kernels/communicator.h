// Collectives between the ranks of a tensor-parallel model (engine/tensor_parallel.h): one
// Backend per rank, all driven by one thread. Buffers are each rank's backend memory (from its
// alloc()); a collective is issued after every rank's ops that produce its inputs and returns
// with its outputs ready for each rank's next ops. The host communicator goes through host memory
// (download, sum or concatenate in rank order, upload), so its results do not depend on timing;
// an NCCL communicator (one stream per GPU, NCCL_NVLS_ENABLE=0) can implement the same interface.
// Not thread-safe: one thread owns a Communicator and the backends it was made with.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace exl {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int n_ranks() const = 0;
  // bufs[r] [n] on rank r: each becomes Σ over ranks of bufs[r], summed in rank order.
  virtual void all_reduce_sum(std::span<float* const> bufs, int64_t n) = 0;
  // in[r] [rows, widths[r]] on rank r → out[r] [rows, Σ widths] on every rank: rank r's columns
  // at offset Σ_{q<r} widths[q] of each row. in and out do not alias.
  virtual void all_gather_columns(std::span<const float* const> in, std::span<float* const> out, int64_t rows,
                                  std::span<const int64_t> widths) = 0;
};

// The argument checks every communicator makes (exl::Error naming `who` and the collective): one
// buffer per rank for all_reduce_sum; in, out and widths of one per rank for all_gather_columns,
// whose Σ widths check_gather_args returns.
inline void check_reduce_args(const char* who, size_t n_bufs, size_t n_ranks) {
  EXL_CHECK(n_bufs == n_ranks, who, ": all_reduce_sum: ", n_bufs, " buffers for ", n_ranks, " ranks");
}
inline int64_t check_gather_args(const char* who, size_t n_in, size_t n_out, std::span<const int64_t> widths,
                                 size_t n_ranks) {
  for (size_t n : {n_in, n_out, widths.size()})
    EXL_CHECK(n == n_ranks, who, ": all_gather_columns: ", n, " buffers for ", n_ranks, " ranks");
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  return total;
}

// The communicator through host memory over `ranks` (which must outlive it). Throws exl::Error
// for no ranks.
std::unique_ptr<Communicator> make_host_communicator(std::span<Backend* const> ranks);

// Whether this build has the NCCL communicator (CMake found NCCL beside the CUDA toolkit).
bool nccl_available();
// The NCCL communicator over CUDA backends `ranks` on CUDA devices `devices` (one each, distinct):
// collectives on streams of its own after each backend's queued ops, NCCL_NVLS_ENABLE=0 unless
// set. Throws exl::Error without NCCL or when NCCL fails.
std::unique_ptr<Communicator> make_nccl_communicator(std::span<Backend* const> ranks, std::span<const int> devices);

}  // namespace exl
