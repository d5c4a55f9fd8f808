// EXL_HD marks small inline functions compiled for both the GPU (under nvcc) and the host, so the
// CUDA kernels' arithmetic can be unit-tested on a machine without a GPU. No CUDA headers here.
#pragma once

#if defined(__CUDACC__)
#define EXL_HD __host__ __device__ __forceinline__
#else
#define EXL_HD inline
#endif
