// The device side of split_half (dense_gemm.h): one fp32 value as the fp16 pair (hi, lo) with
// x ≈ hi + lo / k_split_lo_scale, both saturated at ±65504. Shared by every kernel that writes
// operands of a split-fp16 (exact) tensor-core product.
#pragma once
#include <cuda_fp16.h>

#include "kernels/cuda/dense_gemm.h"

namespace exl::cuda {

__device__ __forceinline__ void split_to_half(float x, __half& hi, __half& lo) {
  hi = __float2half_rn(fminf(fmaxf(x, -65504.0f), 65504.0f));
  lo = __float2half_rn(fminf(fmaxf((x - __half2float(hi)) * k_split_lo_scale, -65504.0f), 65504.0f));
}

}  // namespace exl::cuda
