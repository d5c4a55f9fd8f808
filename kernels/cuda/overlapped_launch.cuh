// Programmatic dependent launch (compute capability 9.0+): a kernel launched overlapped may start
// while the stream's previous kernel is still running, so that its blocks set up (fetch weights,
// fill shared memory) during the other's tail; a CUDA graph captures the dependency as a
// programmatic edge. Such a kernel calls wait_for_inputs() before it reads anything an earlier
// kernel wrote and before it writes anything an earlier kernel may read (a scratch area); only
// work on data no kernel writes (weights) and on its own shared memory may come first. A kernel
// calls allow_dependents() where the next overlapped kernel may be launched (before that, at the
// latest when it exits). Both are no-ops before sm_90 and for kernels not launched overlapped.
#pragma once
#include <cuda_runtime_api.h>

namespace exl::cuda {

__device__ __forceinline__ void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel(args...) overlapped with the stream's previous kernel (for launchers that have
// CudaContext::overlapped_launches(); the others launch as usual).
template <typename... P, typename... A>
cudaError_t launch_overlapped(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              A... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace exl::cuda
