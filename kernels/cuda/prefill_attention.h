// Causal attention for long prompts on tensor cores, through cuBLAS (kernels in
// prefill_attention.cu, orchestration in cuda_prefill_attention.cpp). For one sequence:
//   1. gather_kv: the sequence's keys and values, positions [0, n_keys), from the paged pool (any
//      cache format) into contiguous fp16 K, V [n_kv_heads, n_keys, D];
//   2. per chunk of query tokens, batched over query heads: S = scale · Q·Kᵀ (fp16 inputs, fp32
//      accumulate and output), then causal_softmax writes P in fp16 (0 outside the causal window),
//      then out = P·V (fp32 accumulate) written straight into the [T, n_heads, D] output.
// Queries are rounded to fp16 (the cache's fp16 format stores K/V at that precision already).
// The exact variant (q8/q4 caches, whose quantization steps magnify rounding differences in the
// next layers' K/V) carries Q, K, V and P as split-fp16 pairs (split_half, dense_gemm.h) and
// forms each product from three tensor-core GEMMs, keeping fp32-level precision.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {

// K16/V16 [n_kv_heads, n_keys, D] (fp16 bits) = pool positions [0, n_keys) of one sequence whose
// page table (device) is `pages`; with k16_lo/v16_lo non-null, the split pairs (hi, lo) instead.
cudaError_t gather_kv(const uint8_t* pool, const KvDeviceLayout& layout, const int32_t* pages, int n_keys,
                      uint16_t* k16, uint16_t* v16, uint16_t* k16_lo, uint16_t* v16_lo, cudaStream_t stream);

// For `heads` × `rows` score rows of length n_keys (row (h, t) at s + (h·rows + t)·n_keys): query
// t sits at position pos0 + t and sees keys j with lo ≤ j ≤ pos0 + t, lo = max(0, pos0 + t −
// window + 1) when window > 0 else 0. Writes p (same layout, fp16) = softmax over those keys, 0
// elsewhere; with p_lo non-null, p and p_lo hold the split pairs.
cudaError_t causal_softmax(const float* s, uint16_t* p, uint16_t* p_lo, int heads, int rows, int n_keys, int pos0,
                           int window, cudaStream_t stream);

}  // namespace exl::cuda
