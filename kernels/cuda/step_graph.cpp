#include "kernels/cuda/step_graph.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace exl::cuda {

void StepGraphs::begin(CudaContext& ctx) {
  mode_ = enabled_ ? next_ : StepMode::eager;
  next_ = StepMode::record;
  notes_.clear();
  capturable_ = true;
  is_multi_ = false;
  if (mode_ == StepMode::eager) return;
  ctx.make_current();
  ctx.begin_step(mode_ == StepMode::capture, mode_ != StepMode::record);
  if (mode_ == StepMode::capture) {
    capture_begin_ = std::chrono::steady_clock::now();
    const cudaError_t e = cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
      cudaGetLastError();
      ctx.end_step();
      mode_ = StepMode::eager;
    }
  }
}

uint64_t StepGraphs::hash() const {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t w : notes_) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  }
  return h;
}

void StepGraphs::clear() {
  clears_ += !graphs_.empty();
  for (auto& [h, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  failed_.clear();
}

void StepGraphs::launch(Graph& g, CudaContext& ctx) {
  ctx.upload_staged();
  EXL_CUDA_CHECK(cudaGraphLaunch(g.exec, ctx.stream()));
  ++counts().launches;
  ++counts().steps;
  g.used = uint64_t(launches());
}

bool StepGraphs::end(CudaContext& ctx) {
  const StepMode m = mode_;
  mode_ = StepMode::eager;
  if (m == StepMode::eager) {
    ++counts().steps;
    return true;
  }
  const bool ok = ctx.end_step();
  const uint64_t h = hash();
  if (m == StepMode::capture) return finish_capture(ctx, h, ok);
  if (ctx.generation() != generation_) {  // a graph may point at memory freed since
    clear();
    generation_ = ctx.generation();
  }
  const auto it = graphs_.find(h);
  if (ok && it != graphs_.end() && it->second.notes == notes_) {
    launch(it->second, ctx);
    return true;
  }
  next_ = capturable_ && !failed_.count(h) ? StepMode::capture : StepMode::eager;
  if (next_ == StepMode::capture && is_multi_) {  // captured when it has come back often enough
    if (seen_.size() >= k_max_seen) seen_.clear();
    int& n = seen_[h];
    if (multi_after_ < 0 || (!at_once_ && n < multi_after_)) {
      n += n < multi_after_;
      next_ = StepMode::eager;
    }
  }
  return false;
}

bool StepGraphs::finish_capture(CudaContext& ctx, uint64_t h, bool ok) {
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(ctx.stream(), &graph);
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess && ok && capturable_) e = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (ctx.generation() != generation_) {  // the capture grew a scratch area: older graphs use the old one
    clear();
    generation_ = ctx.generation();
  }
  if (e != cudaSuccess || !ok || !capturable_ || !exec) {
    cudaGetLastError();
    if (exec) cudaGraphExecDestroy(exec);
    // A step that only grew an area is captured again next time; a failed capture is not retried.
    if (ok) failed_.insert(h);
    next_ = StepMode::eager;
    return false;
  }
  if (graphs_.size() >= k_max_graphs) {  // the least recently launched graph makes room
    const auto lru = std::min_element(graphs_.begin(), graphs_.end(),
                                      [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    if (lru->second.exec) cudaGraphExecDestroy(lru->second.exec);
    graphs_.erase(lru);
  }
  Graph& g = graphs_[h];
  if (g.exec) cudaGraphExecDestroy(g.exec);
  g.notes = notes_;
  g.exec = exec;
  ++counts().captures;
  seen_.erase(h);
  launch(g, ctx);
  counts().capture_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - capture_begin_).count();
  return true;
}

void StepGraphs::cancel(CudaContext& ctx) noexcept {
  if (mode_ == StepMode::capture) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(ctx.stream(), &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  if (mode_ != StepMode::eager) ctx.end_step();
  mode_ = StepMode::eager;
  next_ = StepMode::record;
}

}  // namespace exl::cuda
