#include "kernels/cuda/flash_attention.h"

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/mma_ptx.cuh"

namespace exl::cuda {

namespace {

constexpr int k_warps = 4;
constexpr int k_pad = 8;  // halves after each shared row: the fragment loads hit 32 banks
constexpr float k_neg_inf = -__builtin_huge_valf();
constexpr float k_log2e = 1.4426950408889634f;
constexpr float k_ln2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t half2_pack(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Rows of K and V per tile in shared memory: [key][d], k_pad halves after each.
template <int D>
constexpr int flash_row_halves() {
  return D + k_pad;
}
template <int D>
constexpr size_t flash_smem_bytes() {
  return size_t(2) * 2 * k_flash_tile * flash_row_halves<D>() * sizeof(__half);  // 2 stages of K and V
}

// Block = one AttnWork. Lane (g = lane / 4, t = lane % 4) of warp w holds the fragments of rows
// row_begin + 16w + g and + 8 (mma's m16n8k16 layouts: A rows g / g+8, B and C columns 2t, 2t+1).
// Tiles go through two stages of shared memory: cp.async fills tile i + 1 while tile i is used.
template <int D>
__global__ void __launch_bounds__(k_warps * 32, 3) flash_attention_kernel(AttnArgs a) {
  constexpr int T = k_flash_tile, KS = D / 16, DN = D / 8, NT = T / 8, ST = flash_row_halves<D>(), CH = D / 8;
  extern __shared__ uint4 flash_smem[];
  __half* const smem = reinterpret_cast<__half*>(flash_smem);  // [stage][K, V][T][ST]

  const AttnWork wk = a.works[blockIdx.x];
  const AttnSeqDesc sq = a.seqs[wk.seq];
  const KvDeviceLayout& L = a.layout;
  const int group = a.n_heads / L.n_kv_heads, rows = sq.n_tokens * group;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;

  const int pos_first = sq.pos_start + wk.row_begin / group;
  const int pos_last = sq.pos_start + (min(rows, wk.row_begin + k_flash_rows) - 1) / group;
  int kb = a.direct ? 0 : wk.part * a.part_size;
  const int ke = a.direct ? pos_last + 1 : min((wk.part + 1) * a.part_size, pos_last + 1);
  if (a.window > 0) kb = max(kb, pos_first - a.window + 1);
  if (kb >= ke) return;  // no row of the block reads this partition (attention_combine skips it)

  const int32_t* pages = a.pages + sq.page_offset;
  // Keys [k0, k0 + T) into `stage`: 16-byte chunks, a key's row by consecutive threads (each
  // thread the same chunk dc of keys tid / CH + i · (threads / CH)); keys past ke are zeros (their
  // probabilities are 0, and 0 · garbage could be NaN).
  const int ps = L.page_size, pshift = (ps & (ps - 1)) == 0 ? __ffs(ps) - 1 : -1;
  const int dc = int(threadIdx.x) % CH, key0 = int(threadIdx.x) / CH;
  const int64_t k_off = vec_index(L, 0, wk.kv_head, 0) * L.vec_bytes + 16 * dc;
  const int64_t v_delta = int64_t(L.n_kv_heads) * ps * L.vec_bytes;  // V vectors follow the layer's K
  const auto fetch = [&](int k0, int stage) {
    __half* kd = smem + stage * 2 * T * ST + 8 * dc;
#pragma unroll
    for (int i = 0; i < T * CH / (k_warps * 32); ++i) {
      const int key = key0 + i * (k_warps * 32 / CH), j = k0 + key;
      __half* kdst = kd + key * ST;
      if (j < ke) {
        const int pg = pshift >= 0 ? j >> pshift : j / ps, slot = j - pg * ps;
        const uint8_t* src = a.pool + int64_t(pages[pg]) * L.page_bytes + k_off + int64_t(slot) * L.vec_bytes;
        cp_async16(kdst, src);
        cp_async16(kdst + T * ST, src + v_delta);
      } else {
        *reinterpret_cast<uint4*>(kdst) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(kdst + T * ST) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    cp_async_commit();
  };
  fetch(kb, 0);

  bool valid[2];
  int pos[2], lo[2];
  int64_t orow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = wk.row_begin + 16 * warp + g + 8 * i, tok = r / group;
    valid[i] = r < rows;
    pos[i] = sq.pos_start + tok;
    lo[i] = a.window > 0 ? max(0, pos[i] - a.window + 1) : 0;
    orow[i] = int64_t(sq.token_begin + tok) * a.n_heads + wk.kv_head * group + r % group;
  }
  // Queries as A fragments: [k-step][a0 (row g, d 2t), a1 (row g+8), a2 (row g, d 2t+8), a3].
  uint32_t qf[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float2 v = make_float2(0.0f, 0.0f);
        if (valid[i]) v = *reinterpret_cast<const float2*>(a.q + orow[i] * D + 16 * kk + 8 * h + 2 * t);
        qf[kk][i + 2 * h] = half2_pack(v.x, v.y);
      }

  float m[2] = {k_neg_inf, k_neg_inf}, l[2] = {0.0f, 0.0f};
  float o[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dn][e] = 0.0f;
  const float scale2 = a.scale * k_log2e;
  // ldmatrix rows: K matrices (keys 8n + 8(m / 2) + r, head_dim 16kk + 8(m % 2)), V matrices
  // (keys 16j + 8(m % 2) + r, head_dim 8dn + 8(m / 2)), for lane = 8m + r.
  const unsigned smem_base = unsigned(__cvta_generic_to_shared(smem));
  const int lm = lane >> 3, lr = lane & 7;
  const unsigned k_lane = unsigned(((8 * (lm >> 1) + lr) * ST + 8 * (lm & 1)) * 2);
  const unsigned v_lane = unsigned(((8 * (lm & 1) + lr) * ST + 8 * (lm >> 1)) * 2);
  // Keys every row of the block sees: [unmasked_begin, unmasked_end).
  const int unmasked_end = min(ke, pos_first + 1);
  const int unmasked_begin = a.window > 0 ? pos_last - a.window + 1 : 0;

  int stage = 0;
#pragma unroll 1
  for (int k0 = kb; k0 < ke; k0 += T, stage ^= 1) {
    if (k0 + T < ke) {
      fetch(k0 + T, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile k0 is in for every thread
    const unsigned ks = smem_base + unsigned(stage * 2 * T * ST * 2), vs = ks + unsigned(T * ST * 2);

    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        uint32_t b[4];  // b0, b1 of key n-tiles n and n + 1
        ldmatrix_x4(b, ks + k_lane + unsigned((8 * n * ST + 16 * kk) * 2));
        mma_16816(s[n], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
        mma_16816(s[n + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
      }

    float mx[2] = {k_neg_inf, k_neg_inf};
    if (k0 + T <= unmasked_end && k0 >= unmasked_begin) {  // every row sees every key of the tile
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= scale2;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1, key = k0 + 8 * n + 2 * t + (e & 1);
          const bool seen = valid[i] && key < ke && key <= pos[i] && key >= lo[i];
          s[n][e] = seen ? s[n][e] * scale2 : k_neg_inf;
          mx[i] = fmaxf(mx[i], s[n][e]);
        }
    }
    float ref[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float mn = fmaxf(m[i], quad_max(mx[i]));
      ref[i] = mn == k_neg_inf ? 0.0f : mn;  // a row with nothing seen yet keeps zeros
      const float corr = exp2f(m[i] - ref[i]);
      m[i] = mn;
      l[i] *= corr;
#pragma unroll
      for (int dn = 0; dn < DN; ++dn) o[dn][2 * i] *= corr, o[dn][2 * i + 1] *= corr;
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - ref[e >> 1]);
        l[e >> 1] += s[n][e];
      }

    // P (the S accumulators' layout is the A fragments' of the next product) times V.
#pragma unroll
    for (int j = 0; j < T / 16; ++j) {
      const uint32_t pa[4] = {half2_pack(s[2 * j][0], s[2 * j][1]), half2_pack(s[2 * j][2], s[2 * j][3]),
                              half2_pack(s[2 * j + 1][0], s[2 * j + 1][1]),
                              half2_pack(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int dn = 0; dn < DN; dn += 2) {
        uint32_t b[4];  // b0, b1 of head_dim n-tiles dn and dn + 1
        ldmatrix_x4_trans(b, vs + v_lane + unsigned((16 * j * ST + 8 * dn) * 2));
        mma_16816(o[dn], pa[0], pa[1], pa[2], pa[3], b[0], b[1]);
        mma_16816(o[dn + 1], pa[0], pa[1], pa[2], pa[3], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next fetch refills it
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = quad_sum(l[i]);
    if (!valid[i]) continue;
    if (a.direct) {
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      float* out = a.out + orow[i] * D + 2 * t;
#pragma unroll
      for (int dn = 0; dn < DN; ++dn)
        *reinterpret_cast<float2*>(out + 8 * dn) = make_float2(o[dn][2 * i] * inv, o[dn][2 * i + 1] * inv);
    } else {
      const int64_t at = orow[i] * a.max_parts + wk.part;
      if (t == 0) {
        a.part_max[at] = m[i] * k_ln2;
        a.part_sum[at] = sum;
      }
      float* acc = a.part_acc + at * D + 2 * t;
#pragma unroll
      for (int dn = 0; dn < DN; ++dn) *reinterpret_cast<float2*>(acc + 8 * dn) = make_float2(o[dn][2 * i], o[dn][2 * i + 1]);
    }
  }
}

template <int D>
cudaError_t launch_flash(const AttnArgs& a, cudaStream_t stream) {
  constexpr size_t smem = flash_smem_bytes<D>();
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(flash_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  flash_attention_kernel<D><<<unsigned(a.n_works), k_warps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t flash_attention(const AttnArgs& a, cudaStream_t stream) {
  if (a.n_works == 0) return cudaSuccess;
  if (!flash_attention_serves(a.layout) || a.n_heads % a.layout.n_kv_heads != 0) return cudaErrorInvalidValue;
  return a.layout.head_dim == 64 ? launch_flash<64>(a, stream) : launch_flash<128>(a, stream);
}

}  // namespace exl::cuda
