// Host-side error checking for CUDA runtime and cuBLAS calls: a failed call becomes exl::Error
// "kernels: cuda: <call>: <message>". For .cpp files only (nvcc never sees this header).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/error.h"

namespace exl::cuda {

[[noreturn]] inline void fail_cuda(const char* call, cudaError_t err) {
  fail("kernels: cuda: ", call, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

[[noreturn]] inline void fail_cublas(const char* call, cublasStatus_t st) {
  fail("kernels: cuda: ", call, ": cuBLAS ", cublasGetStatusName(st), ": ", cublasGetStatusString(st));
}

}  // namespace exl::cuda

#define EXL_CUDA_CHECK(call)                                           \
  do {                                                                 \
    const cudaError_t exl_cuda_err_ = (call);                          \
    if (exl_cuda_err_ != cudaSuccess) ::exl::cuda::fail_cuda(#call, exl_cuda_err_); \
  } while (0)

#define EXL_CUBLAS_CHECK(call)                                              \
  do {                                                                      \
    const cublasStatus_t exl_cublas_st_ = (call);                           \
    if (exl_cublas_st_ != CUBLAS_STATUS_SUCCESS) ::exl::cuda::fail_cublas(#call, exl_cublas_st_); \
  } while (0)
