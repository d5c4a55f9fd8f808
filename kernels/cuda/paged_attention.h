// Paged KV cache writes and causal attention on the GPU (kernels in paged_attention.cu). The
// pool's bytes follow kernels/kv_layout.h exactly, so pages are interchangeable with the CPU's.
//
// Attention work is split by the host (attention_plan.h) into blocks, each one AttnWork: up to
// k_attn_rows query rows of one sequence that share a kv head (row r = token r / group, query
// head kv_head·group + r % group), over one partition of `part_size` positions. Each block keeps
// an online softmax per row (running max, sum and weighted V in fp32) while it streams K/V tiles
// of k_attn_tile positions, decoded from the cache format into shared memory (fp16 caches with
// head_dim % 8 == 0 in 16-byte loads, all of a tile's loads in flight at once). When every row
// fits in one partition (`direct`), blocks write normalized output; otherwise they write
// partials (max, sum, acc) that attention_combine merges per row (flash-decoding).
//
// attention_decode is the one-query-token-per-sequence case (decode steps) for fp16, q8 and q4
// caches with head_dim k_attn_decode_head_dim: a block per (kv head, sequence, partition of
// k_attn_decode_part, _short or _stream positions, as the plan chooses) loads the
// partition's K and V rows into registers with every load
// in flight, scores all of its group's query heads (half a warp per position), and weights V (a
// warp per position residue); one pass instead of a tile loop, for the latency-bound short
// contexts of decode. Partials go to the same attention_combine when a row spans partitions.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace exl::cuda {

inline constexpr int k_attn_rows = 16;       // query rows per block (4 warps × 4 rows)
inline constexpr int k_attn_tile = 32;       // positions per K/V tile
inline constexpr int k_attn_max_head_dim = 256;
inline constexpr int k_attn_decode_part = 256;      // positions per attention_decode block
inline constexpr int k_attn_decode_part_short = 128;  // the other partition sizes it is built for
// The streaming form's partitions, for grids of many (kv head, sequence) pairs (attention_plan.h
// says when): blocks of 4 warps that loop over the partition in chunks of 8 or 16 positions.
inline constexpr int k_attn_decode_part_stream = 512;
inline constexpr int k_attn_decode_head_dim = 128;  // the only head_dim attention_decode serves
inline constexpr int k_attn_decode_max_group = 8;   // query heads per kv head it serves
// With AttnArgs::cluster, a direct decode plan's partition is split over a thread block cluster
// of part_size / this many blocks (4 or 8), which merge their softmax partials in distributed
// shared memory: 4–8 times the multiprocessors for a short context's K/V, no combine launch.
inline constexpr int k_attn_decode_cluster_part = 32;

// The pool's geometry for one layer (byte sizes from KvLayout).
struct KvDeviceLayout {
  int n_kv_heads = 0, head_dim = 0, page_size = 0;
  int format = 0;  // KvFormat: 0 f32, 1 fp16, 2 q8, 3 q4
  int block = 0;   // elements per scale
  int layer = 0;
  int64_t page_bytes = 0, vec_bytes = 0, vec_scale_bytes = 0, scales_offset = 0;  // scales_offset = n_vecs·vec_bytes
};

struct AttnSeqDesc {
  int32_t token_begin, n_tokens, pos_start, page_offset;  // page_offset into the pages array
};
struct AttnWork {
  int32_t seq, kv_head, row_begin, part;
};

struct AttnArgs {
  const uint8_t* pool = nullptr;
  KvDeviceLayout layout;
  const AttnSeqDesc* seqs = nullptr;
  const int32_t* pages = nullptr;
  const AttnWork* works = nullptr;
  int n_works = 0;
  const float* q = nullptr;  // [T, n_heads, D]
  float* out = nullptr;      // [T, n_heads, D]
  int n_heads = 0;
  float scale = 1.0f;
  int window = 0;
  int part_size = 0;
  bool direct = true;
  // Partials when !direct: [T, n_heads, max_parts] (max, sum) and [T, n_heads, max_parts, D].
  float* part_max = nullptr;
  float* part_sum = nullptr;
  float* part_acc = nullptr;
  int max_parts = 1;
  // attention_decode and attention_combine: each token's output vector (n_heads·D) is also stored
  // permuted into out_perm, element e at out_inv_perm[e] (the act-order of the gemv that reads it:
  // Exl2GemvHandoff). Null: no copy.
  float* out_perm = nullptr;
  const int32_t* out_inv_perm = nullptr;
  // attention_decode and attention_combine: each output is also stored as the fp16 input of the
  // tensor-core set that reads it (one job, K = n_heads·D, stage_rows rows; Exl2MmaStaging in
  // exl2_gemm.h, at[0] = stage_at). Null stage: none.
  uint16_t* stage = nullptr;
  const int32_t* stage_at = nullptr;
  int stage_rows = 0;
  bool cluster = false;  // attention_decode may split a direct partition over a cluster (sm_90)
  // attention_decode runs streaming partitions (k_attn_decode_part_stream) of fp16 caches on
  // tensor cores (mma.sync and movmatrix, sm_80+) instead of fp32 FMAs.
  bool mma = false;
  // attention_decode launches its streaming partitions overlapped with the stream's previous kernel
  // (overlapped_launch.cuh, sm_90+): a block looks up its sequence, pages and output maps (host
  // staged or loaded with the weights) while that kernel finishes, then waits for q and the cache.
  bool overlapped = false;
};

// Shared memory bytes one attention block needs for head_dim D.
inline size_t attention_smem_bytes(int D) {
  return size_t(k_attn_tile * (D + 1) + k_attn_tile * D + k_attn_rows * D + 4 * k_attn_tile) * sizeof(float);
}

// Stores k, v [n_tokens, kv_heads·D] into cache slots (page·page_size + offset).
cudaError_t kv_write(uint8_t* pool, const KvDeviceLayout& layout, const float* k, const float* v,
                     const int32_t* slots, int n_tokens, cudaStream_t stream);

cudaError_t attention(const AttnArgs& args, cudaStream_t stream);

// Whether attention_decode reads this layout: fp16, q8 or q4 with head_dim k_attn_decode_head_dim,
// aligned rows (each lane's load is one vector) and 2-byte aligned scales.
inline bool attention_decode_serves(const KvDeviceLayout& L) {
  const bool quant = L.format == 2 || L.format == 3;
  return (L.format == 1 || quant) && L.head_dim == k_attn_decode_head_dim && L.vec_bytes % 16 == 0 &&
         L.page_bytes % 16 == 0 &&
         (!quant || (L.block % 8 == 0 && L.scales_offset % 2 == 0 && L.vec_scale_bytes % 2 == 0));
}

// Whether attention_decode is built for partitions of `part` positions.
inline bool attention_decode_part(int part) {
  return part == k_attn_decode_part || part == k_attn_decode_part_short || part == k_attn_decode_part_stream;
}

// The decode kernel: grid (n_kv_heads, n_seqs, max_parts) over args.seqs, whose n_tokens are 0
// or 1; attention_decode_part(part_size). direct: every row's
// positions lie in one partition.
cudaError_t attention_decode(const AttnArgs& args, int n_seqs, cudaStream_t stream);

// Merges partials into out; token_pos[T] is each query row's position.
cudaError_t attention_combine(const AttnArgs& args, const int32_t* token_pos, int n_tokens, cudaStream_t stream);

}  // namespace exl::cuda
