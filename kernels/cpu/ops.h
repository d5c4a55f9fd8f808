// CPU implementations of the backend ops, as free functions on host memory. They are both the
// CPU backend and the reference every other backend is tested against. Shapes as in backend.h.
#pragma once
#include <cstdint>
#include <span>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_layout.h"
#include "kernels/linear_weights.h"

namespace exl::cpu {

// y[rows, N] = x[rows, K] · Wᵀ (+ bias), decoding quantized weights on the fly.
void linear_exl2(ThreadPool& pool, const Exl2Matrix& w, const float* x, float* y, int64_t rows);
void linear_gptq(ThreadPool& pool, const GptqMatrix& w, const float* x, float* y, int64_t rows);
void linear_dense(ThreadPool& pool, const DenseMatrix& w, const float* x, float* y, int64_t rows);
void linear(ThreadPool& pool, const LinearWeights& w, const float* x, float* y, int64_t rows);

void embedding(const EmbeddingWeights& e, std::span<const int32_t> ids, float* out);
void rms_norm(ThreadPool& pool, const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps);
void rope(float* x, int64_t rows, int n_heads, int head_dim, std::span<const int32_t> positions,
          const RopeTable& table);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void add(float* x, const float* y, int64_t n);

// Paged KV storage on host memory: `pool` is num_pages · layout.page_bytes() bytes.
void kv_write(const KvLayout& layout, std::byte* pool, int layer, const float* k, const float* v,
              std::span<const int32_t> slots);
// Copies token slots [0, n_rows) of page `from` to page `to`, every layer, K and V, every head.
void kv_copy_rows(const KvLayout& layout, std::byte* pool, int from, int to, int n_rows);
// Reads positions [0, n_pos) of (layer, kv, head) for a sequence into out[n_pos, head_dim].
void kv_read(const KvLayout& layout, const std::byte* pool, int layer, int kv, int head,
             std::span<const int32_t> page_table, int64_t n_pos, float* out);
void attention(ThreadPool& tp, const KvLayout& layout, const std::byte* pool, int layer, const float* q, float* out,
               std::span<const SeqAttn> seqs, int n_heads, float scale, int sliding_window);

// One head vector to and from the storage format (layout.format), `scales` has blocks_per_vec().
void kv_encode(const KvLayout& layout, const float* x, std::byte* data, uint16_t* scales);
void kv_decode(const KvLayout& layout, const std::byte* data, const uint16_t* scales, float* x);

}  // namespace exl::cpu
