// The NCCL communicator (kernels/communicator.h), built when CMake finds NCCL beside the CUDA
// toolkit (EXL_HAVE_NCCL). Each rank's collective runs on a stream of the communicator's own,
// after the rank's backend has finished its queued ops (Backend::synchronize), and is waited for
// before returning: correct with any backend stream, not yet overlapped with compute.
#ifdef EXL_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <vector>

#include "kernels/communicator.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/error.h"

namespace exl {

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("kernels: nccl: ", what, ": ", ncclGetErrorString(r));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::span<Backend* const> ranks, std::span<const int> devices)
      : ranks_(ranks.begin(), ranks.end()), devices_(devices.begin(), devices.end()) {
    EXL_CHECK(!ranks_.empty() && ranks_.size() == devices_.size(), "kernels: nccl: ", ranks_.size(), " ranks for ",
              devices_.size(), " devices");
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast stays off unless the user asks
    comms_.resize(ranks_.size());
    nccl_check(ncclCommInitAll(comms_.data(), int(comms_.size()), devices_.data()), "ncclCommInitAll");
    streams_.resize(ranks_.size());
    staging_.resize(ranks_.size());
    staging_bytes_.assign(ranks_.size(), 0);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      EXL_CUDA_CHECK(cudaSetDevice(devices_[r]));
      EXL_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[r], cudaStreamNonBlocking));
    }
  }
  ~NcclCommunicator() override {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      cudaSetDevice(devices_[r]);
      if (staging_[r]) cudaFree(staging_[r]);
      if (streams_[r]) cudaStreamDestroy(streams_[r]);
      if (comms_[r]) ncclCommDestroy(comms_[r]);
    }
  }
  int n_ranks() const override { return int(ranks_.size()); }

  void all_reduce_sum(std::span<float* const> bufs, int64_t n) override {
    check_reduce_args("kernels: nccl", bufs.size(), ranks_.size());
    settle();
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (size_t r = 0; r < ranks_.size(); ++r)
      nccl_check(ncclAllReduce(bufs[r], bufs[r], size_t(n), ncclFloat, ncclSum, comms_[r], streams_[r]),
                 "ncclAllReduce");
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    wait();
  }

  void all_gather_columns(std::span<const float* const> in, std::span<float* const> out, int64_t rows,
                          std::span<const int64_t> widths) override {
    const int64_t total = check_gather_args("kernels: nccl", in.size(), out.size(), widths, ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) grow_staging(r, size_t(rows * total) * sizeof(float));
    settle();
    // Each rank's block, broadcast whole ([rows, width] contiguous) into every rank's staging ...
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    int64_t offset = 0;
    for (size_t q = 0; q < ranks_.size(); ++q) {
      for (size_t r = 0; r < ranks_.size(); ++r)
        nccl_check(ncclBroadcast(in[r], static_cast<float*>(staging_[r]) + rows * offset, size_t(rows * widths[q]),
                                 ncclFloat, int(q), comms_[r], streams_[r]),
                   "ncclBroadcast");
      offset += widths[q];
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    // ... then placed side by side in each row of out.
    for (size_t r = 0; r < ranks_.size(); ++r) {
      EXL_CUDA_CHECK(cudaSetDevice(devices_[r]));
      offset = 0;
      for (size_t q = 0; q < ranks_.size(); ++q) {
        if (widths[q] > 0)
          EXL_CUDA_CHECK(cudaMemcpy2DAsync(out[r] + offset, size_t(total) * 4,
                                           static_cast<float*>(staging_[r]) + rows * offset, size_t(widths[q]) * 4,
                                           size_t(widths[q]) * 4, size_t(rows), cudaMemcpyDeviceToDevice, streams_[r]));
        offset += widths[q];
      }
    }
    wait();
  }

 private:
  void settle() {
    for (Backend* b : ranks_) b->synchronize();
  }
  void wait() {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      EXL_CUDA_CHECK(cudaSetDevice(devices_[r]));
      EXL_CUDA_CHECK(cudaStreamSynchronize(streams_[r]));
    }
  }
  void grow_staging(size_t r, size_t bytes) {
    if (bytes <= staging_bytes_[r]) return;
    EXL_CUDA_CHECK(cudaSetDevice(devices_[r]));
    if (staging_[r]) EXL_CUDA_CHECK(cudaFree(staging_[r]));
    staging_[r] = nullptr;
    EXL_CUDA_CHECK(cudaMalloc(&staging_[r], bytes));
    staging_bytes_[r] = bytes;
  }
  std::vector<Backend*> ranks_;
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<void*> staging_;
  std::vector<size_t> staging_bytes_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(std::span<Backend* const> ranks, std::span<const int> devices) {
  return std::make_unique<NcclCommunicator>(ranks, devices);
}

}  // namespace exl
#endif
