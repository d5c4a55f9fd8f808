// Element-wise and per-row ops on the GPU (kernels in norm_rope_act.cu), float32 activations.
// Integer arguments (ids, positions) and tables are device pointers, staged by the caller.
// Semantics are exactly those of kernels/cpu/elementwise.cpp:
//   - rms_norm: one block per row, sum of squares in double; x and y may alias;
//   - rope: rotate_half pairs (i, i+D/2); cos/sin of pos·inv_freq[i] evaluated in double, times
//     attn_factor, rounded to float once per row (so long positions lose nothing);
//   - swiglu: silu(gate)·up; add: x += y;
//   - embedding: rows of an f32/f16/bf16 table to float.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/exl2_gemm.h"
#include "kernels/cuda/paged_attention.h"

#include "kernels/cuda/dense_gemm.h"

namespace exl::cuda {

cudaError_t rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                     cudaStream_t stream);
// rms_norm's rows ⊙ w written staged for the tensor-core set that reads them (`to`: K = dim, rows
// = rows), not as floats.
cudaError_t rms_norm_stage(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                           const Exl2MmaStaging& to, cudaStream_t stream);
cudaError_t rope(float* x, int64_t rows, int n_heads, int head_dim, const int32_t* positions, const float* inv_freq,
                 float attn_factor, cudaStream_t stream);
// rope of q [rows, n_heads·D] and k [rows, n_kv_heads·D] in one launch.
cudaError_t rope_qk(float* q, float* k, int64_t rows, int n_heads, int n_kv_heads, int head_dim,
                    const int32_t* positions, const float* inv_freq, float attn_factor, cudaStream_t stream);
// rope_qk, then k and v [rows, n_kv_heads·D] stored into cache slots[rows] of the pool (as
// kv_write in paged_attention.h), in one launch.
cudaError_t rope_qk_store(float* q, float* k, const float* v, int64_t rows, int n_heads, int n_kv_heads, int head_dim,
                          const int32_t* positions, const float* inv_freq, float attn_factor, uint8_t* pool,
                          const KvDeviceLayout& layout, const int32_t* slots, cudaStream_t stream);
// x += y, then out = rms_norm(x) ⊙ w, one block per row (x and out must not alias).
cudaError_t add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t dim, float eps,
                         cudaStream_t stream);
cudaError_t swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
cudaError_t add(float* x, const float* y, int64_t n, cudaStream_t stream);
// out[i] = table[ids[i]] (device ids); an id outside [0, vocab) gives a row of zeros.
cudaError_t embedding(DenseType type, const void* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n_ids,
                      float* out, cudaStream_t stream);

}  // namespace exl::cuda
