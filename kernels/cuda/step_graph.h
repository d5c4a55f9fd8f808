// Replay of whole steps as CUDA graphs (Backend::begin_step / end_step). A step is first
// recorded: every op validates and stages its host arrays into a pinned ring (at the same device
// addresses every step: CudaContext::begin_step) and notes the values that determine its launches
// (device pointers, sizes, scalars, the attention plan's shape), but queues nothing. When a graph
// with the same notes exists and no device allocation happened since it was captured, the staged
// bytes are copied up in one copy (CudaContext::upload_staged) and the graph is launched, so
// positions, slots and page tables are per-step data, not part of the graph. Otherwise the ops are
// issued again under stream capture (relaxed mode; a scratch area that grows meanwhile makes that
// step run op by op and the next one capture again) and the new graph is kept, at most
// k_max_graphs of them, the least recently launched one making room (a new batch size or
// attention plan shape is a new graph). A step whose capture fails, or that uses a path unsafe to
// capture (cuBLAS), runs op by op instead.
// Steps of several positions per sequence (speculative verify passes, short prefill chunks:
// mark_multi()) are captured only when their notes were seen `multi_after` times before (run op by
// op meanwhile), so that a shape that does not come back costs a recording pass, not a capture;
// multi_after < 0: never. Disabled by EXL_CUDA_GRAPHS=0 or when profiling.
// Owned and used by one thread (the backend's).
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
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
  static constexpr size_t k_max_graphs = 256;
  // Notes of uncaptured multi-position steps remembered (then forgotten all at once).
  static constexpr size_t k_max_seen = 4096;

  // Counts for one kind of step (one position per sequence, or several).
  struct Counts {
    int64_t steps = 0;       // steps queued (replayed, captured or op by op)
    int64_t launches = 0;    // of them, run as a graph
    int64_t captures = 0;    // graphs captured
    double capture_s = 0.0;  // host time of the captured steps, from begin() to the launch
  };

  explicit StepGraphs(bool enabled, int multi_after = 1) : enabled_(enabled), multi_after_(multi_after) {}
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
  // The step has several positions for some sequence (begin() clears it).
  void mark_multi() { is_multi_ = true; }
  // While on, a multi-position shape is captured the first time it is seen (Backend::
  // record_steps_at_once), unless multi_after < 0 (never).
  void set_record_at_once(bool on) { at_once_ = on; }

  void begin(CudaContext& ctx);
  // True when the step's work is queued (graph launched, or ops issued one by one).
  bool end(CudaContext& ctx);
  void cancel(CudaContext& ctx) noexcept;
  int64_t launches() const { return one_.launches + multi_.launches; }
  int64_t captures() const { return one_.captures + multi_.captures; }
  const Counts& one_position() const { return one_; }
  const Counts& multi_position() const { return multi_; }
  // Times every graph was dropped because a device allocation happened since it was captured.
  int64_t clears() const { return clears_; }

 private:
  struct Graph {
    std::vector<uint64_t> notes;
    cudaGraphExec_t exec = nullptr;
    uint64_t used = 0;  // the launch count when last launched
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
  void launch(Graph& g, CudaContext& ctx);
  Counts& counts() { return is_multi_ ? multi_ : one_; }
  void clear();

  bool enabled_ = true, capturable_ = true, is_multi_ = false, at_once_ = false;
  StepMode mode_ = StepMode::eager, next_ = StepMode::record;
  std::vector<uint64_t> notes_;
  std::unordered_map<uint64_t, Graph> graphs_;
  int multi_after_ = 1;
  std::unordered_set<uint64_t> failed_;
  std::unordered_map<uint64_t, int> seen_;  // multi-position notes not captured: times seen
  uint64_t generation_ = 0;
  Counts one_, multi_;
  int64_t clears_ = 0;
  std::chrono::steady_clock::time_point capture_begin_;
};

}  // namespace exl::cuda
