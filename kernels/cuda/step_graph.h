// Replay of whole decode steps as CUDA graphs (Backend::begin_step / end_step). A step is first
// recorded: every op validates and stages its host arrays into a pinned ring (at the same offsets
// every other step: two rings in turn, CudaContext::begin_step) and notes the values that determine
// its launches (device pointers, sizes, scalars, the attention plan's shape), but queues nothing.
// When a graph with the same notes exists and no device allocation happened since it was captured,
// it is launched: its copy nodes read the freshly staged host bytes, so positions, slots and page
// tables are per-step data, not part of the graph. Otherwise the ops are issued again under stream
// capture (relaxed mode; a scratch area that grows meanwhile makes that step run op by op and the
// next one capture again) and the new graph is kept, at most k_max_graphs of them (a new batch size
// or attention plan shape is a new graph). A step whose capture fails, or that uses a path unsafe
// to capture (cuBLAS), runs op by op instead. Disabled by EXL_CUDA_GRAPHS=0 or when profiling.
// Owned and used by one thread (the backend's).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/cuda_context.h"

namespace exl::cuda {

enum class StepMode { eager, record, capture };

class StepGraphs {
 public:
  static constexpr size_t k_max_graphs = 64;

  explicit StepGraphs(bool enabled) : enabled_(enabled) {}
  ~StepGraphs() { clear(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  StepMode mode() const { return mode_; }
  // True while recording: ops stage and note, but queue nothing.
  bool recording() const { return mode_ == StepMode::record; }
  // Appends what determines an op's launches to the step's notes (pointers, integers, floats).
  template <typename... A>
  void note(const A&... a) {
    if (mode_ != StepMode::eager) (push(a), ...);
  }
  // The step may not be captured (its ops use a library that is not safe to capture).
  void forbid_capture() {
    if (mode_ != StepMode::eager) capturable_ = false;
  }

  void begin(CudaContext& ctx);
  // True when the step's work is queued (graph launched, or ops issued one by one).
  bool end(CudaContext& ctx);
  void cancel(CudaContext& ctx) noexcept;
  int64_t launches() const { return launches_; }
  int64_t captures() const { return captures_; }

 private:
  struct Graph {
    std::vector<uint64_t> notes;
    cudaGraphExec_t exec = nullptr;
  };
  template <typename T>
  void push(const T& v) {
    if constexpr (std::is_pointer_v<T>) notes_.push_back(uint64_t(reinterpret_cast<uintptr_t>(v)));
    else if constexpr (std::is_floating_point_v<T>) {
      const double d = double(v);
      uint64_t u = 0;
      std::memcpy(&u, &d, sizeof u);
      notes_.push_back(u);
    } else notes_.push_back(static_cast<uint64_t>(v));
  }
  uint64_t hash() const;
  bool finish_capture(CudaContext& ctx, uint64_t h, bool ok);
  void clear();

  bool enabled_ = true, capturable_ = true;
  StepMode mode_ = StepMode::eager, next_ = StepMode::record;
  std::vector<uint64_t> notes_;
  std::unordered_map<uint64_t, Graph> graphs_;
  std::unordered_set<uint64_t> failed_;
  uint64_t generation_ = 0;
  int64_t launches_ = 0, captures_ = 0;
};

}  // namespace exl::cuda
