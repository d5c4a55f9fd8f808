// Causal attention of many query rows over a paged fp16 cache on tensor cores (kernel in
// flash_attention.cu): prompts, and a suffix on a long cached prefix (an agent turn), in one launch
// that reads the pool's pages in place.
//
// Work is an AttnPlan's (attention_plan.h) planned with k_flash_rows rows per work: a block of 4
// warps takes 64 query rows of one sequence that share a kv head (row r = token r / group, query
// head kv_head·group + r % group; 16 rows per warp) and one partition of positions. It streams
// the partition's keys in tiles of k_flash_tile through two stages of shared memory (cp.async
// fills the next tile's K and V rows while the current one is used); S = Q·Kᵀ and O += P·V run as
// m16n8k16 mma (fp16 operands, fp32 accumulation) with an online softmax per row in fp32, so each
// block reads its keys once, whatever the number of rows. Queries
// and probabilities are rounded to fp16, as on the cuBLAS path (prefill_attention.h), whose place
// this takes for fp16 caches: no fp16 copy of the context, no score matrix in memory. A `direct`
// plan's blocks write normalized rows; otherwise partials for attention_combine
// (paged_attention.h). AttnArgs::out_perm is not written. The reference is the CPU backend's
// attention (CudaBackendTest.AttentionFlashKernelOnFp16CachesMatchesCpu and
// AttentionLargePrefillUsesTensorCorePath; the CUDA emulator runs both).
#pragma once
#include <cuda_runtime_api.h>

#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {

inline constexpr int k_flash_rows = 64;  // query rows per block
inline constexpr int k_flash_tile = 64;  // key positions per K/V tile
// Smallest partition the plan splits a context into: several tiles per block.
inline constexpr int k_flash_min_part = 4 * k_flash_tile;

// The layouts the kernel reads: fp16 caches with head_dim 64 or 128.
inline bool flash_attention_serves(const KvDeviceLayout& L) {
  return L.format == 1 && (L.head_dim == 64 || L.head_dim == 128);
}

// `a` as for attention() with a plan of k_flash_rows rows per work; queued on `stream`.
cudaError_t flash_attention(const AttnArgs& a, cudaStream_t stream);

}  // namespace exl::cuda
