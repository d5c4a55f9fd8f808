// Host side of the tensor-core prefill attention (prefill_attention.h): scratch sizing, query
// chunking and the cuBLAS calls. Host code only.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {

// A batch takes a long-prompt path — flash_attention.h's kernel for fp16 caches with head_dim 64
// or 128, else cuBLAS (every cache format; exact for q8/q4 caches, see prefill_attention.h) —
// when each sequence has at least k_prefill_attn_min_tokens new tokens and
// its keys times the query width (heads × head_dim) reach k_prefill_attn_min_work. Below that,
// the path's fixed cost (an fp16 copy of the whole context, pointer arrays, several launches per
// chunk) is more than the tiled kernel's whole time. H200, BENCHMARKS.md session 22: the demo
// model (6 × 64 query width, ~130 new of ~200 keys) prefilled 48 prompts in 50 ms on the tiled
// kernel against 76 ms through cuBLAS; llama2-7b (4,096 wide) is faster through cuBLAS from 64
// tokens (126 new tokens on 3,968 cached: 22.8 ms against 53.5; a 128-token prompt 10.3k against
// 9.7k tok/s).
inline constexpr int64_t k_prefill_attn_min_tokens = 64;
inline constexpr int64_t k_prefill_attn_min_work = int64_t(1) << 18;
inline bool prefill_attention_serves(int64_t n_tokens, int64_t n_keys, int n_heads, int head_dim,
                                     int64_t min_tokens = k_prefill_attn_min_tokens) {
  return n_tokens >= min_tokens && n_keys * n_heads * head_dim >= k_prefill_attn_min_work;
}

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
