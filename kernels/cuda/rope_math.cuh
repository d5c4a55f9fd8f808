// Rotary embedding arithmetic shared by the rope kernels (norm_rope_act.cu) and the q/k/v gemv's
// tile epilogue (exl2_gemm.cu), so that both rotate bit for bit alike: the angle in double,
// cos/sin scaled by attn_factor and rounded to float, pairs (i, i + half) of a head.
#pragma once
#include <cuda_runtime.h>

namespace exl::cuda {

__device__ __forceinline__ void rope_cos_sin(int pos, float inv_freq, float attn_factor, float& cs, float& sn) {
  double s, c;
  sincos(double(pos) * double(inv_freq), &s, &c);
  cs = float(c * double(attn_factor));
  sn = float(s * double(attn_factor));
}

__device__ __forceinline__ void rope_rotate(float* head, int i, int half, float cs, float sn) {
  const float a = head[i], b = head[i + half];
  head[i] = a * cs - b * sn;
  head[i + half] = b * cs + a * sn;
}

}  // namespace exl::cuda
