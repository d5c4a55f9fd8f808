#include "kernels/cuda_device.h"

#ifdef EXL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "kernels/error.h"

namespace exl {

#ifdef EXL_HAVE_CUDA
int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_device_description() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cat("no CUDA device: ", cudaGetErrorString(err));
  }
  if (n == 0) return "no CUDA device found";
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  return cat(p.name, " (sm_", p.major, p.minor, ", ", double(p.totalGlobalMem) / double(1ull << 30), " GiB)");
}
#else
int cuda_device_count() { return 0; }
std::string cuda_device_description() { return "this build has no CUDA backend (configure with nvcc present)"; }
#endif

}  // namespace exl
