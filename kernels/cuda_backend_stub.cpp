// The CUDA backend's entry points in a build without CUDA (the real ones are kernels/cuda/).
#ifndef EXL_HAVE_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/error.h"

namespace exl {

std::unique_ptr<Backend> make_cuda_backend(int) { fail("kernels: cuda: this build has no CUDA backend"); }

void* cuda_kv_pool_data(KvPool&) { fail("kernels: cuda: this build has no CUDA backend"); }

double cuda_copy_bandwidth(int, size_t) { fail("kernels: cuda: this build has no CUDA backend"); }

CudaStepStats cuda_step_stats(const Backend&) { fail("kernels: cuda: this build has no CUDA backend"); }

}  // namespace exl
#endif
