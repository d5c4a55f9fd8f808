#include "kernels/cuda/op_profiler.h"

#include <algorithm>
#include <sstream>

#include "kernels/cuda/cuda_check.h"
#include "kernels/env_switch.h"

namespace exl::cuda {

OpProfiler::OpProfiler() {
  enabled_ = env_is("EXL_CUDA_PROFILE", "1");
}

OpProfiler::~OpProfiler() {
  for (auto& p : pending_) free_.push_back(p.a), free_.push_back(p.b);
  if (open_) free_.push_back(open_);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::take() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  EXL_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void OpProfiler::begin(cudaStream_t stream) {
  if (!enabled_) return;
  if (!open_) open_ = take();
  EXL_CUDA_CHECK(cudaEventRecord(open_, stream));
}

void OpProfiler::end(cudaStream_t stream, std::string key, double bytes) {
  if (!enabled_ || !open_) return;
  cudaEvent_t b = take();
  EXL_CUDA_CHECK(cudaEventRecord(b, stream));
  pending_.push_back({open_, b, std::move(key), bytes});
  open_ = nullptr;
}

void OpProfiler::collect() {
  if (!enabled_) return;
  for (auto& p : pending_) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p.a, p.b) == cudaSuccess) {
      Total& t = totals_[p.key];
      ++t.count;
      t.ms += ms;
      t.bytes += p.bytes;
    }
    free_.push_back(p.a);
    free_.push_back(p.b);
  }
  pending_.clear();
}

std::string OpProfiler::report() const {
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double all = 0;
  for (const auto& r : rows) all += r.second.ms;
  std::ostringstream os;
  os << "cuda op profile (GPU time between events around each op; total " << all << " ms)\n";
  for (const auto& [key, t] : rows) {
    os << "  " << key << ": " << t.count << " calls, " << t.ms << " ms, " << 1e3 * t.ms / double(t.count) << " us/call";
    if (t.bytes > 0) os << ", " << t.bytes / (t.ms * 1e-3) / 1e9 << " GB/s";
    os << "\n";
  }
  return os.str();
}

}  // namespace exl::cuda
