// Inline PTX shared by the tensor-core kernels (exl2_gemm.cu, flash_attention.cu): asynchronous
// global-to-shared copies, ldmatrix fragment loads and the m16n8k16 fp16 mma with fp32
// accumulation, each a thin wrapper of one instruction (compute capability 8.0+). Shared
// addresses are generic pointers into shared memory or, for ldmatrix, their 32-bit shared-window
// form (__cvta_generic_to_shared). CUDA sources only.
#pragma once
#include <cstdint>

namespace exl::cuda {

// 16 (cached at L2 only) or 4 bytes (also in L1) from global to shared memory, asynchronously:
// a commit closes the group of copies issued since the last one, and cp_async_wait<N> waits until
// at most N of the thread's groups are still in flight.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(at), "l"(gmem) : "memory");
}
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

// c += A·B for the warp's 16×16 fp16 A (a0..a3) and 16×8 B (b0, b1) in the PTX ISA's fragment
// layouts, fp32 accumulators c.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace exl::cuda
