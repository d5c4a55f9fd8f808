// Inline PTX shared by the tensor-core kernels (exl2_gemm.cu, flash_attention.cu,
// paged_attention.cu): asynchronous global-to-shared copies, ldmatrix fragment loads, movmatrix
// transposes and the m16n8k16 fp16 mma with fp32 accumulation, each a thin wrapper of one instruction (compute
// capability 8.0+), and the sm_90a warpgroup mma with what it needs (fences, groups,
// shared-memory descriptors). Shared addresses are generic pointers into shared memory or, for
// ldmatrix, their 32-bit shared-window form (__cvta_generic_to_shared). CUDA sources only.
#pragma once
#include <cstdint>

namespace exl::cuda {

// 16 bytes (cached at L2 only) from global to shared memory, asynchronously: a commit closes the
// group of copies issued since the last one, and cp_async_wait<N> waits until at most N of the
// thread's groups are still in flight.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(gmem) : "memory");
}
// The same for N = 16, or 4 bytes (also cached in L1), at a shared-window address
// (__cvta_generic_to_shared, computed once by the caller), issued only where `pred` holds: one
// predicated instruction, no branch, so that a loop of them keeps its addresses in registers
// instead of rebuilding them in a block per copy.
template <int N>
__device__ __forceinline__ void cp_async_if(unsigned smem_at, const void* gmem, bool pred) {
  static_assert(N == 16 || N == 4, "cp_async_if: 16 or 4 bytes");
  if constexpr (N == 16) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %2, 0;\n  @p cp.async.cg.shared.global [%0], [%1], 16; }"
                 ::"r"(smem_at), "l"(gmem), "r"(int(pred)) : "memory");
  } else {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %2, 0;\n  @p cp.async.ca.shared.global [%0], [%1], 4; }"
                 ::"r"(smem_at), "l"(gmem), "r"(int(pred)) : "memory");
  }
}
// A request that L2 hold the 128-byte line at p (global memory); nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8×8 fp16 matrices from shared memory, lane l naming row l % 8 of matrix l / 8 (mma B
// fragments: r_i = matrix i's row l / 4, columns 2(l % 4) and + 1; with trans, column l / 4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The warp's 8×8 b16 matrix held as one register per lane (lane l: row l / 4, columns 2(l % 4) and
// + 1, low half first), transposed in the same layout (compute capability 7.5+).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

// c += A·B for the warp's 16×16 fp16 A (a0..a3) and 16×8 B (b0, b1) in the PTX ISA's fragment
// layouts, fp32 accumulators c.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}


// Orders the thread's earlier generic-proxy writes of shared memory (stores, cp.async) before
// later async-proxy reads (wgmma operands) once a barrier follows; a no-op before sm_90.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Warpgroup mma (sm_90a only; compiled where __CUDA_ARCH_FEAT_SM90_ALL is defined). wgmma_f16_rs<N>
// queues d += A·B for the warpgroup's 64×16 fp16 A in registers (per warp, 16 rows in mma_16816's
// A fragment layout: warp w holds rows 16w .. 16w + 15) and a 16×N fp16 B in shared memory (desc),
// fp32 accumulators d (per warp, rows 16w + g and + 8 of 8-column n-tile j as mma_16816's c at
// d[j]). It runs asynchronously: wgmma_fence before the first wgmma that reads registers written
// since the last one, wgmma_commit closes a group, wgmma_wait<N> waits until at most N groups are
// in flight; until then A's registers and d belong to the tensor cores.
// Shared memory written through the generic proxy needs fence_proxy_async_shared() by the
// writers, then a barrier, before a wgmma reads it.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across a wgmma fence or wait.
template <int R, int C>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[R][C][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[r][c][e])::"memory");
}

// Descriptor of a K-major B operand without swizzle at shared address `at` (16-byte aligned): 8×8
// core matrices of 128 contiguous bytes, `lbo` bytes between the two core matrices of a row group
// along K and `sbo` bytes between 8-row groups along N.
__device__ __forceinline__ uint64_t wgmma_desc_k_major(unsigned at, unsigned lbo, unsigned sbo) {
  return uint64_t((at & 0x3FFFFu) >> 4) | uint64_t((lbo & 0x3FFFFu) >> 4) << 16 |
         uint64_t((sbo & 0x3FFFFu) >> 4) << 32;
}

// Defined for N = 64 (the only width in use).
template <int N>
__device__ void wgmma_f16_rs(float (&d)[N / 8][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_f16_rs<64>(float (&d)[8][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      :
        "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}
#endif

}  // namespace exl::cuda
