#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "kernels/cuda/exl2_gemm.h"
#include "kernels/cuda/overlapped_launch.cuh"
#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/mma_staging.cuh"
#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/row_norm.cuh"

namespace exl::cuda {
namespace {

struct Cols4 {
  uint32_t v[4];
};

__device__ __forceinline__ Cols4 load4(const uint32_t* p) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  return {{u.x, u.y, u.z, u.w}};
}

// float(q) − zero for a small unsigned q without an int→float conversion (a slow unit): the bits
// 0x4B000000 | q are the float 2^23 + q; `z23` is 2^23 + zero. Exact.
__device__ __forceinline__ float q_minus(uint32_t q, float z23) { return __uint_as_float(0x4B000000u | q) - z23; }

// fp16 bits of a value exactly representable as a normal fp16 number (compile-time constants).
constexpr uint32_t half_bits(double v) {
  const uint32_t sign = v < 0 ? 0x8000u : 0u;
  double a = v < 0 ? -v : v;
  int e = 0;
  while (a >= 2.0) a /= 2.0, ++e;
  while (a < 1.0) a *= 2.0, --e;
  return sign | uint32_t(e + 15) << 10 | uint32_t((a - 1.0) * 1024.0);
}

__device__ __forceinline__ __half2 half2_bits(uint32_t b) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = b;
  return h;
}

// 8-bit values are carried divided by 16 (exact) so that fp16 partial sums stay far from overflow.
template <int BITS>
inline constexpr double k_pre_scale = BITS == 8 ? 1.0 / 16.0 : 1.0;

// Values I and I + 16/BITS of a word (BITS ∈ {2, 4, 8}: they sit exactly 16 bits apart) as the half2
// (q_I − z, q_{I+P} − z) · k_pre_scale, exact. `w8` is w >> 8. 0x6400 | q·2^s is the fp16
// 1024 + q·2^s; one fused multiply-add removes the 2^s and 1024 + z.
template <int BITS, int I>
__device__ __forceinline__ __half2 pair_minus_zero(uint32_t w, uint32_t w8) {
  constexpr int S = BITS * I;
  constexpr int S2 = S >= 8 ? S - 8 : S;
  constexpr uint32_t M = ((1u << BITS) - 1u) << S2;
  uint32_t h;  // (src & mask) | 0x64006400 in one instruction (ptxas splits the C expression into two)
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(h) : "r"(S >= 8 ? w8 : w), "n"(M | (M << 16)), "n"(0x64006400u));
  constexpr double inv = k_pre_scale<BITS> / double(1 << S2);
  constexpr uint32_t mul = half_bits(inv) * 0x10001u;
  constexpr uint32_t add = half_bits(-(1024.0 * inv + double(1 << (BITS - 1)) * k_pre_scale<BITS>)) * 0x10001u;
  return __hfma2(half2_bits(h), half2_bits(mul), half2_bits(add));
}

// One 32-row block of a group for BITS ∈ {2, 4, 8} in half2 arithmetic: products and partial sums
// of `kRowsPerFlush` rows in fp16 (exact weights, activations rounded to fp16), then added to the
// fp32 accumulators. The flush interval and k_pre_scale bound the fp16 partial sums: they stay
// below 65504 for |x| up to ~1000 (4-bit: 8 terms of |q − z| ≤ 8; 8-bit: 2 terms of ≤ 8).
template <int BITS, int MB>
__device__ __forceinline__ void block_dot_h2(const uint32_t (&w)[4][BITS], const float* xs, int xs_stride,
                                             float (&acc)[MB][4]) {
  constexpr int P = 16 / BITS;                   // pairs per word
  constexpr int kRowsPerFlush = BITS == 8 ? 4 : 16;
  constexpr int kWordsPerFlush = kRowsPerFlush * BITS / 32;
#pragma unroll
  for (int f = 0; f < BITS / kWordsPerFlush; ++f) {
    __half2 h[MB][4];
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) h[m][c] = half2_bits(0u);
#pragma unroll
    for (int wj = 0; wj < kWordsPerFlush; ++wj) {
      const int wi = f * kWordsPerFlush + wj;
      const int rbase = wi * 2 * P;
      __half2 xp[MB][P];
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        float xv[2 * P];
#pragma unroll
        for (int q = 0; q < 2 * P; q += 4) {
          const float4 v = *reinterpret_cast<const float4*>(xs + m * xs_stride + rbase + q);
          xv[q] = v.x, xv[q + 1] = v.y, xv[q + 2] = v.z, xv[q + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < P; ++i) xp[m][i] = __floats2half2_rn(xv[i], xv[i + P]);
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint32_t wv = w[c][wi], w8 = wv >> 8;
        __half2 q[P];
        if constexpr (P >= 1) q[0] = pair_minus_zero<BITS, 0>(wv, w8);
        if constexpr (P >= 2) q[1] = pair_minus_zero<BITS, (P >= 2 ? 1 : 0)>(wv, w8);
        if constexpr (P >= 4) {
          q[2] = pair_minus_zero<BITS, (P >= 4 ? 2 : 0)>(wv, w8);
          q[3] = pair_minus_zero<BITS, (P >= 4 ? 3 : 0)>(wv, w8);
        }
        if constexpr (P >= 8) {
          q[4] = pair_minus_zero<BITS, (P >= 8 ? 4 : 0)>(wv, w8);
          q[5] = pair_minus_zero<BITS, (P >= 8 ? 5 : 0)>(wv, w8);
          q[6] = pair_minus_zero<BITS, (P >= 8 ? 6 : 0)>(wv, w8);
          q[7] = pair_minus_zero<BITS, (P >= 8 ? 7 : 0)>(wv, w8);
        }
#pragma unroll
        for (int i = 0; i < P; ++i)
#pragma unroll
          for (int m = 0; m < MB; ++m) h[m][c] = __hfma2(q[i], xp[m][i], h[m][c]);
      }
    }
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float2 v = __half22float2(h[m][c]);
        acc[m][c] += (v.x + v.y) * float(1.0 / k_pre_scale<BITS>);
      }
  }
}

// Value i (0..31) of a 32-row block (BITS words) placed in the top BITS bits of an fp32 mantissa
// under the exponent of 1.0: the float 1 + q/2^BITS, exact, in a shift (a funnel shift where the
// value straddles two words) and one `lop3`. With i a compile-time constant the tests fold away.
template <int BITS>
__device__ __forceinline__ float one_plus_q(const uint32_t (&w)[BITS], int i) {
  constexpr int P = 23 - BITS;
  constexpr uint32_t M = ((1u << BITS) - 1u) << P;
  const int o = i * BITS, wi = o >> 5, sh = o & 31;
  uint32_t t;
  if (sh + BITS > 32) t = __funnelshift_r(w[wi], w[wi + 1], sh - P);
  else if (sh >= P) t = w[wi] >> (sh - P);
  else t = w[wi] << (P - sh);
  uint32_t h;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(h) : "r"(t), "n"(M), "n"(0x3F800000u));
  return __uint_as_float(h);
}

// One 32-row block for BITS ∈ {3, 5, 6} in fp32 (values extracted across word boundaries).
// EXACT: each product is (q − z)·x, as the CPU forms it. Otherwise Σ (q − z)·x is formed as
// 2^BITS · Σ ((1 + q/2^BITS) − 1.5)·x with z = 2^(BITS−1): a shift, a `lop3` and an fma per weight
// (the −1.5·Σx once per block and column), one instruction less, but the cancellation rounds the
// block sum differently (relative ~1e-6), which through a q8/q4 cache can flip near-tie argmaxes.
template <int BITS, int MB, bool EXACT>
__device__ __forceinline__ void block_dot_f32(const uint32_t (&w)[4][BITS], const float* xs, int xs_stride,
                                              float (&acc)[MB][4]) {
  constexpr float Z23 = 8388608.0f + float(1 << (BITS - 1));
  float sx[MB], dot[MB][4];
  if constexpr (!EXACT) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      sx[m] = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) dot[m][c] = 0.0f;
    }
  }
#pragma unroll
  for (int r4 = 0; r4 < 32; r4 += 4) {
    float wv[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        wv[k][c] = EXACT ? q_minus(exl2_block_value<BITS>(w[c], r4 + k), Z23) : one_plus_q<BITS>(w[c], r4 + k);
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      const float4 xv = *reinterpret_cast<const float4*>(xs + m * xs_stride + r4);
      float(&d)[4] = EXACT ? acc[m] : dot[m];
      if constexpr (!EXACT) sx[m] += (xv.x + xv.y) + (xv.z + xv.w);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        d[c] = fmaf(wv[0][c], xv.x, d[c]);
        d[c] = fmaf(wv[1][c], xv.y, d[c]);
        d[c] = fmaf(wv[2][c], xv.z, d[c]);
        d[c] = fmaf(wv[3][c], xv.w, d[c]);
      }
    }
  }
  if constexpr (!EXACT)
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][c] += float(1 << BITS) * fmaf(-1.5f, sx[m], dot[m][c]);
}

template <int BITS, int MB, bool EXACT = true>
__device__ __forceinline__ void block_dot(const uint32_t (&w)[4][BITS], const float* xs, int xs_stride,
                                          float (&acc)[MB][4]) {
  if constexpr (BITS == 2 || BITS == 4 || BITS == 8) block_dot_h2<BITS, MB>(w, xs, xs_stride, acc);
  else block_dot_f32<BITS, MB, EXACT>(w, xs, xs_stride, acc);
}

// Rows [rb, re) of run `sg` (32-row aligned) for 4 columns; xs holds the activations of row rb.
// (Prefetching blocks ahead into L2, or holding two blocks' words in registers, measured slower
// on the H200: BENCHMARKS.md.)
template <int BITS, int MB, bool EXACT>
__device__ void segment_dot(const Exl2DeviceView& w, const Exl2Segment& sg, int rb, int re, int n0, const float* xs,
                            int xs_stride, float (&acc)[MB][4]) {
  const int nblk = (re - rb) >> 5, boff = (rb - sg.row_start) >> 5;
  const size_t np = size_t(w.Np);
  const uint32_t* wp = w.q_weight + size_t(sg.qrow_start + boff * BITS) * np + n0;
  const uint32_t* sp = w.q_scale + (n0 >> 3);
  const size_t sstride = size_t(w.Np) >> 3;
  const int sshift = 4 * (n0 & 7);
#pragma unroll 1
  for (int i = 0; i < nblk; ++i) {
    uint32_t wv[4][BITS];
#pragma unroll
    for (int b = 0; b < BITS; ++b) {
      const Cols4 c4 = load4(wp + (size_t(i) * BITS + b) * np);
#pragma unroll
      for (int c = 0; c < 4; ++c) wv[c][b] = c4.v[c];
    }
    const int g = sg.group0 + (sg.block_shift >= 0 ? (boff + i) >> sg.block_shift : (boff + i) * 32 / sg.group_rows);
    const uint32_t scode = __ldg(sp + size_t(g) * sstride) >> sshift;
    const float smax = __half2float(__ushort_as_half(__ldg(w.q_scale_max + g))) * (1.0f / 256.0f);
    float bacc[MB][4];
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) bacc[m][c] = 0.0f;
    block_dot<BITS, MB, EXACT>(wv, xs + i * 32, xs_stride, bacc);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t q = (scode >> (4 * c)) & 15u;
      const float s = q_minus((q + 1) * (q + 1), 8388608.0f) * smax;
#pragma unroll
      for (int m = 0; m < MB; ++m) acc[m][c] = fmaf(bacc[m][c], s, acc[m][c]);
    }
  }
}

// segs: the view's segments (shared memory). EXACT: as block_dot_f32.
template <int MB, bool EXACT>
__device__ void segments_dot(const Exl2DeviceView& w, const Exl2Segment* segs, int kw0, int kw1, int k0, int n0,
                             const float* xs, int xs_stride, float (&acc)[MB][4]) {
#pragma unroll 1
  for (int s = 0; s < w.n_segs; ++s) {
    const Exl2Segment sg = segs[s];
    const int rb = max(kw0, sg.row_start), re = min(kw1, sg.row_start + sg.rows);
    if (rb >= re) continue;
    const float* xg = xs + (rb - k0);
    switch (sg.bits) {
      case 2: segment_dot<2, MB, EXACT>(w, sg, rb, re, n0, xg, xs_stride, acc); break;
      case 3: segment_dot<3, MB, EXACT>(w, sg, rb, re, n0, xg, xs_stride, acc); break;
      case 4: segment_dot<4, MB, EXACT>(w, sg, rb, re, n0, xg, xs_stride, acc); break;
      case 5: segment_dot<5, MB, EXACT>(w, sg, rb, re, n0, xg, xs_stride, acc); break;
      case 6: segment_dot<6, MB, EXACT>(w, sg, rb, re, n0, xg, xs_stride, acc); break;
      default: segment_dot<8, MB, EXACT>(w, sg, rb, re, n0, xg, xs_stride, acc); break;
    }
  }
}

// Accumulates rows [r0, r0+cnt) of one group (r0 relative to the group) for 4 columns.
// xs points at the shared activations of the first of those rows; rows of xs are xs_stride apart.
template <int BITS, int MB>
__device__ void exl2_group_dot(const uint32_t* qw, int np, int n0, int qrow_start, int r0, int cnt, const float* xs,
                               int xs_stride, float (&acc)[MB][4]) {
  constexpr float Z23 = 8388608.0f + float(1 << (BITS - 1));
  int bit = r0 * BITS;
  int i = 0;
  // Whole 32-row blocks from a word boundary; activations read 4 rows at a time when aligned.
  if ((bit & 31) == 0 && (reinterpret_cast<uintptr_t>(xs) & 15) == 0 && (xs_stride & 3) == 0) {
    for (; i + 32 <= cnt; i += 32, bit += 32 * BITS) {
      const uint32_t* wp = qw + size_t(qrow_start + (bit >> 5)) * np + n0;
      uint32_t w[4][BITS];
#pragma unroll
      for (int b = 0; b < BITS; ++b) {
        const Cols4 c4 = load4(wp + size_t(b) * np);
#pragma unroll
        for (int c = 0; c < 4; ++c) w[c][b] = c4.v[c];
      }
      block_dot<BITS, MB>(w, xs + i, xs_stride, acc);
    }
  }
  if (i >= cnt) return;
  int wrow = qrow_start + (bit >> 5);
  const int sh = bit & 31;
  uint64_t buf[4];
  int have = 32 - sh;
  {
    const Cols4 c4 = load4(qw + size_t(wrow) * np + n0);
#pragma unroll
    for (int c = 0; c < 4; ++c) buf[c] = uint64_t(c4.v[c]) >> sh;
  }
  for (; i < cnt; ++i) {
    if (have < BITS) {
      ++wrow;
      const Cols4 c4 = load4(qw + size_t(wrow) * np + n0);
#pragma unroll
      for (int c = 0; c < 4; ++c) buf[c] |= uint64_t(c4.v[c]) << have;
      have += 32;
    }
    float wv[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      wv[c] = q_minus(uint32_t(buf[c]) & ((1u << BITS) - 1u), Z23);
      buf[c] >>= BITS;
    }
    have -= BITS;
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      const float xv = xs[m * xs_stride + i];
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][c] = fmaf(wv[c], xv, acc[m][c]);
    }
  }
}

// Block sums per row in a fixed order: each warp's share of row m at part[m][warp] (shuffles),
// then, after a __syncthreads, the warps' shares of a row added in warp order.
template <int MB>
using RowPartials = double[MB][k_exl2_gemv_threads / 32];

template <int MB>
__device__ __forceinline__ void put_warp_share(double v, int m, RowPartials<MB>& part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[m][threadIdx.x >> 5] = v;
}

template <int MB>
__device__ __forceinline__ double row_total(const RowPartials<MB>& part, int r) {
  double t = 0;
  for (int i = 0; i < k_exl2_gemv_threads / 32; ++i) t += part[r][i];
  return t;
}

// inv[m] = 1 / sqrt(mean(x[m0 + m]²) + eps) for the block's rows, summed in double.
template <int MB>
__device__ void rows_inv_rms(const float* __restrict__ x, int K, int m0, int mc, float eps, float* inv) {
  __shared__ RowPartials<MB> part;
#pragma unroll
  for (int m = 0; m < MB; ++m) {
    if (m >= mc) break;
    const float* xr = x + size_t(m0 + m) * K;
    double ss = 0;
    int k = 0;
    if ((K & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
      // Eight 16-byte loads in flight per thread: a 4096-wide row in one round trip.
      constexpr int kBatch = 8 * 4 * k_exl2_gemv_threads;
      for (; k < K; k += kBatch) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int at = k + (u * k_exl2_gemv_threads + threadIdx.x) * 4;
          v[u] = at < K ? *reinterpret_cast<const float4*>(xr + at) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
          ss += double(v[u].x) * double(v[u].x) + double(v[u].y) * double(v[u].y) + double(v[u].z) * double(v[u].z) +
                double(v[u].w) * double(v[u].w);
      }
    } else {
      for (k = threadIdx.x; k < K; k += k_exl2_gemv_threads) ss += double(xr[k]) * double(xr[k]);
    }
    put_warp_share<MB>(ss, m, part);
  }
  __syncthreads();
  if (threadIdx.x < mc) inv[threadIdx.x] = float(1.0 / sqrt(row_total<MB>(part, threadIdx.x) / double(K) + double(eps)));
  __syncthreads();
}

constexpr int k_handoff_mb = 2;  // gemv blocks of up to this many rows read and write hand-offs

// inv[m] as rows_inv_rms computes it, from the rows' sums of squares in `parts` partial sums
// (Exl2GemvHandoff::ssq): a warp per row, added in a fixed order.
template <int MB>
__device__ void rows_inv_rms_parts(const double* __restrict__ ssq, int parts, int K, int m0, int mc, float eps,
                                   float* inv) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  static_assert(MB <= k_exl2_gemv_threads / 32, "a warp per row");
  if (warp < mc) {
    const double* p = ssq + size_t(m0 + warp) * parts;
    double t = 0;
    for (int i = lane; i < parts; i += 32) t += __ldcg(p + i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (lane == 0) inv[warp] = float(1.0 / sqrt(t / double(K) + double(eps)));
  }
  __syncthreads();
}

// Stores a tile's final value v = y[r][n] where the hand-off wants it too (the reader's act-order
// copy) and adds v² to the row's tile sum of squares.
// `at`: io.inv_perm[n], read by the caller ahead of time.
__device__ __forceinline__ void handoff_store(const Exl2GemvHandoff& io, int job, int N, int r, int at, float v,
                                              double& sq) {
  if (io.inv_perm) io.out_perm[job][size_t(r) * N + at] = v;
  sq += double(v) * double(v);
}

// The block's per-row sums sq[m] (each thread's share) added up in a fixed order and stored at
// io.ssq_out[(m0 + m) · tiles + tile]. Every thread of the block calls it.
template <int MB>
__device__ void handoff_ssq(const Exl2GemvHandoff& io, const double (&sq)[MB], int m0, int mc, int tiles, int tile) {
  __shared__ RowPartials<MB> part;
#pragma unroll
  for (int m = 0; m < MB; ++m) put_warp_share<MB>(sq[m], m, part);
  __syncthreads();
  if (threadIdx.x < mc) io.ssq_out[size_t(m0 + threadIdx.x) * tiles + tile] = row_total<MB>(part, threadIdx.x);
}

// y[m0 + m][nb + i] (+)= bias + the K-slices' partial sums, in slice order (the tile's last block).
template <int MB>
__device__ void add_slices(const Exl2DeviceView& w, const float* bias, const float* part, float* y, int rows, int m0,
                           int mc, int nb, bool residual, const Exl2GemvHandoff& io, int job, int tiles, int tile,
                           int slices) {
  double sq[MB];
#pragma unroll
  for (int m = 0; m < MB; ++m) sq[m] = 0;
  // One output per thread at a time (the gemv's registers are capped: 8 blocks per SM), its slices
  // read kZ at a time, so that the one block finishing a tile is not a chain of round trips.
  constexpr int kR = 1, kZ = 16;
  const int total = mc * k_exl2_gemv_cols_per_block, Z = slices;
  const size_t zs = size_t(rows) * w.N;
  for (int i0 = threadIdx.x; i0 < total; i0 += kR * blockDim.x) {
    float sum[kR];
    const float* pz[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int i = i0 + r * int(blockDim.x), m = i / k_exl2_gemv_cols_per_block;
      const int n = nb + i % k_exl2_gemv_cols_per_block;
      const bool on = i < total && n < w.N;
      pz[r] = on ? part + size_t(m0 + m) * w.N + n : nullptr;
      sum[r] = on && bias ? bias[n] : 0.0f;
    }
    for (int z = 0; z < Z; z += kZ) {
      float v[kR][kZ];
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int u = 0; u < kZ; ++u) v[r][u] = pz[r] && z + u < Z ? __ldcg(pz[r] + size_t(z + u) * zs) : 0.0f;
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int u = 0; u < kZ; ++u)
          if (z + u < Z) sum[r] += v[r][u];
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (!pz[r]) continue;
      const int i = i0 + r * int(blockDim.x), m = i / k_exl2_gemv_cols_per_block;
      const int n = nb + i % k_exl2_gemv_cols_per_block;
      float& out = y[size_t(m0 + m) * w.N + n];
      const float v = residual ? out + sum[r] : sum[r];
      out = v;
      if constexpr (MB <= k_handoff_mb) {
        const int at = io.inv_perm ? __ldg(io.inv_perm + n) : 0;
#pragma unroll
        for (int mm = 0; mm < MB; ++mm)
          if (mm == m) handoff_store(io, job, w.N, m0 + m, at, v, sq[mm]);
      }
    }
  }
  if constexpr (MB <= k_handoff_mb)
    if (io.ssq_out && job == 0) handoff_ssq<MB>(io, sq, m0, mc, tiles, tile);
}

// The head that column tile `head` of job 0 (q), 1 (k) or 2 (v) holds, rows [0, mc) of y (row
// stride ld, already final): q and k rotated in place (rope_qk_store's arithmetic), k and v then
// stored into the cache. `tile` is shared scratch of mc·head_dim floats.
__device__ void rope_store_head(const Exl2RopeKv& r, int job, int head, float* y, int ld, int m0, int mc,
                                float* tile) {
  constexpr int D = k_exl2_gemv_cols_per_block, half = D / 2;
  for (int i = threadIdx.x; i < mc * D; i += blockDim.x) tile[i] = y[size_t(i / D) * ld + i % D];
  __syncthreads();
  if (job < 2) {
    for (int i = threadIdx.x; i < mc * half; i += blockDim.x) {
      const int m = i / half, d = i % half;
      float cs, sn;
      rope_cos_sin(r.positions[m0 + m], r.inv_freq[d], r.attn_factor, cs, sn);
      rope_rotate(tile + m * D, d, half, cs, sn);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < mc * D; i += blockDim.x) y[size_t(i / D) * ld + i % D] = tile[i];
  }
  if (job == 0) return;
  __shared__ float inv_s[k_exl2_gemv_threads / 32][k_kv_max_blocks_per_vec];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int m = warp; m < mc; m += k_exl2_gemv_threads / 32)
    kv_store_vector(r.pool, r.layout, job - 1, head, r.slots[m0 + m], tile + m * D, inv_s[warp], lane);
}

// The job of a launch whose column tiles hold this block (job j owns tiles [tile_begin_j,
// tile_begin_{j+1}) of grid.x), selected by unrolled compares so the set stays in parameter space.
// The job of this block and its column tile within that job (bx).
struct BlockJob {
  Exl2DeviceView w;
  const float* bias;
  float* y;
  float* part;
  int job, bx;
};
// `tile`: the block's column tile over all jobs (blockIdx.x, or blockIdx.y for exl2_mma_kernel)
// in tiles of k_exl2_gemv_cols_per_block columns (a job's last tile may be partly past its N).
__device__ __forceinline__ BlockJob block_job(const Exl2GemvSet& set, int tile = int(blockIdx.x)) {
  BlockJob r{set.jobs[0].w, set.jobs[0].bias, set.jobs[0].y, set.jobs[0].partials, 0, tile};
#pragma unroll
  for (int j = 1; j < k_exl2_gemv_max_jobs; ++j)
    if (j < set.n_jobs && tile >= set.jobs[j].tile_begin)
      r = {set.jobs[j].w, set.jobs[j].bias, set.jobs[j].y, set.jobs[j].partials, j, tile - set.jobs[j].tile_begin};
  return r;
}

// Column tiles of a stream-K set (Exl2GemvSet::stream_blocks, narrow blocks: k_exl2_gemv_cols_per_block
// columns each), over all jobs.
__device__ __forceinline__ int mma_stream_tiles(const Exl2GemvSet& set) {
  int tiles = 0;
#pragma unroll
  for (int j = 0; j < k_exl2_gemv_max_jobs; ++j)
    if (j < set.n_jobs) tiles += exl2_gemv_tiles(set.jobs[j].w.N);
  return tiles;
}

constexpr int k_perm_regs = 8;  // permutation entries per thread read ahead (K-slices up to 1024 rows)

// Block: 4 warps on the same 128 columns (4 per lane), each warp on a quarter of the block's K-slice;
// the warps' partial sums meet in shared memory. With one K-slice the block writes y (+ bias);
// otherwise it writes its partial sums, and the last block of the column tile (a counter per
// tile, reset by that block) adds them up in slice order: deterministic, no atomics on y.
// Several matrices of the same K (one job each) share a launch: job j owns the column tiles
// [tile_begin_j, tile_begin_{j+1}) of grid.x.
// STREAM: the warp streams the view's segments; otherwise it walks its groups (any layout).
// IN_ORDER: Exl2GemvHandoff::x_in_order (a norm then comes with ssq).
// EXACT: Exl2GemvSet::exact (streamed blocks; the group walk is always exact).
template <int MB, bool STREAM, bool IN_ORDER, bool EXACT>
__global__ void __launch_bounds__(k_exl2_gemv_threads, MB == 1 ? 8 : MB == 2 ? 5 : 4)
    exl2_gemv_kernel(const Exl2GemvSet set, const float* __restrict__ x, int rows, int k_slice,
                     unsigned* __restrict__ counters) {
  extern __shared__ float xs[];  // [MB][k_slice], then [warps-1][MB][128] partial sums
  constexpr int kWarps = k_exl2_gemv_threads / 32;
  const auto [w, bias, y, part, job, bx] = block_job(set);
  float* red = xs + MB * k_slice;
  const int k0 = blockIdx.z * k_slice;
  const int k1 = min(w.K, k0 + k_slice);
  const int kc = k1 - k0;
  const int m0 = blockIdx.y * MB;
  const int mc = min(MB, rows - m0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n0 = bx * k_exl2_gemv_cols_per_block + lane * 4;
  const int sub = (kc + kWarps * 32 - 1) / (kWarps * 32) * 32;
  const int kw0 = k0 + warp * sub, kw1 = min(k1, kw0 + sub);
  const int g_first = !STREAM && kw0 < kw1 ? w.group_of_row[kw0] : 0;
  __shared__ float inv_rms[MB];
  // The segment table is requested with the activations and parked in shared memory after the
  // gather: read inside the dot loop it was one more round trip before the first weight load.
  __shared__ Exl2Segment segs[k_exl2_max_segments];
  const bool seg_reader = STREAM && int(threadIdx.x) < w.n_segs;
  Exl2Segment seg{};
  if (seg_reader) seg = w.segs[threadIdx.x];
  if constexpr (IN_ORDER) {
    // x (and x_up, the norm weights) already in act-order (Exl2GemvHandoff): every load of the
    // block's slice is issued at once, beside the norm's partial sums; no weight requests go
    // first (they only delay this one round trip: BENCHMARKS.md).
    const auto form = [&](float v, float a, int m) {
      return set.x_up ? v / (1.0f + expf(-v)) * a : set.norm_w ? a * (v * inv_rms[m]) : v;
    };
    // Four consecutive inputs per thread and load (rows and arrays 16-byte aligned: exl2_gemv_set).
    {
      constexpr int kV = k_perm_regs / 4;
      float4 xv[kV][MB], av[kV][MB];
#pragma unroll
      for (int c = 0; c < kV; ++c) {
        const int j = 4 * (threadIdx.x + c * k_exl2_gemv_threads);
#pragma unroll
        for (int m = 0; m < MB; ++m) {
          xv[c][m] = av[c][m] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (j < kc && m < mc) {
            const size_t at = size_t(m0 + m) * w.K + k0 + j;
            xv[c][m] = *reinterpret_cast<const float4*>(x + at);
            if (set.x_up) av[c][m] = *reinterpret_cast<const float4*>(set.x_up + at);
            else if (set.norm_w && m == 0) av[c][0] = *reinterpret_cast<const float4*>(set.norm_w + k0 + j);
          }
        }
      }
      if (set.norm_w) rows_inv_rms_parts<MB>(set.io.ssq, set.io.ssq_parts, w.K, m0, mc, set.norm_eps, inv_rms);
#pragma unroll
      for (int c = 0; c < kV; ++c) {
        const int j = 4 * (threadIdx.x + c * k_exl2_gemv_threads);
        if (j < kc)
#pragma unroll
          for (int m = 0; m < MB; ++m) {
            const float4 v = xv[c][m], a = set.x_up ? av[c][m] : av[c][0];
            *reinterpret_cast<float4*>(xs + m * k_slice + j) =
                m < mc ? make_float4(form(v.x, a.x, m), form(v.y, a.y, m), form(v.z, a.z, m), form(v.w, a.w, m))
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
      }
    }
    constexpr int done = k_perm_regs * k_exl2_gemv_threads;
    for (int j = done + threadIdx.x; j < kc; j += k_exl2_gemv_threads)
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        float v = 0.0f;
        if (m < mc) {
          const size_t at = size_t(m0 + m) * w.K + k0 + j;
          v = form(x[at], set.x_up ? set.x_up[at] : set.norm_w ? set.norm_w[k0 + j] : 0.0f, m);
        }
        xs[m * k_slice + j] = v;
      }
  } else {
    // The warp's first word rows are fetched while the activations are gathered.
    if (STREAM && kw0 < kw1 && n0 < w.N) {
      for (int s = 0; s < w.n_segs; ++s) {
        const Exl2Segment sg = w.segs[s];
        if (kw0 >= sg.row_start + sg.rows) continue;
        const int qr = sg.qrow_start + ((kw0 - sg.row_start) >> 5) * sg.bits;
        const int qend = sg.qrow_start + (sg.rows >> 5) * sg.bits;
        for (int b = 0; b < sg.bits && qr + b < qend; ++b)
          prefetch_l2(w.q_weight + size_t(qr + b) * w.Np + n0);
        break;
      }
    } else if (kw0 < kw1 && n0 < w.N) {
      const Exl2GroupDesc gd = w.groups[g_first];
      const int qr = gd.qrow_start + ((kw0 - gd.row_start) * gd.bits >> 5);
      const int qend = gd.qrow_start + (gd.rows * gd.bits + 31) / 32;
      for (int b = 0; b < gd.bits && qr + b < qend; ++b)
        prefetch_l2(w.q_weight + size_t(qr + b) * w.Np + n0);
    }
    // The permutation entries are read first, then every activation load is in flight at once.
    int pj[k_perm_regs];
#pragma unroll
    for (int c = 0; c < k_perm_regs; ++c) {
      const int j = threadIdx.x + c * k_exl2_gemv_threads;
      pj[c] = j < kc ? w.perm[k0 + j] : 0;
    }
    if (set.norm_w) rows_inv_rms<MB>(x, w.K, m0, mc, set.norm_eps, inv_rms);
    const int K = w.K;
    const auto gather = [&](int j, int p) {
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        float v = 0.0f;
        if (m < mc) {
          const size_t at = size_t(m0 + m) * K + p;
          v = x[at];
          if (set.x_up) v = v / (1.0f + expf(-v)) * set.x_up[at];
          else if (set.norm_w) v = set.norm_w[p] * (v * inv_rms[m]);
        }
        xs[m * k_slice + j] = v;
      }
    };
#pragma unroll
    for (int c = 0; c < k_perm_regs; ++c) {
      const int j = threadIdx.x + c * k_exl2_gemv_threads;
      if (j < kc) gather(j, pj[c]);
    }
    for (int j = threadIdx.x + k_perm_regs * k_exl2_gemv_threads; j < kc; j += k_exl2_gemv_threads)
      gather(j, w.perm[k0 + j]);
  }
  if (seg_reader) segs[threadIdx.x] = seg;
  __syncthreads();

  float acc[MB][4];
#pragma unroll
  for (int m = 0; m < MB; ++m)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[m][c] = 0.0f;

  if constexpr (STREAM) {
    if (n0 < w.N && kw0 < kw1) segments_dot<MB, EXACT>(w, segs, kw0, kw1, k0, n0, xs, k_slice, acc);
  } else if (n0 < w.N && kw0 < kw1) {
    for (int g = g_first; g < w.n_groups; ++g) {
      const Exl2GroupDesc gd = w.groups[g];
      if (gd.row_start >= kw1) break;
      const int rb = max(kw0, gd.row_start), re = min(kw1, gd.row_start + gd.rows);
      if (rb >= re) continue;
      float gacc[MB][4];
#pragma unroll
      for (int m = 0; m < MB; ++m)
#pragma unroll
        for (int c = 0; c < 4; ++c) gacc[m][c] = 0.0f;
      const int r0 = rb - gd.row_start, cnt = re - rb;
      const float* xg = xs + (rb - k0);
      switch (gd.bits) {
        case 2: exl2_group_dot<2, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
        case 3: exl2_group_dot<3, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
        case 4: exl2_group_dot<4, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
        case 5: exl2_group_dot<5, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
        case 6: exl2_group_dot<6, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
        default: exl2_group_dot<8, MB>(w.q_weight, w.Np, n0, gd.qrow_start, r0, cnt, xg, k_slice, gacc); break;
      }
      const float smax = __half2float(__ushort_as_half(w.q_scale_max[g]));
      const uint32_t* srow = w.q_scale + size_t(g) * (w.Np / 8);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float s = exl2_scale(srow, n0 + c, smax);
#pragma unroll
        for (int m = 0; m < MB; ++m) acc[m][c] = fmaf(gacc[m][c], s, acc[m][c]);
      }
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int m = 0; m < MB; ++m)
      *reinterpret_cast<float4*>(red + ((warp - 1) * MB + m) * k_exl2_gemv_cols_per_block + lane * 4) =
          make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
  }
  __syncthreads();
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  const bool split = gridDim.z > 1;
  double sq[MB];
#pragma unroll
  for (int m = 0; m < MB; ++m) sq[m] = 0;
  if (warp == 0 && n0 < w.N) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      if (m >= mc) break;
#pragma unroll
      for (int v = 1; v < kWarps; ++v) {
        const float4 p =
            *reinterpret_cast<const float4*>(red + ((v - 1) * MB + m) * k_exl2_gemv_cols_per_block + lane * 4);
        acc[m][0] += p.x, acc[m][1] += p.y, acc[m][2] += p.z, acc[m][3] += p.w;
      }
      float* dst = split ? part + (size_t(blockIdx.z) * rows + m0 + m) * w.N : y + size_t(m0 + m) * w.N;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (n0 + c < w.N) {
          const float v = acc[m][c] + (!split && bias ? bias[n0 + c] : 0.0f);
          const float out = !split && set.residual ? dst[n0 + c] + v : v;
          dst[n0 + c] = out;
          if (MB <= k_handoff_mb && !split)
            handoff_store(set.io, job, w.N, m0 + m, set.io.inv_perm ? set.io.inv_perm[n0 + c] : 0, out, sq[m]);
        }
    }
  }
  if (MB <= k_handoff_mb && !split && set.io.ssq_out && job == 0) {
    __syncthreads();
    handoff_ssq<MB>(set.io, sq, m0, mc, exl2_gemv_tiles(set.jobs[0].w.N), bx);
  }
  const int nb = bx * k_exl2_gemv_cols_per_block;
  if (split) {
    // The last block of this column tile to finish adds up the K-slices' partial sums.
    // The barrier orders warp 0's partial stores before thread 0's release; its acquire and the
    // second barrier order the last block's partial loads after every other block's release. One
    // acq_rel atomic by one thread (it still compiles to a gpu-scope membar and an L1
    // invalidation) instead of every thread's fence.sc before it and the last block's after: ~2%
    // of a batch-1 step on the H200, BENCHMARKS.md.
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned prev;
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(counters + tile) : "memory");
      last = prev == gridDim.z - 1;
      if (last) counters[tile] = 0;
    }
    __syncthreads();
    if (!last) return;
    add_slices<MB>(w, bias, part, y, rows, m0, mc, nb, set.residual, set.io, job, exl2_gemv_tiles(set.jobs[0].w.N), bx,
                   int(gridDim.z));
  }
  if (set.rope.pool) {
    __syncthreads();
    rope_store_head(set.rope, job, bx, y + size_t(m0) * w.N + nb, w.N, m0, mc, xs);
  }
}

__device__ __forceinline__ void store_weight(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_weight(float* p, float v) { *p = v; }

// 32 rows of one group starting at a word boundary: the block's words are loaded once.
template <int BITS, typename Out>
__device__ void reconstruct_block(const Exl2DeviceView& w, const Exl2GroupDesc& gd, int g, int n, int c, int j0,
                                  int nc, Out* __restrict__ out) {
  const uint32_t* wp = w.q_weight + size_t(gd.qrow_start + (((j0 - gd.row_start) * BITS) >> 5)) * w.Np + n;
  uint32_t words[BITS];
#pragma unroll
  for (int b = 0; b < BITS; ++b) words[b] = __ldg(wp + size_t(b) * w.Np);
  const float s = exl2_scale(w.q_scale + size_t(g) * (w.Np / 8), n, __half2float(__ushort_as_half(w.q_scale_max[g])));
#pragma unroll
  for (int r = 0; r < 32; ++r)
    store_weight(out + size_t(w.perm[j0 + r]) * nc + c,
                 float(int(exl2_block_value<BITS>(words, r)) - (1 << (BITS - 1))) * s);
}

template <typename Out>
__global__ void exl2_reconstruct_kernel(Exl2DeviceView w, int n0, int nc, Out* __restrict__ out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= nc) return;
  const int n = n0 + c;
  const int j0 = blockIdx.y * 32;
  const int j_end = min(w.K, j0 + 32);
  const int g0 = w.group_of_row[j0];
  const Exl2GroupDesc g0d = w.groups[g0];
  if (j_end - j0 == 32 && g0d.row_start + g0d.rows >= j_end && (((j0 - g0d.row_start) * g0d.bits) & 31) == 0) {
    switch (g0d.bits) {
      case 2: reconstruct_block<2>(w, g0d, g0, n, c, j0, nc, out); return;
      case 3: reconstruct_block<3>(w, g0d, g0, n, c, j0, nc, out); return;
      case 4: reconstruct_block<4>(w, g0d, g0, n, c, j0, nc, out); return;
      case 5: reconstruct_block<5>(w, g0d, g0, n, c, j0, nc, out); return;
      case 6: reconstruct_block<6>(w, g0d, g0, n, c, j0, nc, out); return;
      default: reconstruct_block<8>(w, g0d, g0, n, c, j0, nc, out); return;
    }
  }
  for (int j = j0; j < j_end; ++j) {
    const int g = w.group_of_row[j];
    const Exl2GroupDesc gd = w.groups[g];
    const uint32_t q = exl2_value(w.q_weight, w.Np, n, gd, j);
    const float smax = __half2float(__ushort_as_half(w.q_scale_max[g]));
    const float s = exl2_scale(w.q_scale + size_t(g) * (w.Np / 8), n, smax);
    store_weight(out + size_t(w.perm[j]) * nc + c, float(int(q) - (1 << (gd.bits - 1))) * s);
  }
}

// ---- exl2_mma: tensor-core products for 3..k_exl2_mma_max_rows activation rows ----------------

// Floats per row of exl2_mma_kernel's result tile (16-byte rows).
constexpr int k_mma_out_stride = k_exl2_gemv_cols_per_block + 4;
// exl2_mma_kernel's ring: double buffering. Deeper rings (3, 4, 6 stages) measured no faster at any
// batch on the H200, and up to 30% slower at 64 rows where they cost resident blocks (BENCHMARKS.md,
// session 19); three at up to 16 rows, with launches overlapping the previous kernel, gained 1.4%
// at llama3 b=16 and lost 3.8% at llama2 b=8, and asking L2 for a block's next chunks before the
// wait for the previous kernel lost 2–5% (H100, session 36).
constexpr int k_mma_stages = 2;
constexpr int k_wgmma_x_stages = 3;

// Where value v (0..31) of a 32-row block of `bits` sits in the fragment order of its lane's
// 32 values (slot p: mma step p / 4, half2 (p & 3) / 2 of that step's pair of registers).
// 2/4/8 bits: values v and v + 16/bits share a half2 (one lop3 per pair); 3/5/6 bits: v and v+1.
EXL_HD constexpr int mma_slot(int bits, int v) {
  if (bits != 2 && bits != 4 && bits != 8) return v;
  const int p = 16 / bits, per_word = 2 * p, r = v % per_word;
  return per_word * (v / per_word) + 2 * (r % p) + r / p;
}

// The half2 (q_{2I} − z, q_{2I+1} − z) of a 32-row block of BITS ∈ {3, 5, 6} (exact).
template <int BITS, int I>
__device__ __forceinline__ __half2 pair_adjacent(const uint32_t (&w)[8]) {
  constexpr int o = 2 * I * BITS, wi = o >> 5, sh = o & 31;
  constexpr uint32_t M = (1u << BITS) - 1u;
  uint32_t f;
  if constexpr (sh + 2 * BITS > 32) f = __funnelshift_r(w[wi], w[wi + 1], sh);
  else f = w[wi] >> sh;
  uint32_t h;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(h) : "r"(f), "n"(M), "n"(0x64006400u));
  asm("lop3.b32 %0, %1, %2, %3, 0xF8;" : "=r"(h) : "r"(h), "r"(f << (16 - BITS)), "n"(M << 16));
  constexpr uint32_t zero = half_bits(-(1024.0 + double(1 << (BITS - 1)))) * 0x10001u;
  return __hadd2(half2_bits(h), half2_bits(zero));
}

// Pairs F .. F+P−1 (fragment slots 2F .. 2F+2P−1) of a block's words, times the scale s2.
template <int BITS, int F, int P>
__device__ __forceinline__ void mma_dequant(const uint32_t (&w)[8], __half2 s2, uint32_t (&out)[P]) {
  static_assert(P == 4 || P == 8, "mma_dequant: quarters or halves of a block");
#pragma unroll
  for (int li = 0; li < P; ++li) {
    const int i = F + li;
    __half2 v;
    if constexpr (BITS == 2 || BITS == 4 || BITS == 8) {
      constexpr int PW = 16 / BITS;  // pairs per word
      const uint32_t word = w[i / PW];
      switch (i % PW) {  // compile-time after unrolling
        case 0: v = pair_minus_zero<BITS, 0>(word, word >> 8); break;
        case 1: v = pair_minus_zero<BITS, (PW > 1 ? 1 : 0)>(word, word >> 8); break;
        case 2: v = pair_minus_zero<BITS, (PW > 2 ? 2 : 0)>(word, word >> 8); break;
        case 3: v = pair_minus_zero<BITS, (PW > 3 ? 3 : 0)>(word, word >> 8); break;
        case 4: v = pair_minus_zero<BITS, (PW > 4 ? 4 : 0)>(word, word >> 8); break;
        case 5: v = pair_minus_zero<BITS, (PW > 5 ? 5 : 0)>(word, word >> 8); break;
        case 6: v = pair_minus_zero<BITS, (PW > 6 ? 6 : 0)>(word, word >> 8); break;
        default: v = pair_minus_zero<BITS, (PW > 7 ? 7 : 0)>(word, word >> 8); break;
      }
    } else {
      switch (li) {  // cases past P are never taken
        case 0: v = pair_adjacent<BITS, F + 0>(w); break;
        case 1: v = pair_adjacent<BITS, F + 1>(w); break;
        case 2: v = pair_adjacent<BITS, F + 2>(w); break;
        case 3: v = pair_adjacent<BITS, F + 3>(w); break;
        case 4: v = pair_adjacent<BITS, F + (P > 4 ? 4 : 0)>(w); break;
        case 5: v = pair_adjacent<BITS, F + (P > 5 ? 5 : 0)>(w); break;
        case 6: v = pair_adjacent<BITS, F + (P > 6 ? 6 : 0)>(w); break;
        default: v = pair_adjacent<BITS, F + (P > 7 ? 7 : 0)>(w); break;
      }
    }
    const __half2 r = __hmul2(v, s2);
    out[li] = *reinterpret_cast<const uint32_t*>(&r);
  }
}

// Block (chunk, 8 rows of an MB-row block, job): one thread per permuted row k of the chunk writes
// its 8 values x[m][perm[k]] (silu(x)·x_up with x_up), saturated to fp16, at their fragment slots; rows past K
// and past `rows` get zeros (the mma multiplies them by zero weights, and 0 · NaN would be NaN).
template <int MB>
__global__ void __launch_bounds__(k_mma_chunk)
    exl2_mma_stage_kernel(const Exl2GemvSet set, const float* __restrict__ x, int rows, __half* __restrict__ staged) {
  constexpr int kRows = 8;  // rows per block (blockIdx.y: MB-row block y / (MB / 8), its 8-row part)
  const Exl2DeviceView& w = set.jobs[blockIdx.z].w;
  const int k = blockIdx.x * k_mma_chunk + threadIdx.x;
  const int yb = blockIdx.y / (MB / kRows), mlo = blockIdx.y % (MB / kRows) * kRows;
  const int m0 = yb * MB, mc = min(MB, rows - m0);
  allow_dependents();
  int p = k & 31, src = 0;
  if (k < w.K) {
    p = mma_slot(w.groups[w.group_of_row[k]].bits, k & 31);
    src = w.perm[k];
  }
  wait_for_inputs();
  __half* out = staged + size_t(blockIdx.z * (gridDim.y / (MB / kRows)) + yb) * mma_chunks(w.K) * MB * k_mma_chunk;
  float v[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int m = mlo + r;
    v[r] = 0.0f;
    if (k < w.K && m < mc) {
      const size_t at = size_t(m0 + m) * w.K + src;
      v[r] = x[at];
      if (set.x_up) v[r] = silu_times(v[r], set.x_up[at]);
      v[r] = fminf(fmaxf(v[r], -65504.0f), 65504.0f);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) out[mma_x_index(MB, mlo + r, k, p)] = __float2half_rn(v[r]);
}

// Pairs F .. F+P−1 of a lane's 32-row block of BITS for four of its columns (words at wl[b·R],
// b < BITS; R: the ring's stride between word rows) as scaled fp16 A fragments.
template <int BITS, int F, int P, int R, int MT>
__device__ __forceinline__ void mma_decode_part(const uint4* wl, const __half2 (&s2)[4], uint32_t (&a)[MT][2][P]) {
  uint32_t wv[4][8];  // the other parts' words are dead code
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const uint4 v = b < BITS ? wl[b * R] : make_uint4(0u, 0u, 0u, 0u);
    wv[0][b] = v.x, wv[1][b] = v.y, wv[2][b] = v.z, wv[3][b] = v.w;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) mma_dequant<BITS, F, P>(wv[2 * mt + cc], s2[2 * mt + cc], a[mt][cc]);
}

// The lane's width is its own (the four lanes of a quad may hold blocks of different widths), so
// decoding branches per lane, once per part, and the warp then meets at the mma (mma.sync needs
// every lane). Width 0 (past the K-slice or the columns) decodes whatever its ring slot holds as
// 4-bit words under the scale 0 that such a lane gets: finite values times 0, zero fragments
// without a branch of their own (which the compiler hoisted: 32 register clears per chunk).
template <int F, int P, int R, int MT>
__device__ __forceinline__ void mma_decode_part_bits(int bits, const uint4* wl, const __half2 (&s2)[4],
                                                     uint32_t (&a)[MT][2][P]) {
  switch (bits) {
    case 2: mma_decode_part<2, F, P, R>(wl, s2, a); break;
    case 3: mma_decode_part<3, F, P, R>(wl, s2, a); break;
    case 5: mma_decode_part<5, F, P, R>(wl, s2, a); break;
    case 6: mma_decode_part<6, F, P, R>(wl, s2, a); break;
    case 8: mma_decode_part<8, F, P, R>(wl, s2, a); break;
    default: mma_decode_part<4, F, P, R>(wl, s2, a); break;
  }
}

// One 128-row chunk: each half of the lane's column quad decoded (words at wl[b·T]), then
// multiplied by the chunk's activation fragments (the stage at shared address xs: mma_x_index's
// layout; `xl` is the lane's ldmatrix row offset, mma_ldmatrix_offset) for every n-tile.
// Consecutive mma go to different accumulators.
template <int MT, int NT>
__device__ __forceinline__ void mma_chunk(int bits, const uint4* wl, const __half2 (&s2)[4], unsigned xs, unsigned xl,
                                          float (&acc)[MT][NT][4]) {
  constexpr int T = k_exl2_gemv_threads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t a[MT][2][8];
    if (h == 0) mma_decode_part_bits<0, 8, T>(bits, wl, s2, a);
    else mma_decode_part_bits<8, 8, T>(bits, wl, s2, a);
    __syncwarp();
#pragma unroll
    for (int uu = 0; uu < 2; ++uu) {
      const int u = 2 * h + uu, l = 4 * uu;  // l: local pair index of step 2u within this half
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        uint32_t b[4];  // B fragments (b0, b1) of steps 2u and 2u + 1
        ldmatrix_x4(b, xs + xl + unsigned((2 * u * NT + j) * 256));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          mma_16816(acc[mt][j], a[mt][0][l], a[mt][1][l], a[mt][0][l + 1], a[mt][1][l + 1], b[0], b[1]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          mma_16816(acc[mt][j], a[mt][0][l + 2], a[mt][1][l + 2], a[mt][0][l + 3], a[mt][1][l + 3], b[2], b[3]);
      }
    }
  }
}

// Byte offset of the row that lane l names to ldmatrix_x4 in mma_chunk: matrix l / 8 is (step
// l / 16, k-half (l / 8) % 2) of an n-tile, row l % 8 (NT n-tiles of 8 rows per step).
__device__ __forceinline__ unsigned mma_ldmatrix_offset(int NT, int l) {
  return unsigned((l >> 4) * NT * 256 + ((l >> 3) & 1) * 128 + (l & 7) * 16);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Part F / P of wgmma_chunk: pairs F .. F+P−1 of the lane's block decoded, then their P / 2 k-steps
// queued as one wgmma group; the warp waits for the group before it, so the fragments that group
// read may be overwritten by the next part.
template <int NT, int P, int F>
__device__ __forceinline__ void wgmma_part(int bits, const uint4* wl, const __half2 (&s2)[4], unsigned xs,
                                           float (&acc)[2][NT][4]) {
  uint32_t a[2][2][P];
  mma_decode_part_bits<F, P, k_exl2_gemv_threads>(bits, wl, s2, a);
  __syncwarp();
  wgmma_fence_operands(acc);
  wgmma_fence();
#pragma unroll
  for (int li = 0; li < P; li += 2) {
    const uint64_t desc = wgmma_desc_k_major(xs + unsigned(((F + li) / 2) * NT * 256), 128, 256);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      wgmma_f16_rs<8 * NT>(acc[mt], a[mt][0][li], a[mt][1][li], a[mt][0][li + 1], a[mt][1][li + 1], desc);
  }
  wgmma_commit();
  wgmma_wait<1>();
  wgmma_fence_operands(acc);
}

template <int NT, int P, int... Parts>
__device__ __forceinline__ void wgmma_parts(int bits, const uint4* wl, const __half2 (&s2)[4], unsigned xs,
                                            float (&acc)[2][NT][4], std::integer_sequence<int, Parts...>) {
  (wgmma_part<NT, P, Parts * P>(bits, wl, s2, xs, acc), ...);
}

// The same chunk as wgmma (sm_90a): the warpgroup's four warps form 64-column A tiles (m-tile mt of
// every warp, a warp's A rows as mma_chunk's), B is the stage in place (descriptors, no copy to
// registers). The first half's products run while the lane decodes the second. acc[mt] is wgmma's
// m64nN accumulator (N = 8·NT), laid out as mma_chunk's. (Quarters — four groups of two k-steps,
// half the A registers in flight — lost 0.5% at b=64 and 1% of the prefix TTFT on the H100, and
// with them two activation stages at four blocks per multiprocessor lost 11%: BENCHMARKS.md,
// session 36; removed.)
template <int NT>
__device__ __forceinline__ void wgmma_chunk(int bits, const uint4* wl, const __half2 (&s2)[4], unsigned xs,
                                            float (&acc)[2][NT][4]) {
  wgmma_parts<NT, 8>(bits, wl, s2, xs, acc, std::make_integer_sequence<int, 2>{});
}
#endif

// A lane's 32-row block of a chunk (meta 0, i.e. width 0, past the K-slice).
__device__ __forceinline__ Exl2Block mma_block_at(const Exl2Block* blocks, int rb, int k1) {
  return rb < k1 ? blocks[rb >> 5] : Exl2Block{0, 0};
}

// Block (row block x, column tile y, K-slice z): 4 warps on 128 columns (a warp on 32: two
// 16-column m-tiles whose A rows g, g+8 of m-tiles 0, 1 are the lane's columns 4g .. 4g+3 of the
// warp's 32, its "column quad"), MB = 8·NT activation rows (NT n-tiles of 8), one K-slice (a multiple of
// k_mma_chunk), chunk by chunk through a ring of S stages in shared memory filled by cp.async
// S − 1 chunks ahead: the chunk's activations (staged in fragment order by exl2_mma_stage_kernel,
// shared by the block) and each lane's own words of its 32-row block for its column quad (`wrows`
// 16-byte rows per lane and stage: the widest block of the set), their scale codes, its
// group's scale maximum (as the aligned pair of fp16 that holds it) and its block's width. No registers hold a
// chunk in flight, and a lane's weights need no barrier (it reads back only what it copied). Each
// lane decodes its block into scaled fp16 pairs, then the warp runs m16n8k16 mma with fp32
// accumulation. With several K-slices each block writes its partial sums and exl2_mma_sum_kernel
// adds them up. A lane looks its block up in the Exl2Block table a chunk before it copies it, so
// that no copy's address waits for a load inside the loop (+1–2% at 8–64 rows, BENCHMARKS.md,
// session 36).
// Registers bounded for exl2_mma_blocks_per_sm (ptxas 13, sm_90a: 80, 80, 128 and 168 at 8, 16,
// 32 and 64 rows, spilling 4 bytes at 32 rows and, in the mma.sync form of 64 rows, 108; wgmma
// 168, no spills).
// ASYNC (sm_90a, wgmma_chunk): the block is one warpgroup whose products run while its lanes
// decode; a chunk's activations stay in the ring until the wgmma that read them are waited for,
// so the ring holds k_wgmma_x_stages of them (a chunk fetched one ahead) and S of the weights.
template <int NT, bool ASYNC, bool STREAM>
__global__ void __launch_bounds__(k_exl2_gemv_threads, exl2_mma_blocks_per_sm(8 * NT))
    exl2_mma_kernel(const Exl2GemvSet set, const __half* __restrict__ staged, int rows, int k_slice, int wrows) {
  constexpr int MB = 8 * NT, MT = 2, kChunkVecs = MB * 16, T = k_exl2_gemv_threads;
  constexpr int S = k_mma_stages, SX = ASYNC ? k_wgmma_x_stages : S;
  constexpr int kCols = k_exl2_gemv_cols_per_block, kOutStride = k_mma_out_stride;
  constexpr int SR = 3;  // ring words per lane and stage: the scale code, the scale-maximum pair, meta
  extern __shared__ uint4 xs_raw[];
  uint4* const wring = xs_raw + SX * kChunkVecs;
  uint32_t* const sring = reinterpret_cast<uint32_t*>(wring + S * wrows * T);  // [S][SR][T]
  // One K-slice [c_begin, c_end) (in 128-row chunks) of block tile `tile_index`, its sums written
  // to y or (split) to partials slot `part_slot`.
  const auto run = [&](const int tile_index, const int c_begin, const int c_end, const int part_slot) {
    const auto [w, bias, y, part, job, bx] = block_job(set, tile_index);
    const int k0 = c_begin * k_mma_chunk, k1 = min(w.K, c_end * k_mma_chunk);
    const int chunks = c_end - c_begin;
    const int m0 = blockIdx.x * MB, mc = min(MB, rows - m0);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // The lane's slot in the ring's per-lane rows: by quad lane t, then group g rotated by 2t. The
    // eight lanes that copy one 128-byte run of a word row (same t) write 128 bytes in distinct banks
    // (in lane order, a warp's 16-byte copies took 8× the ideal shared-memory wavefronts), and so do
    // the eight consecutive lanes (g = 2q, 2q + 1; every t) of each quarter of a warp's reads: g + 2t
    // covers the even residues for one g and the odd ones for the other (unrotated, reads were 4×).
    const int slot = warp * 32 + t * 8 + ((g + 2 * t) & 7);
    // One scale-maximum pair per word row (t): copied by the lane with g = 0, read by all eight.
    const int max_slot = warp * 32 + t * 8;
    const int n4 = bx * kCols + warp * 32 + 4 * g;  // the lane's column quad: n4 .. n4 + 3
    const size_t np = size_t(w.Np), sstride = size_t(w.Np) >> 3;
    const uint4* tile = reinterpret_cast<const uint4*>(staged) +
                        (size_t(job * gridDim.x + blockIdx.x) * mma_chunks(w.K) + k0 / k_mma_chunk) * kChunkVecs +
                        threadIdx.x;
    const Exl2DeviceView& view = w;  // lambdas do not capture structured bindings before C++20
    // The lane's shared-window addresses in stage 0 (a stage further: + its stride): the copies
    // below are predicated instructions on them, no block per copy that rebuilds its address.
    uint32_t* const s_lane = sring + slot;
    const uint32_t* const m_lane = sring + T + max_slot;
    const uint4* const w_lane = wring + slot;
    const unsigned x_at = static_cast<unsigned>(__cvta_generic_to_shared(xs_raw + threadIdx.x));
    const unsigned w_at = static_cast<unsigned>(__cvta_generic_to_shared(w_lane));
    const unsigned s_at = static_cast<unsigned>(__cvta_generic_to_shared(s_lane));
    const unsigned m_at = static_cast<unsigned>(__cvta_generic_to_shared(m_lane));
    // A lane's stage: words [wrows][T] in wring; in sring [SR][T]: the quad's scale codes, the
    // scale-maximum pair, and the block's width | (group parity << 4) (0: nothing to add, the quad
    // past the columns or the block past the K-slice), so the consumer walks no segments.
    // The chunk's activations (written by exl2_mma_stage_kernel: after wait_for_inputs) and the
    // lane's weights (before it: the prologue's overlap the previous kernel when launched overlapped).
    const auto fetch_x = [&](int c) {
      const unsigned st = unsigned(c % SX) * kChunkVecs * 16;
#pragma unroll
      for (int r = 0; r < NT; ++r)  // kChunkVecs = NT · T
        cp_async_if<16>(x_at + st + unsigned(r * T * 16), tile + size_t(c) * kChunkVecs + r * T, c < chunks);
    };
    // A lane's block of chunk c (width 0 past the slice), looked up a chunk before its copies are
    // issued: the copies' addresses then wait for no load inside the loop.
    const auto block_of = [&](int c) { return mma_block_at(view.blocks, k0 + c * k_mma_chunk + 32 * t, k1); };
    // The first word of the lane's column quad in block `at` (its word rows np words apart).
    const auto words_of = [&](const Exl2Block at) {
      return reinterpret_cast<const char*>(view.q_weight + size_t(at.qrow) * np + n4);
    };
    const auto fetch_w = [&](int c, const Exl2Block at) {
      if (c < chunks) {
        const int st = c % S;
        const int bits = at.meta & 15, grp = at.meta >> 4;
        const bool in = bits && n4 < view.Np;
        const char* src = words_of(at);
        const unsigned wst = w_at + unsigned(st * wrows * T * 16);
#pragma unroll
        for (int b = 0; b < 8; ++b)
          cp_async_if<16>(wst + unsigned(b * T * 16), src + size_t(b) * np * 4, in && b < bits);
        const unsigned sst = unsigned(SR * st * T * 4);
        cp_async_if<4>(s_at + sst, view.q_scale + size_t(grp) * sstride + (n4 >> 3), in);
        // lane g = 0 is in the columns whenever any lane of its row is
        cp_async_if<4>(m_at + sst, reinterpret_cast<const uint32_t*>(view.q_scale_max) + (grp >> 1), in && g == 0);
        s_lane[(SR * st + 2) * T] = in ? uint32_t(bits) | uint32_t(grp & 1) << 4 : 0u;
      }
    };
#pragma unroll
    for (int c = 0; c < S - 1; ++c) fetch_w(c, block_of(c));
    Exl2Block ahead = block_of(S - 1);
    wait_for_inputs();
#pragma unroll
    for (int c = 0; c < S - 1; ++c) {
      fetch_x(c);
      cp_async_commit();
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;
    const unsigned lane_ld = mma_ldmatrix_offset(NT, lane);
#pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
      cp_async_wait<S - 2>();
      if constexpr (ASYNC) fence_proxy_async_shared();
      // Chunk c is in; every warp is done with chunk c − 1 (ASYNC: its wgmma with chunk c − 2), whose
      // stage is refilled.
      __syncthreads();
      fetch_w(c + S - 1, ahead);
      ahead = block_of(c + S);
      fetch_x(c + S - 1);
      cp_async_commit();
      const int st = c % S;
      const uint32_t meta = s_lane[(SR * st + 2) * T];
      const int bits = int(meta & 15u);
      float smax = 0.0f;
      uint32_t scode = 0;
      if (bits) {  // else the quad is past the columns or the block past the K-slice: the scale 0
        const uint32_t pair = m_lane[SR * st * T];
        smax = __half2float(__ushort_as_half(uint16_t(pair >> (meta & 16u)))) *
               (bits == 8 ? 16.0f / 256.0f : 1.0f / 256.0f);
        scode = s_lane[SR * st * T] >> (4 * (n4 & 7));
      }
      __half2 s2[4];
#pragma unroll
      for (int col = 0; col < 4; ++col) {
        const uint32_t code = (scode >> (4 * col)) & 15u;
        s2[col] = __float2half2_rn(q_minus((code + 1) * (code + 1), 8388608.0f) * smax);  // no int→float unit
      }
      const unsigned xs = static_cast<unsigned>(__cvta_generic_to_shared(xs_raw + (c % SX) * kChunkVecs));
      const uint4* wl = w_lane + st * wrows * T;
      if constexpr (ASYNC) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        wgmma_chunk<NT>(bits, wl, s2, xs, acc);
#endif
      } else {
        mma_chunk(bits, wl, s2, xs, lane_ld, acc);
      }
    }
    allow_dependents();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (ASYNC) {
      wgmma_wait<0>();
      wgmma_fence_operands(acc);
    }
#endif
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring: it now holds the block's results

    // The block's [mc, kCols] results meet in shared memory (rows of kOutStride floats; see
    // exl2_mma_smem_bytes), then leave as whole rows: one float4 per lane, where the
    // fragments' own layout would touch four sectors per 128 useful bytes.
    float* out_tile = reinterpret_cast<float*>(xs_raw);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            out_tile[(8 * j + 2 * t + e) * kOutStride + warp * 32 + 4 * g + 2 * mt + cc] = acc[mt][j][2 * cc + e];
    __syncthreads();
    const bool split = gridDim.z > 1 || STREAM;
    const int nb = bx * kCols, ncols = min(kCols, w.N - nb);
    // Whole float4 only where every row starts 16-byte aligned (a set's later jobs' partials follow
    // earlier jobs of any width).
    const bool vec = (w.N & 3) == 0 && (reinterpret_cast<uintptr_t>(split ? part : y) & 15) == 0;
    for (int i = threadIdx.x; i < mc * (kCols / 4); i += T) {
      const int m = i / (kCols / 4), c4 = i % (kCols / 4) * 4;
      if (c4 >= ncols) continue;
      const float4 v = *reinterpret_cast<const float4*>(out_tile + m * kOutStride + c4);
      float r[4] = {v.x, v.y, v.z, v.w};
      float* dst = split ? part + (size_t(part_slot) * rows + m0 + m) * w.N + nb + c4
                         : y + size_t(m0 + m) * w.N + nb + c4;
      if (!split) {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (c4 + q < ncols) r[q] += bias ? bias[nb + c4 + q] : 0.0f;
        if (set.residual) {
          if (vec) {
            const float4 o = *reinterpret_cast<const float4*>(dst);
            r[0] += o.x, r[1] += o.y, r[2] += o.z, r[3] += o.w;
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q)
              if (c4 + q < ncols) r[q] += dst[q];
          }
        }
      }
      if (vec) {
        *reinterpret_cast<float4*>(dst) = make_float4(r[0], r[1], r[2], r[3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (c4 + q < ncols) dst[q] = r[q];
      }
    }
  };
  if constexpr (STREAM) {
    // The block's share of the set's (tile, chunk) units, tile-major: a pass per tile it touches.
    const int C = mma_chunks(set.jobs[0].w.K), P = set.stream_blocks, U = mma_stream_tiles(set) * C;
    int u = int(int64_t(blockIdx.y) * U / P);
    const int u_end = int((int64_t(blockIdx.y) + 1) * U / P);
#pragma unroll 1
    for (bool first = true; u < u_end; first = false) {
      const int tile_index = u / C, c_begin = u % C, c_end = min(C, c_begin + (u_end - u));
      if (!first) __syncthreads();  // the previous tile's results have left the ring
      run(tile_index, c_begin, c_end, int(blockIdx.y) - exl2_mma_stream_block(int64_t(tile_index) * C, U, P));
      u += c_end - c_begin;
    }
  } else {
    const int kc = k_slice / k_mma_chunk, z = int(blockIdx.z);
    run(int(blockIdx.y), z * kc, min(mma_chunks(set.jobs[0].w.K), (z + 1) * kc), z);
  }
}

// The K-slices (under stream-K: the slots of n's column tile) that job `job`'s output n sums.
__device__ __forceinline__ int mma_sum_slices(const Exl2GemvSet& set, int job, int slices, int n) {
  if (!set.stream_blocks) return slices;
  const int C = mma_chunks(set.jobs[job].w.K);
  return exl2_mma_stream_tile_slots(set.jobs[job].tile_begin + n / k_exl2_gemv_cols_per_block, C,
                                    int64_t(mma_stream_tiles(set)) * C, set.stream_blocks);
}

// Block (column tile, row): thread i adds up column nb + i's K-slice partial sums of exl2_mma_kernel
// in slice order, after the bias, then adds the result to the residual or stores it. One output
// per thread and every slice's load in flight at once (16 at a time): the sum is a round trip or
// two, where an 8-row block per tile with four outputs per thread was a chain of them (10.9 µs
// for o at 8 rows against ~3, BENCHMARKS.md, session 20).
// Job `job`'s output n of row m: its K-slices' partial sums in slice order, after the bias.
// Under stream-K the slices are the slots of n's column tile.
__device__ __forceinline__ float mma_slice_sum(const Exl2GemvSet& set, int job, int rows, int slices, int m, int n) {
  const Exl2GemvJob& jb = set.jobs[job];
  slices = mma_sum_slices(set, job, slices, n);
  const size_t zs = size_t(rows) * jb.w.N;
  const float* p = jb.partials + size_t(m) * jb.w.N + n;
  float sum = jb.bias ? jb.bias[n] : 0.0f;
  constexpr int kZ = 16;
  for (int z = 0; z < slices; z += kZ) {
    float v[kZ];
#pragma unroll
    for (int u = 0; u < kZ; ++u) v[u] = z + u < slices ? __ldcg(p + size_t(z + u) * zs) : 0.0f;
#pragma unroll
    for (int u = 0; u < kZ; ++u)
      if (z + u < slices) sum += v[u];
  }
  return sum;
}

__global__ void __launch_bounds__(k_exl2_gemv_threads)
    exl2_mma_sum_kernel(const Exl2GemvSet set, int rows, int slices) {
  allow_dependents();
  wait_for_inputs();
  const auto [w, bias, y, part, job, bx] = block_job(set);
  const int m = int(blockIdx.y), n = bx * k_exl2_gemv_cols_per_block + int(threadIdx.x);
  if (n >= w.N) return;
  const float sum = mma_slice_sum(set, job, rows, slices, m, n);
  float& out = y[size_t(m) * w.N + n];
  out = set.residual ? out + sum : sum;
}

// Block (part p of k_row_threads outputs, row m): exl2_mma_sum_kernel's sums of those outputs
// added into the residual stream (the set's one job's y); the row's last block to finish then does
// rms_norm_stage_kernel's work on the whole row, staging it for the next set
// (Exl2GemvSet::norm_to): it reads the row back as that kernel would and forms the same double
// squares in the same order (row_norm.cuh), so the bits of the two kernels. A counter per row
// (norm_to_counters, left zero) finds the last block, as the gemv's tiles do.
__global__ void __launch_bounds__(k_row_threads)
    exl2_mma_sum_norm_kernel(const Exl2GemvSet set, int rows, int slices) {
  allow_dependents();
  wait_for_inputs();
  const int m = int(blockIdx.y), d = int(blockIdx.x) * k_row_threads + int(threadIdx.x);
  const Exl2GemvJob& jb = set.jobs[0];
  const int N = jb.w.N;
  float* const xr = jb.y + size_t(m) * N;
  if (d < N) xr[d] += mma_slice_sum(set, 0, rows, slices, m, d);
  // The barrier orders the block's stores before thread 0's release; its acquire and the second
  // barrier order the last block's loads after every other block's release.
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(prev)
                 : "l"(set.norm_to_counters + m)
                 : "memory");
    last = prev == gridDim.x - 1;
    if (last) set.norm_to_counters[m] = 0;
  }
  __syncthreads();
  if (!last) return;
  extern __shared__ __half staged_row[];  // mma_stage_row_bytes(set.norm_to)
  mma_stage_norm_row(set.norm_to, m, xr, set.norm_to_w, set.norm_to_eps, staged_row);
}

// Block (column tile of q, k or v: one head, row): exl2_mma_sum_kernel's sums of the head, then
// rotated (q, k) and stored into the cache (k, v) as the gemv's last block does (rope_store_head),
// so that no rope kernel follows the set.
__global__ void __launch_bounds__(k_exl2_gemv_threads)
    exl2_mma_sum_rope_kernel(const Exl2GemvSet set, int rows, int slices) {
  __shared__ float head[k_exl2_gemv_cols_per_block];
  allow_dependents();
  wait_for_inputs();
  const auto [w, bias, y, part, job, bx] = block_job(set);
  const int m = int(blockIdx.y), nb = bx * k_exl2_gemv_cols_per_block;
  float* const yr = y + size_t(m) * w.N + nb;
  yr[threadIdx.x] = mma_slice_sum(set, job, rows, slices, m, nb + int(threadIdx.x));
  rope_store_head(set.rope, job, bx, yr, w.N, m, 1, head);
}

// Block (column tile of gate, row): thread i sums gate's and up's column nb + i as
// exl2_mma_sum_kernel does and stores silu(gate) · up (as exl2_mma_stage_kernel forms it from
// them) staged for the next set; the threads past N write its padding rows.
__global__ void __launch_bounds__(k_exl2_gemv_threads)
    exl2_mma_sum_swiglu_kernel(const Exl2GemvSet set, int rows, int slices) {
  allow_dependents();
  wait_for_inputs();
  const int m = int(blockIdx.y), n = int(blockIdx.x) * k_exl2_gemv_cols_per_block + int(threadIdx.x);
  const Exl2MmaStaging& s = set.swiglu_to;
  if (n >= set.jobs[0].w.N) {
    if (n < mma_chunks(s.K) * k_mma_chunk) mma_stage_pad(s, m, n);
    return;
  }
  const float g = mma_slice_sum(set, 0, rows, slices, m, n), u = mma_slice_sum(set, 1, rows, slices, m, n);
  mma_stage_store(s, m, n, silu_times(g, u));
}

// Block (column tile c of gate, 8-row group) where swiglu_to is in order (Exl2MmaStaging::in_order):
// input features [128c, 128c + 128) of the next set are its permuted rows of chunk c, so the
// block's values are chunk c of those rows' staged input, 8 mma steps of (2 k-halves × 8 rows × 8
// halves). Thread i forms column 128c + i of the 8 rows as exl2_mma_sum_swiglu_kernel does, the
// block places the values in shared memory as they are staged, and each thread stores one 16-byte
// unit of the 2 KiB. Zeros at columns past N (the padding rows) and at rows past `rows` (rows of the
// last row block that the next set's products read and drop): at rows < rows the same bytes as
// exl2_mma_sum_swiglu_kernel, stored whole instead of 2 bytes at a time.
__global__ void __launch_bounds__(k_exl2_gemv_threads)
    exl2_mma_sum_swiglu_tile_kernel(const Exl2GemvSet set, int rows, int slices) {
  constexpr int R = 8, kSteps = k_mma_chunk / 16;
  __shared__ __align__(16) __half tile[kSteps * 2 * R * 8];
  allow_dependents();
  wait_for_inputs();
  const Exl2MmaStaging& s = set.swiglu_to;
  const int c = int(blockIdx.x), r0 = int(blockIdx.y) * R, i = int(threadIdx.x), n = c * k_mma_chunk + i;
  const int N = set.jobs[0].w.N, nr = min(R, rows - r0);
  float h[R];
#pragma unroll
  for (int r = 0; r < R; ++r) h[r] = 0.0f;
  if (n < N) {
    const Exl2GemvJob &jg = set.jobs[0], &ju = set.jobs[1];
    const int sg = mma_sum_slices(set, 0, slices, n), su = mma_sum_slices(set, 1, slices, n);
    float g[R], u[R];
#pragma unroll
    for (int r = 0; r < R; ++r) g[r] = jg.bias ? jg.bias[n] : 0.0f, u[r] = ju.bias ? ju.bias[n] : 0.0f;
    const size_t zs = size_t(rows) * N;
    const float* const pg = jg.partials + size_t(r0) * N + n;
    const float* const pu = ju.partials + size_t(r0) * N + n;
#pragma unroll 1
    for (int z = 0; z < max(sg, su); ++z) {
      float vg[R], vu[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        vg[r] = z < sg && r < nr ? __ldcg(pg + size_t(z) * zs + size_t(r) * N) : 0.0f;
        vu[r] = z < su && r < nr ? __ldcg(pu + size_t(z) * zs + size_t(r) * N) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (z < sg) g[r] += vg[r];
        if (z < su) u[r] += vu[r];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < nr) h[r] = silu_times(g[r], u[r]);
  }
  const int mb = exl2_mma_rows_per_block(rows), t = (n >> 5) & 3;
#pragma unroll 1
  for (int jb = 0; jb < s.n_jobs; ++jb) {
    if (jb) __syncthreads();  // the previous job's units have left the tile
    const int p = n < s.K ? s.at[jb][n] & 31 : n & 31, k = 2 * t + 8 * ((p >> 1) & 1) + (p & 1);
    __half* const col = tile + (p >> 2) * (2 * R * 8) + (k >> 3) * (R * 8) + (k & 7);
#pragma unroll
    for (int r = 0; r < R; ++r) col[r * 8] = mma_stage_half(h[r]);
    __syncthreads();
    const int step = i / (2 * R), unit = i % (2 * R);
    uint4* const dst = reinterpret_cast<uint4*>(s.staged + mma_staged_tile(rows, s.K, jb, r0) +
                                                size_t(((c * kSteps + step) * mb + r0 % mb) * 16 + unit * 8));
    *dst = reinterpret_cast<const uint4*>(tile)[i];
  }
}

bool g_walk_only = false;


__global__ void wgmma_probe_kernel(int* built) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *built = 1;
#else
  *built = 0;
#endif
}

}  // namespace

void exl2_gemv_walk_only(bool on) { g_walk_only = on; }

int exl2_segments(const Exl2GroupDesc* groups, int n_groups, int K, Exl2Segment* out) {
  int n = 0;
  for (int g = 0; g < n_groups;) {
    const Exl2GroupDesc& a = groups[g];
    if (a.row_start % 32 != 0 || a.rows % 32 != 0 || n == k_exl2_max_segments) return 0;
    int e = g + 1, rows = a.rows;
    while (e < n_groups && groups[e].bits == a.bits && groups[e - 1].rows == a.rows && groups[e].rows % 32 == 0 &&
           groups[e].row_start == a.row_start + rows && groups[e].qrow_start == a.qrow_start + rows / 32 * a.bits)
      rows += groups[e++].rows;
    int shift = 0;
    while ((32 << shift) < a.rows) ++shift;
    out[n++] = {a.row_start, rows, a.bits, a.qrow_start, g, a.rows, (32 << shift) == a.rows ? shift : -1, 0};
    g = e;
  }
  return n > 0 && out[n - 1].row_start + out[n - 1].rows == K ? n : 0;
}

void exl2_blocks(const Exl2GroupDesc* groups, int n_groups, Exl2Block* out) {
  for (int g = 0; g < n_groups; ++g)
    for (int i = 0; i < groups[g].rows / 32; ++i)
      out[groups[g].row_start / 32 + i] = {groups[g].qrow_start + i * groups[g].bits, g << 4 | groups[g].bits};
}

cudaError_t exl2_gemv_set(const Exl2GemvSet& set, const float* x, int rows, int k_slice, unsigned* counters,
                          cudaStream_t stream) {
  if (set.n_jobs < 1 || set.n_jobs > k_exl2_gemv_max_jobs) return cudaErrorInvalidValue;
  int tiles = 0;
  for (int j = 0; j < set.n_jobs; ++j) {
    if (set.jobs[j].tile_begin != tiles || set.jobs[j].w.K != set.jobs[0].w.K) return cudaErrorInvalidValue;
    tiles += exl2_gemv_tiles(set.jobs[j].w.N);
  }
  const int mb = exl2_gemv_rows_per_block(rows);
  const dim3 grid(unsigned(tiles), (rows + mb - 1) / mb, (set.jobs[0].w.K + k_slice - 1) / k_slice);
  const size_t smem =
      size_t(mb) * (size_t(k_slice) + size_t(k_exl2_gemv_threads / 32 - 1) * k_exl2_gemv_cols_per_block) * sizeof(float);
  constexpr int T = k_exl2_gemv_threads;
  bool streamed = !g_walk_only && k_slice % 32 == 0;
  for (int j = 0; j < set.n_jobs; ++j) streamed = streamed && set.jobs[j].w.n_segs > 0;
  const bool in_order = set.io.x_in_order;
  const uintptr_t in_bits = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(set.x_up) |
                           reinterpret_cast<uintptr_t>(set.norm_w);
  if ((in_order && ((set.norm_w && !set.io.ssq) || (in_bits & 15) != 0 || (set.jobs[0].w.K & 3) != 0)) ||
      ((in_order || set.io.inv_perm) && mb > k_handoff_mb))
    return cudaErrorInvalidValue;
  // The 1 + q/2^B form only where it was measured faster (b=1 −23 µs, b=2 −39 µs per H200 decode
  // step); 4-row blocks keep the exact form (BENCHMARKS.md, session 14).
  const bool fast = !set.exact && mb <= 2;
#define EXL_GEMV_LAUNCH_IO(M, IO)                                                                                 \
  (streamed && !fast ? exl2_gemv_kernel<M, true, IO, true><<<grid, T, smem, stream>>>(set, x, rows, k_slice, counters)  \
   : streamed        ? exl2_gemv_kernel<M, true, IO, (M > 2)><<<grid, T, smem, stream>>>(set, x, rows, k_slice, counters) \
                     : exl2_gemv_kernel<M, false, IO, true><<<grid, T, smem, stream>>>(set, x, rows, k_slice, counters))
#define EXL_GEMV_LAUNCH(M) (in_order ? EXL_GEMV_LAUNCH_IO(M, true) : EXL_GEMV_LAUNCH_IO(M, false))
  switch (mb) {
    case 1: EXL_GEMV_LAUNCH(1); break;
    case 2: EXL_GEMV_LAUNCH(2); break;
    default: EXL_GEMV_LAUNCH_IO(4, false); break;
  }
#undef EXL_GEMV_LAUNCH
#undef EXL_GEMV_LAUNCH_IO
  return cudaGetLastError();
}



bool exl2_wgmma_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess || major != 9 ||
      minor != 0)
    return false;
  void* flag = nullptr;
  if (cudaMalloc(&flag, sizeof(int)) != cudaSuccess) return false;
  int built = 0;
  wgmma_probe_kernel<<<1, 1>>>(static_cast<int*>(flag));
  const bool ok = cudaGetLastError() == cudaSuccess &&
                  cudaMemcpy(&built, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(flag);
  return ok && built == 1;
}

// The ring (activations, then per lane and stage `wrows` words per column quad, the quads' scale
// codes, the scale-maximum pair and the meta word), reused for the result tile once it is done.
size_t exl2_mma_smem_bytes(int rows, int wrows, Exl2MmaForm form) {
  const int mb = exl2_mma_rows_per_block(rows);
  const size_t w_stages = size_t(k_mma_stages);
  const size_t x_stages = form.wgmma && mb == 64 ? size_t(k_wgmma_x_stages) : w_stages;
  const size_t per_lane = 16 * size_t(wrows) + 4 * 3;
  return std::max(x_stages * size_t(mb) * 256 + w_stages * size_t(k_exl2_gemv_threads) * per_lane,
                  size_t(mb) * size_t(k_mma_out_stride) * sizeof(float));
}

int exl2_mma_resident_blocks(int rows, int wrows, Exl2MmaForm form, size_t smem_per_sm) {
  // Besides the dynamic part: the 1 KiB the system reserves per block (sm_80+).
  const size_t per_block = exl2_mma_smem_bytes(rows, wrows, form) + 1024;
  const int by_smem = int(smem_per_sm / per_block);
  return std::max(1, std::min(exl2_mma_blocks_per_sm(rows), by_smem));
}

int exl2_mma_stream_slots(int tiles, int chunks, int blocks) {
  const int64_t units = int64_t(tiles) * chunks;
  int most = 0;
  for (int t = 0; t < tiles; ++t) most = std::max(most, exl2_mma_stream_tile_slots(t, chunks, units, blocks));
  return most;
}

size_t exl2_mma_staged_bytes(int rows, int K, int n_jobs) {
  const int mb = exl2_mma_rows_per_block(rows);
  return size_t(n_jobs) * size_t((rows + mb - 1) / mb) * size_t(mma_chunks(K)) * size_t(mb) * 256;
}

cudaError_t exl2_mma_set(const Exl2GemvSet& set, const float* x, int rows, int k_slice, uint16_t* staged,
                         Exl2MmaForm form, cudaStream_t stream) {
  const bool streamk = set.stream_blocks > 0;
  if (set.n_jobs < 1 || set.n_jobs > k_exl2_gemv_max_jobs || rows < 1 || (!streamk && k_slice % k_mma_chunk != 0) ||
      (!streamk && k_slice < 1) || set.stream_blocks < 0 || (streamk && rows > 64) || set.norm_w ||
      set.io.x_in_order || set.io.inv_perm || set.io.ssq_out || !staged || (!x && set.x_up))
    return cudaErrorInvalidValue;
  // Whether the K-slice sums run (they then also do what swiglu_to, norm_to and rope ask).
  const bool summed = streamk || set.jobs[0].w.K > k_slice;
  const Exl2MmaStaging& to = set.swiglu_to;
  if (to.n_jobs > 0 && (set.n_jobs != 2 || set.residual || set.jobs[1].w.N != set.jobs[0].w.N ||
                        to.K != set.jobs[0].w.N || to.rows != rows || !summed))
    return cudaErrorInvalidValue;
  const Exl2MmaStaging& norm_to = set.norm_to;
  if (norm_to.n_jobs > 0 && (set.n_jobs != 1 || !set.residual || to.n_jobs > 0 || set.rope.pool || !set.norm_to_w ||
                             !set.norm_to_counters ||
                             norm_to.K != set.jobs[0].w.N || norm_to.rows != rows || !norm_to.staged || !summed))
    return cudaErrorInvalidValue;
  const bool rope = set.rope.pool != nullptr;
  if (rope && (set.n_jobs != 3 || set.residual || to.n_jobs > 0 || !summed ||
               set.rope.layout.head_dim != k_exl2_gemv_cols_per_block ||
               set.jobs[1].w.N != set.rope.layout.n_kv_heads * k_exl2_gemv_cols_per_block ||
               set.jobs[2].w.N != set.jobs[1].w.N || set.jobs[0].w.N % k_exl2_gemv_cols_per_block != 0))
    return cudaErrorInvalidValue;
  const int mb = exl2_mma_rows_per_block(rows), K = set.jobs[0].w.K;
  const bool wgmma = form.wgmma && mb == 64;
  int tiles = 0, wrows = 0;
  for (int j = 0; j < set.n_jobs; ++j) {
    const Exl2DeviceView& v = set.jobs[j].w;
    if (set.jobs[j].tile_begin != tiles || v.K != K || v.n_segs < 1 || v.max_bits < 2 || v.max_bits > 8)
      return cudaErrorInvalidValue;
    tiles += exl2_gemv_tiles(v.N);
    wrows = std::max(wrows, v.max_bits);
  }
  if (streamk && int64_t(set.stream_blocks) > int64_t(tiles) * mma_chunks(K)) return cudaErrorInvalidValue;
  // Row blocks of one column tile are neighbours in launch order, so that beyond 64 rows the later
  // ones find the tile's weights in L2.
  const dim3 grid = streamk ? dim3(1, unsigned(set.stream_blocks), 1)
                           : dim3((rows + mb - 1) / mb, unsigned(tiles), (K + k_slice - 1) / k_slice);
  const int slices = streamk ? 0 : int(grid.z);  // stream-K: the sums count each tile's slots
  const dim3 stage_grid(unsigned(mma_chunks(K)), grid.x * unsigned(mb / 8), unsigned(set.n_jobs));
  const size_t smem = exl2_mma_smem_bytes(rows, wrows, form);
  constexpr int T = k_exl2_gemv_threads;
  const auto launch = [&](auto stage, auto kernel) -> cudaError_t {
    // A ring of 47 KiB or more launches only with the opt-in (measured: cudaErrorInvalidValue
    // when the kernel still had static shared memory).
    if (smem + 1024 > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (e != cudaSuccess) return e;
    }
    __half* const st16 = reinterpret_cast<__half*>(staged);
    const bool swiglu = to.n_jobs > 0, norm = norm_to.n_jobs > 0;
    const bool swiglu_tiles = swiglu && to.in_order;
    const dim3 sum_grid = norm           ? dim3(unsigned((set.jobs[0].w.N + k_row_threads - 1) / k_row_threads), unsigned(rows))
                          : swiglu_tiles ? dim3(unsigned(exl2_gemv_tiles(set.jobs[0].w.N)), unsigned((rows + 7) / 8))
                                         : dim3(swiglu ? unsigned(exl2_gemv_tiles(set.jobs[0].w.N)) : unsigned(tiles), unsigned(rows));
    const dim3 sum_block(norm ? k_row_threads : T);
    const size_t sum_smem = norm ? mma_stage_row_bytes(norm_to) : 0;
    const auto sum = swiglu_tiles ? exl2_mma_sum_swiglu_tile_kernel
                     : swiglu     ? exl2_mma_sum_swiglu_kernel
                     : rope ? exl2_mma_sum_rope_kernel
                     : norm ? exl2_mma_sum_norm_kernel
                            : exl2_mma_sum_kernel;
    if (form.overlapped) {
      cudaError_t e = cudaSuccess;
      if (x) e = launch_overlapped(stage, stage_grid, dim3(k_mma_chunk), 0, stream, set, x, rows, st16);
      if (e == cudaSuccess)
        e = launch_overlapped(kernel, grid, dim3(T), smem, stream, set, static_cast<const __half*>(st16), rows, k_slice,
                              wrows);
      if (e == cudaSuccess && summed) e = launch_overlapped(sum, sum_grid, sum_block, sum_smem, stream, set, rows, slices);
      return e;
    }
    if (x) stage<<<stage_grid, k_mma_chunk, 0, stream>>>(set, x, rows, st16);
    kernel<<<grid, T, smem, stream>>>(set, reinterpret_cast<const __half*>(staged), rows, k_slice, wrows);
    if (summed) sum<<<sum_grid, sum_block, sum_smem, stream>>>(set, rows, slices);
    return cudaGetLastError();
  };
  // The kernel of one form (NT, wgmma), stream-K or not.
  const auto run = [&](auto nt, auto async) {
    constexpr int NT = decltype(nt)::value;
    constexpr bool A = decltype(async)::value;
    return streamk ? launch(exl2_mma_stage_kernel<8 * NT>, exl2_mma_kernel<NT, A, true>)
                   : launch(exl2_mma_stage_kernel<8 * NT>, exl2_mma_kernel<NT, A, false>);
  };
  using No = std::false_type;
  switch (mb) {
    case 8: return run(std::integral_constant<int, 1>{}, No{});
    case 16: return run(std::integral_constant<int, 2>{}, No{});
    case 32: return run(std::integral_constant<int, 4>{}, No{});
    default: return wgmma ? run(std::integral_constant<int, 8>{}, std::true_type{})
                          : run(std::integral_constant<int, 8>{}, No{});
  }
}

void exl2_mma_stage_map(const Exl2GroupDesc* groups, const int32_t* group_of_row, const int32_t* perm, int K,
                        int32_t* out) {
  for (int j = 0; j < K; ++j) out[perm[j]] = (j << 5) | mma_slot(groups[group_of_row[j]].bits, j & 31);
}

int exl2_mma_stage_gather_entries(int K) { return mma_chunks(K) * k_mma_chunk; }

void exl2_mma_stage_gather_map(const Exl2GroupDesc* groups, const int32_t* group_of_row, const int32_t* perm, int K,
                               int32_t* out) {
  std::fill(out, out + exl2_mma_stage_gather_entries(K), -1);
  for (int j = 0; j < K; ++j) {
    out[mma_x_unit_slot(j, mma_slot(groups[group_of_row[j]].bits, j & 31))] = perm[j];
  }
}

cudaError_t exl2_reconstruct(const Exl2DeviceView& w, int n0, int nc, uint16_t* out, cudaStream_t stream) {
  const dim3 grid((nc + 127) / 128, (w.K + 31) / 32);
  exl2_reconstruct_kernel<<<grid, 128, 0, stream>>>(w, n0, nc, reinterpret_cast<__half*>(out));
  return cudaGetLastError();
}

cudaError_t exl2_reconstruct_f32(const Exl2DeviceView& w, int n0, int nc, float* out, cudaStream_t stream) {
  const dim3 grid((nc + 127) / 128, (w.K + 31) / 32);
  exl2_reconstruct_kernel<<<grid, 128, 0, stream>>>(w, n0, nc, out);
  return cudaGetLastError();
}

}  // namespace exl::cuda
