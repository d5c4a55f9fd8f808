// The CUDA backend: the Backend interface (kernels/backend.h) on one NVIDIA GPU, float32
// activations in device memory, quantized weights kept packed on the device. Kernels live in
// kernels/cuda/ (see the headers there for each family's algorithm and precision). Builds
// without CUDA provide stubs that throw. Environment knobs for measurements: EXL_CUDA_PROFILE=1
// prints GPU time per op at destruction (cuda/op_profiler.h); EXL_CUDA_PREFILL_ATTN=0 keeps long
// prompts on the paged attention kernel instead of cuBLAS (cuda/cuda_prefill_attention.h; with q8/q4
// caches the cuBLAS path runs split-fp16, like linears_exact's GEMMs in cuda/cuda_linear.h);
// EXL_CUDA_ATTN_DECODE=0 keeps decode steps on the tiled attention kernel instead of the one-pass
// decode kernel (cuda/paged_attention.h) and EXL_CUDA_ATTN_DECODE_PART=128/256 fixes its partition
// size (cuda/attention_plan.h); EXL_CUDA_GEMV_BLOCKS_PER_SM sets the EXL2 gemv's grid
// (cuda/cuda_linear.h); EXL_CUDA_GRAPHS=0 runs steps op by op instead of as CUDA graphs
// (cuda/step_graph.h), EXL_CUDA_GRAPH_MULTI_AFTER=N captures a multi-position step (a speculative
// verify pass) once its shape was seen N times before (default 1; -1: never), and
// EXL_CUDA_GRAPH_STATS=1 prints how many steps ran as graphs at destruction.
#pragma once
#include <memory>

#include "kernels/backend.h"

namespace exl {

// A backend on CUDA device `device`. Throws exl::Error when the build has no CUDA backend or the
// device does not exist. Every op is queued on one stream; download() and synchronize() wait.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

// Device address of the bytes of a pool made by a CUDA backend's alloc_kv_pool
// (num_pages · layout.page_bytes(), kv_layout.h's format), for copying pages between backends
// and for tests. Throws exl::Error for a pool of another backend.
void* cuda_kv_pool_data(KvPool& pool);

// Measured device-to-device copy bandwidth of CUDA device `device` in bytes per second, counting
// bytes read plus bytes written: the median of 10 copies of `bytes` bytes after 2 warm-up copies
// (the memory-bound roofline that `exlagent bench` reports against). Throws without CUDA.
double cuda_copy_bandwidth(int device, size_t bytes = size_t(1) << 30);

// Steps (Backend::begin_step/end_step) that a CUDA backend ran as CUDA graphs, the graphs it
// captured for them (cuda/step_graph.h), and the ops that read their input as the previous op
// handed it off (cuda/handoff.h); then, of those, the steps with several positions for some
// sequence (speculative verify passes, short prefill chunks): how many were queued, how many ran
// as graphs, how many graphs were captured for them. For tests and benchmarks
// (EXL_CUDA_GRAPH_STATS=1 prints the counts when the backend is destroyed). Throws exl::Error for
// a backend that is not a CUDA backend.
struct CudaStepStats {
  int64_t graph_launches = 0, graph_captures = 0, handoffs = 0;
  int64_t multi_steps = 0, multi_graph_launches = 0, multi_graph_captures = 0;
};
CudaStepStats cuda_step_stats(const Backend& backend);

}  // namespace exl
