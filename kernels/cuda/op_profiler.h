// GPU time per backend op, for finding where a forward pass spends its time: when enabled, each
// op queues a CUDA event before and after its kernels; at each synchronisation the finished
// pairs are read and summed per key (op name, plus shape for linears). Enabled by
// EXL_CUDA_PROFILE=1 in the environment; report() prints the table (the CUDA backend does so on
// destruction). Disabled, every call is a branch. Owned and used by one thread (the backend's).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace exl::cuda {

class OpProfiler {
 public:
  OpProfiler();
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  bool enabled() const { return enabled_; }
  // Marks the start / end of one op on `stream`; `bytes` is what the op must read (0: unknown).
  void begin(cudaStream_t stream);
  void end(cudaStream_t stream, std::string key, double bytes = 0);
  // Reads the events of finished ops (call after the stream was synchronised).
  void collect();
  std::string report() const;

 private:
  struct Pending {
    cudaEvent_t a, b;
    std::string key;
    double bytes;
  };
  struct Total {
    int64_t count = 0;
    double ms = 0, bytes = 0;
  };
  cudaEvent_t take();
  bool enabled_ = false;
  std::vector<cudaEvent_t> free_;
  std::vector<Pending> pending_;
  cudaEvent_t open_ = nullptr;
  std::map<std::string, Total> totals_;
};

}  // namespace exl::cuda
