// EXL2 matrix products on the GPU (kernels in exl2_gemm.cu). The packed tensors are the on-disk
// ones, uploaded unchanged (no load-time shuffle); `groups` and `group_of_row` are derived tables.
//   - exl2_gemv: few activation rows. Each lane owns 4 output columns and decodes their words in
//     registers (one 128-bit load per word row); a block is 4 warps on the same 128 columns, each
//     on a quarter of the block's K-slice of `k_slice` permuted rows (multiple of 32), whose
//     activations the block gathers through `perm` into shared memory (the act-order permutation
//     costs one gather per block; with Exl2GemvSet::x_up the gather forms silu(x)·x_up, the MLP's
//     down projection input). A warp streams its rows run by run (Exl2Segment: word rows and scale
//     groups follow from the run) where the layout allows, else walks the groups; 2-, 4- and 8-bit
//     32-row blocks multiply in half2 (exact fp16 weights, fp16 activations, fp16 partial sums
//     over at most 16 rows, then fp32); 3-, 5- and 6-bit blocks in fp32. The warps' sums meet in
//     shared memory; with several K-slices each block writes partial sums and the last block of
//     each column tile adds them (+ bias) into y, in slice order (deterministic; one launch, y
//     need not be initialized).
//   - exl2_reconstruct: dequantizes columns [n0, n0+nc) into an fp16 [K, nc] row-major matrix in
//     original row order (row perm[j] ← permuted row j), for the cuBLAS path of larger batches;
//     exl2_reconstruct_f32 into fp32 for the exact path (cuda_linear.h).
// Launchers return the launch status; all work is queued on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/exl2_decode.h"
#include "kernels/cuda/gemv_shape.h"
#include "kernels/cuda/host_device.h"
#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {

inline constexpr int k_exl2_gemv_threads = 128;
// Activation rows one EXL2 gemv block handles (1, 2 or 4; more rows use more blocks, each reading
// the weights again). Four, not eight: the 8-row variant needed ~250 registers (two blocks per SM)
// and measured slower at every batch from 5 to 16 on the H200 (BENCHMARKS.md).
inline int exl2_gemv_rows_per_block(int rows) { return rows > 2 ? 4 : rows; }
inline constexpr int k_exl2_gemv_cols_per_block = 128;

// A run of consecutive groups of one width in which every group holds `group_rows` rows (the last
// may hold fewer) and starts on a 32-row boundary: its 32-row blocks' words are consecutive word
// rows, block i of the run at word row qrow_start + i·bits, in group group0 + 32·i / group_rows.
// exl2_gemv streams such runs without group lookups.
struct alignas(16) Exl2Segment {
  int32_t row_start, rows, bits, qrow_start;
  int32_t group0, group_rows;
  int32_t block_shift;  // log2(group_rows / 32) when that is a power of two, else -1
  int32_t pad;
};
inline constexpr int k_exl2_max_segments = 8;

// A 32-row block of a layout whose groups are whole 32-row blocks (exl2_segments > 0), as the
// tensor-core kernel fetches it: its first word row and (scale group << 4) | width.
struct alignas(8) Exl2Block {
  int32_t qrow;
  int32_t meta;
};

struct Exl2DeviceView {
  const uint32_t* q_weight = nullptr;     // [QR, Np]
  const uint32_t* q_scale = nullptr;      // [G, Np/8]
  const uint16_t* q_scale_max = nullptr;  // [G] fp16
  const Exl2GroupDesc* groups = nullptr;  // [G]
  const int32_t* group_of_row = nullptr;  // [K] group index of each permuted row
  const int32_t* perm = nullptr;          // [K] permuted row j holds input feature perm[j]
  const Exl2Segment* segs = nullptr;      // [n_segs] covering rows [0, K) in order; null when the
  int n_segs = 0;                         // layout has no such runs (the gemv walks groups instead)
  const Exl2Block* blocks = nullptr;      // [K / 32] where n_segs > 0, else null
  int n_groups = 0;
  int K = 0, N = 0, Np = 0;
  int max_bits = 0;  // the widest group
};

// The runs of `groups` (in row order, covering [0, K)) as Exl2Segments written to `out` (room for
// k_exl2_max_segments); returns their count, or 0 when some group is not made of whole 32-row
// blocks or there are more runs than fit.
int exl2_segments(const Exl2GroupDesc* groups, int n_groups, int K, Exl2Segment* out);

// The [K / 32] Exl2Blocks of `groups` (in row order, covering [0, K), every group whole 32-row
// blocks: where exl2_segments finds runs) written to `out` (host).
void exl2_blocks(const Exl2GroupDesc* groups, int n_groups, Exl2Block* out);

// Benchmarks: true makes exl2_gemv walk groups even where segments could be streamed.
void exl2_gemv_walk_only(bool on);

// y[rows, N] = x[rows, K] · Wᵀ (+ bias) for one to k_exl2_gemv_max_jobs matrices of the same K that
// read the same x (q/k/v, gate/up), in one launch. With S = ceil(K / k_slice) slices each job needs
// a partials area [S, rows, N] floats (unused when S = 1), and `counters` one counter per column
// tile of every job (· ceil(rows / rows-per-block)), zero before the first call and left zero by
// every call. Job j writes its y with its own partials area and owns the column tiles
// [tile_begin, tile_begin + exl2_gemv_tiles(N)), consecutive from 0.
inline constexpr int k_exl2_gemv_max_jobs = 3;
struct Exl2GemvJob {
  Exl2DeviceView w;
  const float* bias = nullptr;
  float* y = nullptr;
  float* partials = nullptr;
  int tile_begin = 0;
};
// The attention inputs' epilogue (with jobs q, k, v in that order and head_dim ==
// k_exl2_gemv_cols_per_block, so that a column tile is one head): the block that finishes a tile
// rotates q and k heads like rope_qk_store (positions [rows], inv_freq [head_dim/2], attn_factor)
// and stores the k and v heads into the paged cache at slots [rows]. pool null: none of it.
struct Exl2RopeKv {
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float attn_factor = 1.0f;
  uint8_t* pool = nullptr;
  KvDeviceLayout layout{};
  const int32_t* slots = nullptr;
};

// Hand-off between a gemv (or attention) and the gemv that reads its output next, so that the
// reader's blocks need neither the act-order permutation lookup nor a pass over all of x for the
// norm. Producer side: the block that finishes a column tile also stores each final value y[r][n]
// at out_perm[r][inv_perm[n]] (inv_perm: the reader's act-order position of input n; one out_perm
// per job) and, with ssq_out, job 0's tile sum of squares of y (in double) at
// ssq_out[r · tiles + tile]. Reader side (x_in_order, at most 2 rows, K divisible by 4, x, x_up and
// norm_w 16-byte aligned): x and x_up hold the inputs in act-order (rows of K), a norm's weights
// come permuted likewise and need ssq: the norm factor
// of row r is formed from ssq[r · ssq_parts ...] (fixed order) instead of every block reading x.
// The results are those of the permutation gather, bit for bit, except where the two double sums
// of squares round to different floats.
struct Exl2GemvHandoff {
  bool x_in_order = false;
  const double* ssq = nullptr;
  int ssq_parts = 0;
  const int32_t* inv_perm = nullptr;
  float* out_perm[k_exl2_gemv_max_jobs] = {};
  double* ssq_out = nullptr;
};

// A tensor-core set's input as the op that produces it writes it (mma_staging.cuh), so that
// exl2_mma_set (x null) runs no staging kernel: for every job j, input feature n < K of row r as
// fp16 (saturated at ±65504) at the permuted row and fragment slot that at[j][n] names ((row << 5)
// | slot: exl2_mma_stage_map), and zeros at the padding rows [K, 128·⌈K/128⌉) of the last chunk.
// `staged` holds exl2_mma_staged_bytes(rows, K, n_jobs) bytes.
// from[j] (may be null): the same placement seen from the output, for producers that hold a whole
// row (mma_stage_row): 16-byte units of a row's staged input, eight input features (or −1, a zero)
// per unit.
// in_order: every job's permutation is the identity (at[j][n] >> 5 == n: input feature n is
// permuted row n), so that a column tile of the producer is one chunk of the staged rows
// (engine/mlp_order.h puts an MLP's gate/up in down's order for this; the gate/up sums then
// store whole 16-byte units).
struct Exl2MmaStaging {
  uint16_t* staged = nullptr;
  const int32_t* at[k_exl2_gemv_max_jobs] = {};
  const int32_t* from[k_exl2_gemv_max_jobs] = {};
  int n_jobs = 0, K = 0, rows = 0;
  bool in_order = false;
};
// at[n] of a matrix (exl2_mma_stage_map's [K] entries, host): the permuted row j = inv_perm[n] and
// the fragment slot of j in its 32-row block of groups[group_of_row[j]].bits.
void exl2_mma_stage_map(const Exl2GroupDesc* groups, const int32_t* group_of_row, const int32_t* perm, int K,
                        int32_t* out);
// from of a matrix (host; exl2_mma_stage_gather_entries(K) = 128 · ⌈K/128⌉ entries): for unit
// u = 2 · (8 · chunk + mma step) + k-half of a row's staged input, entries 8u .. 8u + 7 are the
// input features at its k = 0 .. 7 (those exl2_mma_stage_map places there), −1 at the padding
// rows. A unit is 8 contiguous halves of the row in mma_x_index's layout at every rows-per-block.
void exl2_mma_stage_gather_map(const Exl2GroupDesc* groups, const int32_t* group_of_row, const int32_t* perm, int K,
                               int32_t* out);
int exl2_mma_stage_gather_entries(int K);

// x_up non-null: the jobs' input is silu(x) ⊙ x_up (same shape as x), formed while gathering.
// norm_w non-null (x_up null): the input is rms_norm(x) ⊙ norm_w (norm_w [K]), every block
// reducing its rows of x itself, as the rms_norm kernel does (double sums, the same rounding).
// residual: y += result instead of y = result (the residual stream; y must not alias x).
// exact false: streamed 3-, 5- and 6-bit blocks of 1- and 2-row blocks take the faster 1 + q/2^B form, whose block sums
// round differently from the CPU's (exl2_gemm.cu, block_dot_f32); for forwards that are not held
// to the CPU's rounding (Backend::linears, not linears_exact).
struct Exl2GemvSet {
  Exl2GemvJob jobs[k_exl2_gemv_max_jobs];
  int n_jobs = 0;
  const float* x_up = nullptr;
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  bool residual = false;
  bool exact = true;
  Exl2RopeKv rope;  // not with residual
  Exl2GemvHandoff io;
  // exl2_mma_set only, n_jobs > 0 (two jobs, gate and up, of equal N, several K-slices, no
  // residual): the sums go on as silu(gate) ⊙ up staged for the set that reads them (its K = N),
  // and y is not written.
  Exl2MmaStaging swiglu_to;
  // exl2_mma_set only, one job with residual and several K-slices (y: the residual stream, rows of
  // N): the sums go on as rms_norm(y) ⊙ norm_to_w (eps norm_to_eps) staged for the set that reads
  // it (its K = N): the values of the sums and then rms_norm_stage, bit for bit. norm_to_counters:
  // one zeroed counter per row, left zero.
  Exl2MmaStaging norm_to;
  const float* norm_to_w = nullptr;
  float norm_to_eps = 0.0f;
  unsigned* norm_to_counters = nullptr;
  // exl2_mma_set only, one row block (rows ≤ 64): > 0 runs the product stream-K, that many blocks
  // sharing the set's (column tile, 128-row chunk) units equally in tile-then-chunk order
  // (exl2_mma_stream_block); each block writes what it summed of a tile into the tile's slot
  // (its index among the tiles' blocks, so slot order is K order) of the jobs' partials, which hold
  // exl2_mma_stream_slots(...) slots, and the sums add a tile's slots as they add K-slices. For
  // sets whose column tiles alone fill few of the resident blocks (gate/up at 64 rows: 224 tiles
  // on 396 places) without a second wave of K-slices. k_slice is then ignored.
  int stream_blocks = 0;
};
// Column tiles of an N-column matrix in one gemv launch (kernel and host alike).
EXL_HD int exl2_gemv_tiles(int N) { return (N + k_exl2_gemv_cols_per_block - 1) / k_exl2_gemv_cols_per_block; }

// Stream-K (Exl2GemvSet::stream_blocks): of `units` units shared by `blocks` blocks, block p holds
// [⌊p·units/blocks⌋, ⌊(p + 1)·units/blocks⌋); this is the block that holds unit u (blocks ≤ units).
EXL_HD int exl2_mma_stream_block(int64_t u, int64_t units, int blocks) {
  return int(((u + 1) * blocks - 1) / units);
}
// Blocks (slots) that hold part of column tile `tile` of `chunks` units.
EXL_HD int exl2_mma_stream_tile_slots(int tile, int chunks, int64_t units, int blocks) {
  return exl2_mma_stream_block(int64_t(tile + 1) * chunks - 1, units, blocks) -
         exl2_mma_stream_block(int64_t(tile) * chunks, units, blocks) + 1;
}
// The most slots any of `tiles` tiles of `chunks` units takes among `blocks` blocks: the partial
// sums' slots per job (host).
int exl2_mma_stream_slots(int tiles, int chunks, int blocks);

cudaError_t exl2_gemv_set(const Exl2GemvSet& set, const float* x, int rows, int k_slice, unsigned* counters,
                          cudaStream_t stream);

// Tensor-core form of exl2_gemv_set for batches (exl2_gemm.cu, exl2_mma_kernel): a first kernel
// gathers every job's activations through its perm (silu(x)·x_up with x_up) once, as fp16
// (saturated at ±65504) in fragment order, into `staged` (exl2_mma_staged_bytes; the caller's
// scratch, overwritten). Then each block streams its K-slice of them, and each lane its own words,
// through a double-buffered ring of shared memory (cp.async); each lane of a quad decodes one
// 32-row block of a 128-row chunk for four columns, straight into scaled fp16 mma fragments (w = (q − z)·scale rounded once to
// fp16, as exl2_reconstruct forms it), and m16n8k16 mma accumulate in fp32; K-slices (their
// partial sums in the jobs' `partials`, no counters) are added in slice order by a third kernel
// (deterministic), a thread per output.
// Blocks take exl2_mma_rows_per_block(rows) rows (8, 16, 32 or 64; more rows use more blocks) and
// k_exl2_gemv_cols_per_block columns of one job.
// Needs streamed layouts (every job's n_segs > 0), k_slice a multiple of 128 and no norm or
// hand-off; x_up, residual and bias as in the gemv. With several K-slices the sums may go on:
// rope (jobs q, k, v, no residual) rotates and stores each head as the gemv does; swiglu_to and
// norm_to stage the next set's input (Exl2GemvSet). `exact` is ignored (the results are at
// fp16-input precision, like the cuBLAS path). The jobs' q_scale_max must hold an even number of
// entries (the kernel copies them in aligned pairs). Compute capability 8.0 or newer.
EXL_HD constexpr int exl2_mma_rows_per_block(int rows) { return rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }

// How exl2_mma_set runs (CudaContext::mma_form).
// overlapped: launch the three kernels overlapped (overlapped_launch.cuh): each may start during
// the previous kernel's tail, the tensor-core kernel fetching its first weights meanwhile.
// wgmma: 64-row blocks run their products as warpgroup mma while the lanes decode the next half
// chunk (only where exl2_wgmma_available; the same results up to the order of fp32 additions
// inside the tensor cores). Fewer rows keep mma.sync, measured faster there (BENCHMARKS.md,
// session 26).
// (Blocks of up to 32 rows over 256 columns, a lane on two column quads so that a chunk's fixed
// costs are paid once per 8 columns, lost 5–10% at 4–32 rows on the H200: BENCHMARKS.md, session
// 32; removed.)
// stream_k: 1 = sets of one row block whose K-slices would fill few of the resident blocks run
// stream-K (Exl2GemvSet::stream_blocks; cuda_linear.cpp, exl2_mma_stream_blocks); n > 1 = every
// set of one row block runs on n blocks (tests: uneven shares at small sizes); 0 = never. Over the
// same inputs the sums group differently from K-slices (fp32 order), so not bit for bit.
struct Exl2MmaForm {
  bool overlapped = false;
  bool wgmma = false;
  int stream_k = 0;
};
// Resident blocks per multiprocessor the kernel's registers are bounded for.
EXL_HD constexpr int exl2_mma_blocks_per_sm(int rows) { return rows <= 16 ? 6 : rows <= 32 ? 4 : 3; }
// Dynamic shared memory of an exl2_mma_set block of `rows` rows whose set's widest group has
// `wrows` bits.
size_t exl2_mma_smem_bytes(int rows, int wrows, Exl2MmaForm form);
// Blocks of such a set that one multiprocessor holds at once: exl2_mma_blocks_per_sm (of the form),
// or fewer where `smem_per_sm` bytes of shared memory hold fewer.
int exl2_mma_resident_blocks(int rows, int wrows, Exl2MmaForm form, size_t smem_per_sm);
size_t exl2_mma_staged_bytes(int rows, int K, int n_jobs);
// x null: `staged` already holds the input, written by its producer (Exl2MmaStaging); no staging
// kernel runs.
cudaError_t exl2_mma_set(const Exl2GemvSet& set, const float* x, int rows, int k_slice, uint16_t* staged,
                         Exl2MmaForm form, cudaStream_t stream);
// Whether `device` (the current one) runs exl2_mma_set's wgmma form: compute capability 9.0 and
// this binary built with its sm_90a code (a probe kernel; call outside stream capture).
bool exl2_wgmma_available(int device);

// out[K, nc] (fp16 bits) = W[n0 .. n0+nc) transposed, rows in original input order.
cudaError_t exl2_reconstruct(const Exl2DeviceView& w, int n0, int nc, uint16_t* out, cudaStream_t stream);
// The same in fp32: exactly the CPU backend's dequantized values (kernels/cpu/dequantize.h).
cudaError_t exl2_reconstruct_f32(const Exl2DeviceView& w, int n0, int nc, float* out, cudaStream_t stream);

}  // namespace exl::cuda
