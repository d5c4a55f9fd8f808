// Host side of the tensor-core prefill attention (prefill_attention.h): scratch sizing, query
// chunking and the cuBLAS calls. Host code only.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {

// Prompts of at least this many tokens per sequence take the cuBLAS path (every cache format; exact
// for q8/q4 caches, see prefill_attention.h).
inline constexpr int64_t k_prefill_attn_min_tokens = 64;

struct PrefillAttnSeq {
  int64_t token_begin = 0, n_tokens = 0, pos_start = 0;
  const int32_t* pages = nullptr;  // device page table covering positions [0, pos_start + n_tokens)
};

// out rows of the sequence's tokens ([T, n_heads, D]) = causal attention of q over the pool's keys
// 0 .. pos_start + t (sliding `window` when > 0). `exact`: split-fp16 operands, fp32-level
// precision (three GEMMs per product instead of one). Queued on ctx's stream.
void prefill_attention(CudaContext& ctx, const uint8_t* pool, const KvDeviceLayout& layout, const float* q,
                       float* out, int n_heads, float scale, int window, const PrefillAttnSeq& seq, bool exact);

}  // namespace exl::cuda
