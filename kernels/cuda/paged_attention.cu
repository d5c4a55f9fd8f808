#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/mma_staging.cuh"
#include "kernels/cuda/overlapped_launch.cuh"
#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {
namespace {

// Stores v as token t's input feature at `at` (its AttnArgs::stage_at entry) of the set that reads
// the output staged (AttnArgs::stage, one job of K = n_heads·D), as mma_stage_store does.
__device__ __forceinline__ void store_staged_at(const AttnArgs& a, int64_t t, int at, int D, float v) {
  mma_stage_store_at(a.stage, a.stage_rows, a.n_heads * D, 0, int(t), at, mma_stage_half(v));
}

// Stores output element d of query row orow staged for the set that reads it (AttnArgs::stage).
__device__ __forceinline__ void store_staged(const AttnArgs& a, int64_t orow, int d, int D, float v) {
  if (!a.stage) return;
  const int64_t t = orow / a.n_heads;
  store_staged_at(a, t, a.stage_at[(orow - t * a.n_heads) * D + d], D, v);
}

// Stores output element d of query row orow, and its copies in AttnArgs::out_perm and ::stage.
__device__ __forceinline__ void store_out(const AttnArgs& a, int64_t orow, int d, int D, float v) {
  a.out[orow * D + d] = v;
  if (a.out_perm) {
    const int64_t t = orow / a.n_heads;
    a.out_perm[t * a.n_heads * D + a.out_inv_perm[(orow - t * a.n_heads) * D + d]] = v;
  }
  store_staged(a, orow, d, D, v);
}

constexpr int k_warps = 4;
constexpr int k_rows_per_warp = k_attn_rows / k_warps;
constexpr float k_neg_inf = -__builtin_huge_valf();

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per (token, K or V, head) vector.
__global__ void kv_write_kernel(uint8_t* pool, KvDeviceLayout L, const float* __restrict__ k,
                                const float* __restrict__ v, const int32_t* __restrict__ slots) {
  __shared__ float inv_s[k_kv_max_blocks_per_vec];
  const int t = blockIdx.x;
  const int kv = blockIdx.y / L.n_kv_heads, h = blockIdx.y % L.n_kv_heads;
  const float* src = (kv == 0 ? k : v) + (int64_t(t) * L.n_kv_heads + h) * L.head_dim;
  kv_store_vector(pool, L, kv, h, slots[t], src, inv_s, threadIdx.x);
}

// fp16 cache, D % 8 == 0: a K/V tile in 16-byte loads, every load of the tile issued before the
// first is used (the decode path is bound by this latency, not by bandwidth).
template <int C>  // D ≤ 32·C
__device__ __forceinline__ void load_tile_fp16(const uint8_t* pool, const KvDeviceLayout& L, const int32_t* pages,
                                               int kv_head, int t0, int pe, float* Kt, float* Vt) {
  const int D = L.head_dim, d8 = D / 8;
  constexpr int kMax = (k_attn_tile * 32 * C / 8 + k_warps * 32 - 1) / (k_warps * 32);
  const int n = k_attn_tile * d8;
  uint4 kr[kMax], vr[kMax];
#pragma unroll
  for (int u = 0; u < kMax; ++u) {
    const int i = threadIdx.x + u * k_warps * 32;
    kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
    if (i < n) {
      const int j = i / d8, c = i - j * d8, pos = t0 + j;
      if (pos < pe) {
        const uint8_t* page_base = pool + int64_t(pages[pos / L.page_size]) * L.page_bytes;
        const int slot = pos % L.page_size;
        kr[u] = __ldg(reinterpret_cast<const uint4*>(page_base + vec_index(L, 0, kv_head, slot) * L.vec_bytes) + c);
        vr[u] = __ldg(reinterpret_cast<const uint4*>(page_base + vec_index(L, 1, kv_head, slot) * L.vec_bytes) + c);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kMax; ++u) {
    const int i = threadIdx.x + u * k_warps * 32;
    if (i < n) {
      const int j = i / d8, c = i - j * d8;
      const __half2* kh = reinterpret_cast<const __half2*>(&kr[u]);
      const __half2* vh = reinterpret_cast<const __half2*>(&vr[u]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 kf = __half22float2(kh[e]), vf = __half22float2(vh[e]);
        Kt[j * (D + 1) + c * 8 + 2 * e] = kf.x;
        Kt[j * (D + 1) + c * 8 + 2 * e + 1] = kf.y;
        Vt[j * D + c * 8 + 2 * e] = vf.x;
        Vt[j * D + c * 8 + 2 * e + 1] = vf.y;
      }
    }
  }
}

template <int C>  // C = per-lane accumulator slots, ceil(D/32) ≤ C
__global__ void __launch_bounds__(k_warps * 32) attention_kernel(AttnArgs a) {
  extern __shared__ float sm[];
  const KvDeviceLayout& L = a.layout;
  const int D = L.head_dim;
  float* Kt = sm;                               // [tile][D+1]
  float* Vt = Kt + k_attn_tile * (D + 1);       // [tile][D]
  float* Qs = Vt + k_attn_tile * D;             // [rows][D]
  float* Ps = Qs + k_attn_rows * D;             // [warps][tile]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  const AttnWork wk = a.works[blockIdx.x];
  const AttnSeqDesc sq = a.seqs[wk.seq];
  const int group = a.n_heads / L.n_kv_heads;
  const int rows_here = min(k_attn_rows, sq.n_tokens * group - wk.row_begin);

  for (int i = threadIdx.x; i < rows_here * D; i += blockDim.x) {
    const int r = i / D, d = i - r * D;
    const int row = wk.row_begin + r, t = row / group, head = wk.kv_head * group + row % group;
    Qs[i] = a.q[(int64_t(sq.token_begin + t) * a.n_heads + head) * D + d];
  }
  const int pos_first = sq.pos_start + wk.row_begin / group;
  const int pos_last = sq.pos_start + (wk.row_begin + rows_here - 1) / group;
  const int lo_block = a.window > 0 ? max(0, pos_first - a.window + 1) : 0;
  const int pb = max(wk.part * a.part_size, lo_block);
  const int pe = min(wk.part * a.part_size + a.part_size, pos_last + 1);

  float m[k_rows_per_warp], l[k_rows_per_warp], acc[k_rows_per_warp][C];
#pragma unroll
  for (int i = 0; i < k_rows_per_warp; ++i) {
    m[i] = k_neg_inf;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[i][c] = 0.0f;
  }
  const int32_t* pages = a.pages + sq.page_offset;

  const bool vec_load = L.format == 1 && D % 8 == 0;
  for (int t0 = pb; t0 < pe; t0 += k_attn_tile) {
    __syncthreads();
    if (vec_load) {
      load_tile_fp16<C>(a.pool, L, pages, wk.kv_head, t0, pe, Kt, Vt);
    } else
    for (int i = threadIdx.x; i < k_attn_tile * D; i += blockDim.x) {
      const int j = i / D, d = i - j * D, pos = t0 + j;
      float kx = 0.0f, vx = 0.0f;
      if (pos < pe) {
        const int page = pages[pos / L.page_size], slot = pos % L.page_size;
        kx = load_kv(a.pool, L, page, vec_index(L, 0, wk.kv_head, slot), d);
        vx = load_kv(a.pool, L, page, vec_index(L, 1, wk.kv_head, slot), d);
      }
      Kt[j * (D + 1) + d] = kx;
      Vt[j * D + d] = vx;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < k_rows_per_warp; ++i) {
      const int r = warp + k_warps * i;
      if (r >= rows_here) break;
      const int pos_r = sq.pos_start + (wk.row_begin + r) / group;
      const int lo_r = a.window > 0 ? max(0, pos_r - a.window + 1) : 0;
      const int pj = t0 + lane;
      const bool valid = pj < pe && pj <= pos_r && pj >= lo_r;
      float s = k_neg_inf;
      if (valid) {
        const float* qr = Qs + r * D;
        const float* kr = Kt + lane * (D + 1);
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(qr[d], kr[d], dot);
        s = dot * a.scale;
      }
      const float tile_max = warp_max(s);
      if (tile_max == k_neg_inf) continue;
      const float m_new = fmaxf(m[i], tile_max);
      const float corr = expf(m[i] - m_new);
      const float p = valid ? expf(s - m_new) : 0.0f;
      l[i] = l[i] * corr + warp_sum(p);
      m[i] = m_new;
      Ps[warp * k_attn_tile + lane] = p;
      __syncwarp();
      const float* pw = Ps + warp * k_attn_tile;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int d = lane + 32 * c;
        if (d < D) {
          float x = acc[i][c] * corr;
          for (int j = 0; j < k_attn_tile; ++j) x = fmaf(pw[j], Vt[j * D + d], x);
          acc[i][c] = x;
        }
      }
      __syncwarp();
    }
  }

#pragma unroll
  for (int i = 0; i < k_rows_per_warp; ++i) {
    const int r = warp + k_warps * i;
    if (r >= rows_here) break;
    const int row = wk.row_begin + r;
    const int64_t orow = int64_t(sq.token_begin + row / group) * a.n_heads + wk.kv_head * group + row % group;
    if (a.direct) {
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int d = lane + 32 * c;
        if (d < D) a.out[orow * D + d] = acc[i][c] * inv;
      }
    } else {
      const int64_t pidx = orow * a.max_parts + wk.part;
      if (lane == 0) {
        a.part_max[pidx] = m[i];
        a.part_sum[pidx] = l[i];
      }
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int d = lane + 32 * c;
        if (d < D) a.part_acc[pidx * D + d] = acc[i][c];
      }
    }
  }
}

constexpr int k_dec_threads = 512;
constexpr int k_dec_warps = k_dec_threads / 32;
constexpr int k_dec_D = k_attn_decode_head_dim;
constexpr int k_dec_G_max = k_attn_decode_max_group;
static_assert(k_dec_D == 128, "half a warp holds a 128-wide K row");

// Shared floats: q [G][D], scores [G][P], max and sum [16], the warps' V·P partials [warps][G][D].
template <int G, int P>
constexpr size_t decode_smem_bytes() {
  return size_t(G * k_dec_D + G * P + 16 + k_dec_warps * G * k_dec_D) * sizeof(float);
}

// (x, y) as the fp16 pairs hi = fp16(x, y) and lo = fp16 of what hi leaves (low half x; hi
// saturates at ±65504). hi + lo is x to about 2⁻²² relative where lo stays a normal fp16.
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(fminf(fmaxf(x, -65504.0f), 65504.0f), fminf(fmaxf(y, -65504.0f), 65504.0f));
  const float2 f = __half22float2(h);
  const __half2 r = __floats2half2_rn(x - f.x, y - f.y);
  hi = *reinterpret_cast<const uint32_t*>(&h), lo = *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t word(uint4 v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

__device__ __forceinline__ float2 half2_to_float2(uint32_t b) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = b;
  return __half22float2(h);
}

// A lane's share of a K row (8 dimensions) and of a V row (4 dimensions) as stored by cache format
// F (1 fp16, 2 q8, 3 q4; KvDeviceLayout::format), and their decoding to float — for q8/q4 with the
// block's fp16 scale, as load_kv and the CPU decode them.
template <int F>
struct KvLane;
template <>
struct KvLane<1> {
  using K = uint4;
  using V = uint2;
  static __device__ __forceinline__ void k_values(K w, float, float (&k)[8]) {
    const float2 a = half2_to_float2(w.x), b = half2_to_float2(w.y), c = half2_to_float2(w.z), d = half2_to_float2(w.w);
    k[0] = a.x, k[1] = a.y, k[2] = b.x, k[3] = b.y, k[4] = c.x, k[5] = c.y, k[6] = d.x, k[7] = d.y;
  }
  static __device__ __forceinline__ void v_values(V w, float, float (&v)[4]) {
    const float2 a = half2_to_float2(w.x), b = half2_to_float2(w.y);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  }
};
template <>
struct KvLane<2> {
  using K = uint2;
  using V = uint32_t;
  static __device__ __forceinline__ float q8(uint32_t w, int i, float s) {
    return float(int(int8_t(uint8_t(w >> (8 * i))))) * s;
  }
  static __device__ __forceinline__ void k_values(K w, float s, float (&k)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) k[i] = q8(w.x, i, s), k[4 + i] = q8(w.y, i, s);
  }
  static __device__ __forceinline__ void v_values(V w, float s, float (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = q8(w, i, s);
  }
};
template <>
struct KvLane<3> {
  using K = uint32_t;
  using V = unsigned short;
  static __device__ __forceinline__ float q4(uint32_t w, int i, float s) {
    return float(int((w >> (4 * i)) & 15u) - 8) * s;
  }
  static __device__ __forceinline__ void k_values(K w, float s, float (&k)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) k[i] = q4(w, i, s);
  }
  static __device__ __forceinline__ void v_values(V w, float s, float (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = q4(w, i, s);
  }
};

// A decode block's (kv head, sequence, partition of P positions) — grid (kv heads, sequences,
// partitions) —, the positions [pb, pe) of the partition its query sees (causal, window) and the
// query row of the group's first head (qrow; the group's rows follow it).
struct DecodePartition {
  int kvh, part, group;
  AttnSeqDesc sq;
  int pb, pe;
  int64_t qrow;
  __device__ DecodePartition(const AttnArgs& a, int P)
      : kvh(int(blockIdx.x)), part(int(blockIdx.z)), group(a.n_heads / a.layout.n_kv_heads), sq(a.seqs[blockIdx.y]) {
    const int pos = sq.pos_start, lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    pb = max(part * P, lo), pe = min(part * P + P, pos + 1);
    qrow = int64_t(sq.token_begin) * a.n_heads + int64_t(kvh) * group;
  }
  // Whether the block has nothing to do: no query token in its sequence, or no position to see.
  __device__ bool idle() const { return sq.n_tokens < 1 || pb >= pe; }
};

// Where the K and V rows of positions [pb, pe) of kv head `kvh` lie: the block stages the base of
// each of their pages (and, q8/q4, of its scales) in shared memory (`Bases`: NP ≥ the pages of a
// partition), then maps a position to its page by shifts when the page size is a power of two
// (integer division costs dozens of instructions per position).
template <bool kScaled, int NP>
struct PartitionPages {
  const uint8_t* base[2][NP];
  const uint8_t* scale[kScaled ? 2 : 1][kScaled ? NP : 1];
};
template <bool kScaled, int NP>
struct PartitionRows {
  const PartitionPages<kScaled, NP>& pages;
  int pb, first_page, ps, psh, vb, sb;
  bool pow2;
  // Every thread of the block calls it (nthreads of them), then the block synchronises.
  __device__ PartitionRows(PartitionPages<kScaled, NP>& s, const AttnArgs& a, const AttnSeqDesc& sq, int kvh, int pb_,
                           int pe, int nthreads)
      : pages(s), pb(pb_), first_page(pb_ / a.layout.page_size), ps(a.layout.page_size), psh(0),
        vb(int(a.layout.vec_bytes)), sb(int(a.layout.vec_scale_bytes)), pow2((ps & (ps - 1)) == 0) {
    while ((1 << psh) < ps) ++psh;
    const KvDeviceLayout& L = a.layout;
    const int n_pages = pe > pb ? (pe - 1) / ps - first_page + 1 : 0;
    for (int i = threadIdx.x; i < 2 * n_pages; i += nthreads) {
      const int kv = i / n_pages, pg = i - kv * n_pages;
      const uint8_t* page = a.pool + int64_t(a.pages[sq.page_offset + first_page + pg]) * L.page_bytes;
      s.base[kv][pg] = page + vec_index(L, kv, kvh, 0) * L.vec_bytes;
      if constexpr (kScaled) s.scale[kv][pg] = page + L.scales_offset + vec_index(L, kv, kvh, 0) * L.vec_scale_bytes;
    }
  }
  // Row data of K (kv 0) or V (1) at position pb + j and (q8/q4) the scale at byte `scale_at` of its scales.
  __device__ const uint8_t* row(int kv, int j, const uint8_t*& scale, int scale_at) const {
    const int p = pb + j;
    const int pg = pow2 ? (p >> psh) : p / ps, slot = pow2 ? (p & (ps - 1)) : p - pg * ps;
    if constexpr (kScaled) scale = pages.scale[kv][pg - first_page] + slot * sb + scale_at;
    return pages.base[kv][pg - first_page] + slot * vb;
  }
};

// G: the group (query heads per kv head) rounded up to a power of two; heads ≥ group are idle.
// Every K and V load of the partition is issued before the first is used, straight into registers:
// half warp h scores positions h, h + 32, ... (a lane per 8 dimensions), warp w weights positions
// w, w + 16, ... (a lane per 4 dimensions).
// CL > 1: the blocks are clusters of CL along z, each block P positions of one direct partition of
// CL · P (blockIdx.z is its rank); their softmax partials meet in distributed shared memory and
// rank r writes the r-th share of the group's outputs (no partials in global memory, no combine
// launch).
template <int G, int F, int P, int CL = 1>
__global__ void __launch_bounds__(k_dec_threads) attention_decode_kernel(AttnArgs a) {
  constexpr int kQkRounds = P / (2 * k_dec_warps), kPvRounds = P / k_dec_warps;
  static_assert(P % (2 * k_dec_warps) == 0, "whole rounds of positions");
  using Lane = KvLane<F>;
  constexpr bool kScaled = F != 1;
  extern __shared__ float4 dec_smem[];
  float* Qs = reinterpret_cast<float*>(dec_smem);
  float* Ss = Qs + G * k_dec_D;
  float* Ms = Ss + G * P;  // [0, G) max, [8, 8 + G) sum
  float* red = Ms + 16;
  const KvDeviceLayout& L = a.layout;
  const DecodePartition dp(a, P);
  const AttnSeqDesc& sq = dp.sq;
  if (sq.n_tokens < 1) return;
  const int kvh = dp.kvh, part = dp.part, group = dp.group, pb = dp.pb, pe = dp.pe;
  if (CL == 1 && pb >= pe) return;
  const int n = max(0, pe - pb);  // a cluster's empty blocks still meet the others
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, l16 = lane & 15, hw = threadIdx.x >> 4;
  const int64_t qrow = dp.qrow;
  static_assert(k_dec_G_max * k_dec_D / 4 <= k_dec_threads, "a float4 of q per thread");
  const int qi = threadIdx.x;  // q is stored after the K/V loads are issued, not before
  float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (qi < group * (k_dec_D / 4)) qv = __ldg(reinterpret_cast<const float4*>(a.q + qrow * k_dec_D) + qi);
  // The output copy's positions (the first two of this thread's outputs), read now, not at the end.
  int out_at[2] = {0, 0};
  constexpr int kShare = G * k_dec_D / CL;  // outputs of the group a cluster rank writes (at most)
  static_assert(CL == 1 || kShare <= k_dec_threads, "one output per thread");
  const int share = group * k_dec_D / CL;
  if (a.out_perm && a.direct) {
    if constexpr (CL == 1) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int i = threadIdx.x + u * k_dec_threads;
        if (i < group * k_dec_D) out_at[u] = __ldg(a.out_inv_perm + (kvh * group) * k_dec_D + i);
      }
    } else if (threadIdx.x < share) {
      out_at[0] = __ldg(a.out_inv_perm + (kvh * group) * k_dec_D + part * share + threadIdx.x);
    }
  }
  __shared__ PartitionPages<kScaled, P + 1> pages_s;
  const PartitionRows<kScaled, P + 1> rows(pages_s, a, sq, kvh, pb, pe, k_dec_threads);
  __syncthreads();
  // The lane's scale (q8/q4) of a K or V row: a lane's dimensions lie in one block.
  const int k_scale_at = kScaled ? 2 * (l16 * 8 / L.block) : 0, v_scale_at = kScaled ? 2 * (lane * 4 / L.block) : 0;
  typename Lane::K kr[kQkRounds];
  typename Lane::V vr[kPvRounds];
  unsigned short ks[kScaled ? kQkRounds : 1], vs[kScaled ? kPvRounds : 1];
#pragma unroll
  for (int r = 0; r < kQkRounds; ++r) {
    const int j = hw + 2 * k_dec_warps * r;
    kr[r] = {};
    if (j < n) {
      const uint8_t* sp = nullptr;
      kr[r] = __ldg(reinterpret_cast<const typename Lane::K*>(rows.row(0, j, sp, k_scale_at)) + l16);
      if constexpr (kScaled) ks[r] = __ldg(reinterpret_cast<const unsigned short*>(sp));
    }
  }
#pragma unroll
  for (int r = 0; r < kPvRounds; ++r) {
    const int j = warp + k_dec_warps * r;
    vr[r] = {};
    if (j < n) {
      const uint8_t* sp = nullptr;
      vr[r] = __ldg(reinterpret_cast<const typename Lane::V*>(rows.row(1, j, sp, v_scale_at)) + lane);
      if constexpr (kScaled) vs[r] = __ldg(reinterpret_cast<const unsigned short*>(sp));
    }
  }
  if (qi < G * (k_dec_D / 4)) reinterpret_cast<float4*>(Qs)[qi] = qv;
  __syncthreads();

#pragma unroll
  for (int r = 0; r < kQkRounds; ++r) {
    const int j = hw + 2 * k_dec_warps * r;
    if (hw + 2 * k_dec_warps * r - (lane >> 4) >= n) break;  // both halves of the warp leave together
    float k[8];
    Lane::k_values(kr[r], kScaled ? __half2float(__ushort_as_half(ks[kScaled ? r : 0])) : 0.0f, k);
    float d[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float4 q0 = *reinterpret_cast<const float4*>(Qs + h * k_dec_D + l16 * 8);
      const float4 q1 = *reinterpret_cast<const float4*>(Qs + h * k_dec_D + l16 * 8 + 4);
      float x = k[0] * q0.x;
      x = fmaf(k[1], q0.y, x), x = fmaf(k[2], q0.z, x), x = fmaf(k[3], q0.w, x);
      x = fmaf(k[4], q1.x, x), x = fmaf(k[5], q1.y, x), x = fmaf(k[6], q1.z, x), x = fmaf(k[7], q1.w, x);
      d[h] = x;
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1)
#pragma unroll
      for (int h = 0; h < G; ++h) d[h] += __shfl_xor_sync(0xffffffffu, d[h], o);
    float mine = d[0];
#pragma unroll
    for (int h = 1; h < G; ++h)
      if (l16 == h) mine = d[h];
    if (j < n && l16 < group) Ss[l16 * P + j] = mine * a.scale;
  }
  __syncthreads();
  if (warp < group) {
    float* sw = Ss + warp * P;
    float mx = k_neg_inf;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sw[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float p = __expf(sw[j] - mx);
      sw[j] = p;
      sum += p;
    }
    sum = warp_sum(sum);
    if (lane == 0) Ms[warp] = mx, Ms[8 + warp] = sum;
  }
  __syncthreads();
  float acc[G][4] = {};
#pragma unroll
  for (int r = 0; r < kPvRounds; ++r) {
    const int j = warp + k_dec_warps * r;
    if (j >= n) break;
    float v[4];
    Lane::v_values(vr[r], kScaled ? __half2float(__ushort_as_half(vs[kScaled ? r : 0])) : 0.0f, v);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float p = h < group ? Ss[h * P + j] : 0.0f;
      acc[h][0] = fmaf(p, v[0], acc[h][0]), acc[h][1] = fmaf(p, v[1], acc[h][1]);
      acc[h][2] = fmaf(p, v[2], acc[h][2]), acc[h][3] = fmaf(p, v[3], acc[h][3]);
    }
  }
#pragma unroll
  for (int h = 0; h < G; ++h)
    *reinterpret_cast<float4*>(red + (warp * G + h) * k_dec_D + lane * 4) =
        make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
  __syncthreads();
  if constexpr (CL > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();  // clusters need sm_90; the launcher never picks this kernel below it
#else
    // Unnormalized sums into q's place, then each rank merges its share across the cluster.
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    for (int i = threadIdx.x; i < group * k_dec_D; i += k_dec_threads) {
      const int h = i / k_dec_D, d = i % k_dec_D;
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < k_dec_warps; ++w) o += red[(w * G + h) * k_dec_D + d];
      Qs[i] = o;
    }
    cluster.sync();
    if (threadIdx.x < share) {
      const int i = part * share + threadIdx.x, h = i / k_dec_D;
      float mx[CL], o[CL], sum[CL];
#pragma unroll
      for (int r = 0; r < CL; ++r) {
        const float* ms = cluster.map_shared_rank(Ms, r);
        mx[r] = ms[h], sum[r] = ms[8 + h], o[r] = cluster.map_shared_rank(Qs, r)[i];
      }
      float m = k_neg_inf;
#pragma unroll
      for (int r = 0; r < CL; ++r)
        if (sum[r] > 0.0f) m = fmaxf(m, mx[r]);
      float num = 0.0f, den = 0.0f;
#pragma unroll
      for (int r = 0; r < CL; ++r)
        if (sum[r] > 0.0f) {
          const float e = expf(mx[r] - m);
          num += o[r] * e, den += sum[r] * e;
        }
      const float v = num / den;
      const int64_t orow = qrow + h;
      a.out[orow * k_dec_D + i % k_dec_D] = v;
      if (a.out_perm) a.out_perm[(orow / a.n_heads) * a.n_heads * k_dec_D + out_at[0]] = v;
      store_staged(a, orow, i % k_dec_D, k_dec_D, v);
    }
    cluster.sync();  // no block leaves while another reads its shared memory
#endif
  } else {
    for (int i = threadIdx.x, u = 0; i < group * k_dec_D; i += k_dec_threads, ++u) {
      const int h = i / k_dec_D, d = i % k_dec_D;
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < k_dec_warps; ++w) o += red[(w * G + h) * k_dec_D + d];
      const int64_t orow = qrow + h;
      if (a.direct) {
        const float v = o / Ms[8 + h];
        a.out[orow * k_dec_D + d] = v;
        if (a.out_perm) {
          const int64_t t = orow / a.n_heads;
          a.out_perm[t * a.n_heads * k_dec_D +
                     (u == 0   ? out_at[0]
                      : u == 1 ? out_at[1]
                               : a.out_inv_perm[(orow - t * a.n_heads) * k_dec_D + d])] = v;
        }
        store_staged(a, orow, d, k_dec_D, v);
      } else {
        const int64_t pidx = orow * a.max_parts + part;
        a.part_acc[pidx * k_dec_D + d] = o;
        if (d == 0) a.part_max[pidx] = Ms[h], a.part_sum[pidx] = Ms[8 + h];
      }
    }
  }
}

// Where a streaming decode block's outputs go besides AttnArgs::out: for output i = threadIdx.x +
// 128u of the group (head i / D, dimension i % D) the stage map's entry (AttnArgs::stage) or
// else the permuted copy's index (out_perm), read at the block's start so that their latency
// hides behind the K/V loads' instead of following the last one.
template <int G>
__device__ __forceinline__ void decode_store_at(const AttnArgs& a, int kvh, int group, int (&at)[G]) {
  const int32_t* map = a.stage ? a.stage_at : a.out_perm ? a.out_inv_perm : nullptr;
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const int i = int(threadIdx.x) + 128 * u;
    at[u] = map && a.direct && i < group * k_dec_D ? __ldg(map + kvh * group * k_dec_D + i) : 0;
  }
}

// The end of a streaming decode block (128 threads): each of its W warps' running max, sum and
// weighted V of the group's heads, in shared memory (a warp without positions has sum 0), merged
// per output element and stored (direct; `at` from decode_store_at) or written as the
// partition's partials.
template <int W, int G>
__device__ __forceinline__ void decode_block_store(const AttnArgs& a, const float (&m_s)[W][G], const float (&l_s)[W][G],
                                                   const float4 (&acc_s)[W][G][k_dec_D / 4], int group, int64_t qrow,
                                                   int part, const int (&at)[G]) {
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const int i = int(threadIdx.x) + 128 * u;
    if (i >= group * k_dec_D) break;
    const int h = i / k_dec_D, d = i % k_dec_D;
    float mx = k_neg_inf;
#pragma unroll
    for (int w = 0; w < W; ++w)
      if (l_s[w][h] > 0.0f) mx = fmaxf(mx, m_s[w][h]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w)
      if (l_s[w][h] > 0.0f) {
        const float e = __expf(m_s[w][h] - mx);
        o += reinterpret_cast<const float*>(&acc_s[w][h][0])[d] * e, sum += l_s[w][h] * e;
      }
    const int64_t orow = qrow + h;
    if (a.direct) {
      const float v = o / sum;
      const int64_t t = orow / a.n_heads;
      a.out[orow * k_dec_D + d] = v;
      if (a.stage) {
        store_staged_at(a, t, at[u], k_dec_D, v);
        if (a.out_perm) a.out_perm[t * a.n_heads * k_dec_D + a.out_inv_perm[(orow - t * a.n_heads) * k_dec_D + d]] = v;
      } else if (a.out_perm) {
        a.out_perm[t * a.n_heads * k_dec_D + at[u]] = v;
      }
    } else {
      const int64_t pidx = orow * a.max_parts + part;
      a.part_acc[pidx * k_dec_D + d] = o;
      if (d == 0) a.part_max[pidx] = mx, a.part_sum[pidx] = sum;
    }
  }
}

// The streaming form for grids of many (kv head, sequence) pairs: a block of 4 warps per (kv head,
// sequence, partition of up to k_attn_decode_part_stream positions); warp w takes chunks w, w + 4,
// ... of C positions, each an online softmax step: every K and V load of the chunk in flight at
// once (half a warp per K row, a lane per 8 dimensions; a warp per V row, a lane per 4), its scores
// for the group's heads, their maxima, then the weights of all C positions in every lane (each half
// warp's through one shuffle) applied to V. No barrier inside the loop; the four warps' (max, sum,
// weighted V) meet in shared memory at the end. Groups of 1 issue the next chunk's loads before
// using the current one (H100, llama2-7b b=32: +2.4% decode; for groups of 4 the same lost 2% at
// llama3-8b b=64, whether with 4 or 3 blocks per multiprocessor: BENCHMARKS.md, session 33).
// Registers bounded for five blocks per multiprocessor (four for groups of 8; ptxas 13, sm_90a: 96
// and 128, no spills for fp16 groups of 1 and 4), so that one block's loads run while others compute.
template <int G, int F>
__global__ void __launch_bounds__(128, G == 8 ? 4 : 5) attention_decode_stream_kernel(AttnArgs a) {
  // Groups of 1 fetch a chunk ahead (chunks of 8 positions, so that two fit the registers).
  constexpr bool kAhead = G == 1;
  constexpr int W = 4, P = k_attn_decode_part_stream, C = G <= 2 && !kAhead ? 16 : 8, kKr = C / 2;
  using Lane = KvLane<F>;
  constexpr bool kScaled = F != 1;
  __shared__ float4 q_s[G * k_dec_D / 4];
  __shared__ float m_s[W][G], l_s[W][G];
  __shared__ float4 acc_s[W][G][k_dec_D / 4];
  __shared__ PartitionPages<kScaled, P + 1> pages_s;
  const KvDeviceLayout& L = a.layout;
  const DecodePartition dp(a, P);
  if (dp.idle()) return;
  const AttnSeqDesc& sq = dp.sq;
  const int kvh = dp.kvh, part = dp.part, group = dp.group, pb = dp.pb, pe = dp.pe, n = pe - pb;
  const int64_t qrow = dp.qrow;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, l16 = lane & 15, hf = lane >> 4;
  int at[G];
  decode_store_at<G>(a, kvh, group, at);
  const PartitionRows<kScaled, P + 1> rows(pages_s, a, sq, kvh, pb, pe, 128);
  wait_for_inputs();
  for (int i = threadIdx.x; i < G * k_dec_D / 4; i += 128)
    q_s[i] = i < group * (k_dec_D / 4) ? __ldg(reinterpret_cast<const float4*>(a.q + qrow * k_dec_D) + i)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  __syncthreads();
  const int k_scale_at = kScaled ? 2 * (l16 * 8 / L.block) : 0, v_scale_at = kScaled ? 2 * (lane * 4 / L.block) : 0;
  float m[G], l[G], acc[G][4];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = k_neg_inf, l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
  }
  // A chunk's K and V as the lane loads them (with kAhead, the next chunk's loads are issued
  // before the current one is used).
  struct Chunk {
    typename Lane::K kr[kKr];
    typename Lane::V vr[C];
    unsigned short ks[kScaled ? kKr : 1], vs[kScaled ? C : 1];
  };
  const auto load = [&](int c0, Chunk& ch) {
#pragma unroll
    for (int r = 0; r < kKr; ++r) {
      const int j = c0 + 2 * r + hf;
      ch.kr[r] = {};
      if constexpr (kScaled) ch.ks[r] = 0;  // positions past the partition: 0 · scale, never 0 · NaN
      if (j < n) {
        const uint8_t* sp = nullptr;
        ch.kr[r] = __ldg(reinterpret_cast<const typename Lane::K*>(rows.row(0, j, sp, k_scale_at)) + l16);
        if constexpr (kScaled) ch.ks[r] = __ldg(reinterpret_cast<const unsigned short*>(sp));
      }
    }
#pragma unroll
    for (int r = 0; r < C; ++r) {
      const int j = c0 + r;
      ch.vr[r] = {};
      if constexpr (kScaled) ch.vs[r] = 0;
      if (j < n) {
        const uint8_t* sp = nullptr;
        ch.vr[r] = __ldg(reinterpret_cast<const typename Lane::V*>(rows.row(1, j, sp, v_scale_at)) + lane);
        if constexpr (kScaled) ch.vs[r] = __ldg(reinterpret_cast<const unsigned short*>(sp));
      }
    }
  };
  const auto step = [&](int c0, const Chunk& ch) {
    const auto& kr = ch.kr;
    const auto& vr = ch.vr;
    const auto& ks = ch.ks;
    const auto& vs = ch.vs;
    // Scores of the half warp's positions c0 + 2r + hf, the same in its 16 lanes.
    float sc[kKr][G];
#pragma unroll
    for (int r = 0; r < kKr; ++r) {
      float k[8];
      Lane::k_values(kr[r], kScaled ? __half2float(__ushort_as_half(ks[kScaled ? r : 0])) : 0.0f, k);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float4 q0 = q_s[h * (k_dec_D / 4) + 2 * l16], q1 = q_s[h * (k_dec_D / 4) + 2 * l16 + 1];
        float x = k[0] * q0.x;
        x = fmaf(k[1], q0.y, x), x = fmaf(k[2], q0.z, x), x = fmaf(k[3], q0.w, x);
        x = fmaf(k[4], q1.x, x), x = fmaf(k[5], q1.y, x), x = fmaf(k[6], q1.z, x), x = fmaf(k[7], q1.w, x);
        sc[r][h] = x;
      }
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1)
#pragma unroll
      for (int r = 0; r < kKr; ++r)
#pragma unroll
        for (int h = 0; h < G; ++h) sc[r][h] += __shfl_xor_sync(0xffffffffu, sc[r][h], o);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float mc = k_neg_inf;
#pragma unroll
      for (int r = 0; r < kKr; ++r) {
        sc[r][h] = c0 + 2 * r + hf < n ? sc[r][h] * a.scale : k_neg_inf;
        mc = fmaxf(mc, sc[r][h]);
      }
      mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, 16));
      const float m_new = fmaxf(m[h], mc);  // finite: position c0 is in the partition
      const float corr = __expf(m[h] - m_new);
      m[h] = m_new, l[h] *= corr;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][e] *= corr;
#pragma unroll
      for (int r = 0; r < kKr; ++r) sc[r][h] = __expf(sc[r][h] - m_new);  // the weight of c0 + 2r + hf
    }
#pragma unroll
    for (int r = 0; r < kKr; ++r) {
      float pw[2][G];  // weights of positions c0 + 2r and c0 + 2r + 1
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float other = __shfl_xor_sync(0xffffffffu, sc[r][h], 16);
        pw[0][h] = hf ? other : sc[r][h], pw[1][h] = hf ? sc[r][h] : other;
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        float v[4];
        Lane::v_values(vr[2 * r + u], kScaled ? __half2float(__ushort_as_half(vs[kScaled ? 2 * r + u : 0])) : 0.0f, v);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          l[h] += pw[u][h];
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[h][e] = fmaf(pw[u][h], v[e], acc[h][e]);
        }
      }
    }
  };
  if constexpr (kAhead) {
    Chunk ch[2];
    load(warp * C, ch[0]);
#pragma unroll 1
    for (int c0 = warp * C; c0 < n; c0 += 2 * W * C) {
      load(c0 + W * C, ch[1]);
      step(c0, ch[0]);
      if (c0 + W * C >= n) break;
      load(c0 + 2 * W * C, ch[0]);
      step(c0 + W * C, ch[1]);
    }
  } else {
#pragma unroll 1
    for (int c0 = warp * C; c0 < n; c0 += W * C) {
      Chunk ch;
      load(c0, ch);
      step(c0, ch);
    }
  }
#pragma unroll
  for (int h = 0; h < G; ++h) {
    acc_s[warp][h][lane] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
    if (lane == 0) m_s[warp][h] = m[h], l_s[warp][h] = l[h];
  }
  __syncthreads();
  decode_block_store<W, G>(a, m_s, l_s, acc_s, group, qrow, part, at);
}

// The streaming form on tensor cores, for fp16 caches: the same blocks, partitions and order of
// chunks as attention_decode_stream_kernel, in chunks of 8 positions per warp. The group's query
// heads are the rows of mma's 16-row A (rows ≥ group, and 8–15, zero); lane l loads the 16-byte
// pieces of its chunk's K and V rows at position c0 + l / 4, dimensions 32c + 8(l % 4) .. + 7, so
// that its K words are B fragments as loaded when k-step 2c + h takes dimensions 32c + 8(l % 4) +
// 4h + {0, 1} (k = 2(l % 4) + {0, 1}) and + {2, 3} (k + 8), q arranged to match; its V words
// become B fragments of P·V through one movmatrix each (n-tile (c, j): dimensions 32c + 8u + 2j +
// {0, 1}, u = 0..3; P in k 0..7, zero above), which leaves the lane 8 consecutive output
// dimensions per c. q and the weights P enter as fp16 pairs hi + lo (~2⁻²² relative; both products
// into one fp32 accumulator), so that scores and sums keep the fp32 kernel's precision.
// Per chunk and warp 8 loads of 16 bytes, 16 movmatrix and 48 mma instead of ~1,300 instructions.
// H100, llama3-8b b=64 at context ~150: 26.2 µs per call against the FMA form's 28.5 (BENCHMARKS.md,
// session 39); ptxas issues V's loads after the first mma, so that a chunk waits for memory twice.
template <int G>
__global__ void __launch_bounds__(128, 4) attention_decode_mma_kernel(AttnArgs a) {
  constexpr int W = 4, P = k_attn_decode_part_stream, C = 8;
  __shared__ uint4 qf_s[k_dec_D / 16][32];  // per k-step and lane: q's (a0, a2) hi, then lo
  __shared__ float m_s[W][G], l_s[W][G];
  __shared__ float4 acc_s[W][G][k_dec_D / 4];
  __shared__ PartitionPages<false, P + 1> pages_s;
  const DecodePartition dp(a, P);
  if (dp.idle()) return;
  const AttnSeqDesc& sq = dp.sq;
  const int kvh = dp.kvh, part = dp.part, group = dp.group, pb = dp.pb, pe = dp.pe, n = pe - pb;
  const int64_t qrow = dp.qrow;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  int at[G];
  decode_store_at<G>(a, kvh, group, at);
  const PartitionRows<false, P + 1> rows(pages_s, a, sq, kvh, pb, pe, 128);
  wait_for_inputs();
  for (int i = threadIdx.x; i < (k_dec_D / 16) * 32; i += 128) {
    const int st = i >> 5, l = i & 31, h = l >> 2, c = st >> 1, half = st & 1;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h < group) v = __ldg(reinterpret_cast<const float4*>(a.q + (qrow + h) * k_dec_D + 32 * c + 8 * (l & 3) + 4 * half));
    uint32_t hi0, lo0, hi2, lo2;
    split_pair(v.x, v.y, hi0, lo0);
    split_pair(v.z, v.w, hi2, lo2);
    qf_s[st][l] = make_uint4(hi0, hi2, lo0, lo2);
  }
  __syncthreads();
  float acc[4][4][2];  // [c][j][e]: dimension 32c + 8·tq + 2j + e of head g
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[c][j][0] = acc[c][j][1] = 0.0f;
  float m = k_neg_inf, l = 0.0f;
  const uint8_t* unused = nullptr;
#pragma unroll 1
  for (int c0 = warp * C; c0 < n; c0 += W * C) {
    uint4 kr[4], vr[4];  // [c]: position c0 + g, dimensions 32c + 8·tq .. + 7
    {
      const bool in = c0 + g < n;
      const uint4* kp = reinterpret_cast<const uint4*>(rows.row(0, in ? c0 + g : 0, unused, 0)) + tq;
      const uint4* vp = reinterpret_cast<const uint4*>(rows.row(1, in ? c0 + g : 0, unused, 0)) + tq;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        kr[c] = in ? __ldg(kp + 4 * c) : make_uint4(0u, 0u, 0u, 0u);
        vr[c] = in ? __ldg(vp + 4 * c) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
    float s[4] = {};
#pragma unroll
    for (int st = 0; st < k_dec_D / 16; ++st) {
      const uint4 qa = qf_s[st][lane];
      const uint4 kw = kr[st >> 1];
      const uint32_t b0 = st & 1 ? kw.z : kw.x, b1 = st & 1 ? kw.w : kw.y;
      mma_16816(s, qa.x, 0u, qa.y, 0u, b0, b1);
      mma_16816(s, qa.z, 0u, qa.w, 0u, b0, b1);
    }
    // Scores of head g at positions c0 + 2·tq + e (s[e]); the row's four lanes meet.
    float mc = k_neg_inf;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[e] = c0 + 2 * tq + e < n ? s[e] * a.scale : k_neg_inf;
      mc = fmaxf(mc, s[e]);
    }
    mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, 1));
    mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, 2));
    const float m_new = fmaxf(m, mc);  // finite: position c0 is in the partition
    const float corr = __expf(m - m_new);
    m = m_new;
    s[0] = __expf(s[0] - m_new), s[1] = __expf(s[1] - m_new);
    l = l * corr + s[0] + s[1];
    uint32_t ph, pl;  // P's A fragment: k = position − c0
    split_pair(s[0], s[1], ph, pl);
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b0 = movmatrix_trans(word(vr[c], j));
        float d[4] = {acc[c][j][0] * corr, acc[c][j][1] * corr, 0.0f, 0.0f};
        mma_16816(d, ph, 0u, 0u, 0u, b0, 0u);
        mma_16816(d, pl, 0u, 0u, 0u, b0, 0u);
        acc[c][j][0] = d[0], acc[c][j][1] = d[1];
      }
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (g < group) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      acc_s[warp][g][8 * c + 2 * tq] = make_float4(acc[c][0][0], acc[c][0][1], acc[c][1][0], acc[c][1][1]);
      acc_s[warp][g][8 * c + 2 * tq + 1] = make_float4(acc[c][2][0], acc[c][2][1], acc[c][3][0], acc[c][3][1]);
    }
    if (tq == 0) m_s[warp][g] = m, l_s[warp][g] = l;
  }
  __syncthreads();
  decode_block_store<W, G>(a, m_s, l_s, acc_s, group, qrow, part, at);
}

template <int G, int F>
cudaError_t launch_attention_decode_stream(const AttnArgs& a, int n_seqs, cudaStream_t stream) {
  const dim3 grid(unsigned(a.layout.n_kv_heads), unsigned(n_seqs), unsigned(a.max_parts));
  const auto launch = [&](auto kernel) -> cudaError_t {
    if (a.overlapped) return launch_overlapped(kernel, grid, dim3(128), 0, stream, a);
    kernel<<<grid, 128, 0, stream>>>(a);
    return cudaGetLastError();
  };
  if constexpr (F == 1)
    if (a.mma) return launch(attention_decode_mma_kernel<G>);
  return launch(attention_decode_stream_kernel<G, F>);
}

template <int G, int F, int P>
cudaError_t launch_attention_decode(const AttnArgs& a, int n_seqs, cudaStream_t stream) {
  constexpr size_t smem = decode_smem_bytes<G, P>();
  const cudaError_t e =
      cudaFuncSetAttribute(attention_decode_kernel<G, F, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(a.layout.n_kv_heads), unsigned(n_seqs), unsigned(a.max_parts));
  attention_decode_kernel<G, F, P><<<grid, k_dec_threads, smem, stream>>>(a);
  return cudaGetLastError();
}

// A direct plan's partition as a cluster of part_size / k_attn_decode_cluster_part blocks.
template <int G, int F, int CL>
cudaError_t launch_attention_decode_cluster(const AttnArgs& a, int n_seqs, cudaStream_t stream) {
  constexpr int P = k_attn_decode_cluster_part;
  constexpr size_t smem = decode_smem_bytes<G, P>();
  const cudaError_t e = cudaFuncSetAttribute(attention_decode_kernel<G, F, P, CL>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(a.layout.n_kv_heads), unsigned(n_seqs), unsigned(CL));
  cfg.blockDim = dim3(k_dec_threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = CL;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  AttnArgs c = a;
  c.part_size = P;  // the kernel's partition is the block's share; blockIdx.z its rank
  return cudaLaunchKernelEx(&cfg, attention_decode_kernel<G, F, P, CL>, c);
}

template <int G, int F>
cudaError_t launch_attention_decode(const AttnArgs& a, int n_seqs, cudaStream_t stream) {
  if (a.direct && a.cluster && a.max_parts == 1) {
    if (a.part_size == 4 * k_attn_decode_cluster_part) return launch_attention_decode_cluster<G, F, 4>(a, n_seqs, stream);
    if (a.part_size == 8 * k_attn_decode_cluster_part) return launch_attention_decode_cluster<G, F, 8>(a, n_seqs, stream);
  }
  if (a.part_size == k_attn_decode_part_short)
    return launch_attention_decode<G, F, k_attn_decode_part_short>(a, n_seqs, stream);
  if (a.part_size == k_attn_decode_part_stream) return launch_attention_decode_stream<G, F>(a, n_seqs, stream);
  return launch_attention_decode<G, F, k_attn_decode_part>(a, n_seqs, stream);
}

template <int F>
cudaError_t launch_attention_decode(const AttnArgs& a, int n_seqs, cudaStream_t stream) {
  const int group = a.n_heads / a.layout.n_kv_heads;
  if (group == 1) return launch_attention_decode<1, F>(a, n_seqs, stream);
  if (group == 2) return launch_attention_decode<2, F>(a, n_seqs, stream);
  if (group <= 4) return launch_attention_decode<4, F>(a, n_seqs, stream);
  return launch_attention_decode<8, F>(a, n_seqs, stream);
}

// One block per (token, head) row.
__global__ void attention_combine_kernel(AttnArgs a, const int32_t* __restrict__ token_pos) {
  const int64_t orow = blockIdx.x;
  const int D = a.layout.head_dim;
  const int pos = token_pos[orow / a.n_heads];
  if (pos < 0) return;
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int p0 = lo / a.part_size, p1 = pos / a.part_size;
  const int64_t base = orow * a.max_parts;
  float mx = k_neg_inf;
  for (int p = p0; p <= p1; ++p)
    if (a.part_sum[base + p] > 0.0f) mx = fmaxf(mx, a.part_max[base + p]);
  float total = 0.0f;
  for (int p = p0; p <= p1; ++p)
    if (a.part_sum[base + p] > 0.0f) total += a.part_sum[base + p] * expf(a.part_max[base + p] - mx);
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int p = p0; p <= p1; ++p)
      if (a.part_sum[base + p] > 0.0f) o += a.part_acc[(base + p) * D + d] * expf(a.part_max[base + p] - mx);
    store_out(a, orow, d, D, o * inv);
  }
}

template <int C>
cudaError_t launch_attention(const AttnArgs& a, cudaStream_t stream) {
  const size_t smem = attention_smem_bytes(a.layout.head_dim);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(attention_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  attention_kernel<C><<<unsigned(a.n_works), k_warps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t kv_write(uint8_t* pool, const KvDeviceLayout& layout, const float* k, const float* v,
                     const int32_t* slots, int n_tokens, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  const dim3 grid(unsigned(n_tokens), unsigned(2 * layout.n_kv_heads));
  kv_write_kernel<<<grid, 32, 0, stream>>>(pool, layout, k, v, slots);
  return cudaGetLastError();
}

cudaError_t attention(const AttnArgs& a, cudaStream_t stream) {
  if (a.n_works == 0) return cudaSuccess;
  const int c = (a.layout.head_dim + 31) / 32;
  if (c <= 2) return launch_attention<2>(a, stream);
  if (c <= 4) return launch_attention<4>(a, stream);
  return launch_attention<8>(a, stream);
}

cudaError_t attention_decode(const AttnArgs& a, int n_seqs, cudaStream_t stream) {
  const KvDeviceLayout& L = a.layout;
  if (n_seqs == 0) return cudaSuccess;
  if (!attention_decode_serves(L) || !attention_decode_part(a.part_size) ||
      a.n_heads % L.n_kv_heads != 0 ||
      a.n_heads / L.n_kv_heads > k_attn_decode_max_group)
    return cudaErrorInvalidValue;
  if (L.format == 1) return launch_attention_decode<1>(a, n_seqs, stream);
  if (L.format == 2) return launch_attention_decode<2>(a, n_seqs, stream);
  return launch_attention_decode<3>(a, n_seqs, stream);
}

cudaError_t attention_combine(const AttnArgs& a, const int32_t* token_pos, int n_tokens, cudaStream_t stream) {
  const int64_t rows = int64_t(n_tokens) * a.n_heads;
  if (rows == 0) return cudaSuccess;
  attention_combine_kernel<<<unsigned(rows), 128, 0, stream>>>(a, token_pos);
  return cudaGetLastError();
}

}  // namespace exl::cuda
