// Linear layers of the CUDA backend: weights uploaded in their packed form plus derived tables,
// and the choice of kernel per call. Host code only.
//   EXL2 / GPTQ: rows ≤ k_quant_gemv_max_rows use the gemv kernels (weights decoded in registers,
//   fp32 accumulation; run()'s EXL2 gemv forms 3-, 5- and 6-bit blocks the faster way that rounds
//   differently from the CPU, run_exact()'s and the fused ops' as the CPU does). Larger batches dequantize column chunks of W to an fp16 scratch [K, nc]
//   and multiply with cublasGemmEx (fp16 inputs, activations converted to fp16 and saturated at
//   ±65504, fp32 accumulation and output): tensor cores, at fp16 input precision.
//   Dense: rows ≤ k_dense_gemv_max_rows use dense_gemv (fp32 accumulation); larger batches use
//   cuBLAS: f16/bf16 weights with activations converted to the same type (fp32 accumulation),
//   f32 weights with plain fp32 SGEMM (no TF32).
//   Exact path (run_exact: Backend::linears_exact, forwards with a q8/q4 cache): batches that run()
//   gives to a gemv kernel go there, and EXL2 batches up to k_exl2_exact_gemv_max_rows (run_linears);
//   larger ones dequantize W to fp32 (the CPU backend's values),
//   split W and x into fp16 hi + lo parts (dense_gemm.h: split_half) and sum three cuBLAS GEMMs
//   with fp32 accumulation, Wh·xh + (Wh·xl + Wl·xh) / k_split_lo_scale (the dropped Wl·xl is
//   2⁻²² relative): fp32-level results on tensor cores, at three times the tensor-core work.
// y must not alias x. The GPTQ gemv adds K-slice partial sums with float atomics, so its results
// can differ between runs at fp32 rounding level; the EXL2 gemv reduces its slices in a fixed
// order and is deterministic.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/exl2_gemm.h"

namespace exl::cuda {

inline constexpr int64_t k_quant_gemv_max_rows = 16;
// EXL2 matrices with streamed layouts (Exl2DeviceView::n_segs > 0) take the tensor-core kernel
// (exl2_mma_set) for exl2_mma_min_rows()..exl2_mma_max_rows() rows outside the exact path: run(),
// run_fused() and run_linears() with exact false. By default that is where it was measured faster
// than the gemv and cuBLAS paths (k_exl2_mma_auto_*: 4..128 rows, llama3-8b decode and prefill on
// the H200, BENCHMARKS.md sessions 17 and 19: at 256 rows cuBLAS on dequantized weights wins); EXL_CUDA_MMA=1 widens it to every count the kernel takes
// (k_exl2_mma_min_rows..k_exl2_mma_max_rows; the CUDA tests do), EXL_CUDA_MMA=0 turns it off, and
// EXL_CUDA_MMA_MAX_ROWS (16..4096) moves the top for tuning runs.
inline constexpr int64_t k_exl2_mma_min_rows = 3;
inline constexpr int64_t k_exl2_mma_max_rows = 128;
inline constexpr int64_t k_exl2_mma_auto_min_rows = 4;
inline constexpr int64_t k_exl2_mma_auto_max_rows = 128;
// Matrices of at most k_exl2_mma_small_weights weights (N·K; a set: its largest) keep the kernel up
// to k_exl2_mma_small_max_rows rows: for them cuBLAS's fixed cost per call is most of the product
// (demo model on the H200, 384×1024 and 384×384 sets at 130–208 rows: 50–170 µs a call through
// cuBLAS, ~20 µs in the kernel at 128; 48 prompts' prefill 39 → 20 ms, BENCHMARKS.md session 22).
// They also take it from k_exl2_mma_min_rows (3) rows: the demo model's 3-row verify passes ran
// their linears in 12.5–13 µs on the gemv against ~10 µs at 4–5 rows in the kernel.
inline constexpr int64_t k_exl2_mma_small_weights = int64_t(1) << 22;
inline constexpr int64_t k_exl2_mma_small_max_rows = 256;
bool exl2_mma_enabled();
// The bottom for matrices of `weights` weights (N·K; a set's largest); EXL_CUDA_MMA_MIN_ROWS
// (3..16) moves it for tuning runs.
int64_t exl2_mma_min_rows(int64_t weights);
// The top for matrices of `weights` weights (N·K; a set's largest).
int64_t exl2_mma_max_rows(int64_t weights);
// The exact path keeps EXL2 batches on the gemv up to this many rows: per row it computes what
// it does at 16 rows, and at 32 rows it is still faster than three split GEMMs over an fp32
// reconstruction of W (decode at batch 32 with a q4 cache, H200: BENCHMARKS.md).
inline constexpr int64_t k_exl2_exact_gemv_max_rows = 32;

class CudaLinear : public PreparedLinear {
 public:
  virtual void run(CudaContext& ctx, const float* x, float* y, int64_t rows) const = 0;
  // Whether run_fused is available (EXL2 matrices at rows ≤ k_quant_gemv_max_rows, and up to
  // exl2_mma_max_rows() when not `exact` on streamed layouts): one pass whose input is x, or
  // silu(x) ⊙ x_up when x_up is given, and which adds into y when `residual`. With `exact` the pass
  // computes what run_exact does; otherwise what run does.
  virtual bool fuses(int64_t /*rows*/, bool /*exact*/) const { return false; }
  // `io`: the launch's Exl2GemvHandoff (exl2_gemm.h), for handoff_perm() sets only.
  virtual void run_fused(CudaContext&, const float* /*x*/, const float* /*x_up*/, float* /*y*/, int64_t /*rows*/,
                         bool /*residual*/, bool /*exact*/, const Exl2GemvHandoff* /*io*/ = nullptr) const {}
  // Whether run (exact false) or run_exact / run_linears (exact true) call cuBLAS at `rows`, which
  // step graphs do not capture.
  virtual bool calls_cublas(int64_t rows, bool exact) const { return rows > gemv_max_rows(); }
  // run() without fp16 rounding of x and W on the large-batch path (see above).
  void run_exact(CudaContext& ctx, const float* x, float* y, int64_t rows) const;
  size_t weight_bytes = 0;  // device bytes one pass over the weights reads (for bandwidth reports)

 protected:
  // Batches up to this many rows take run()'s gemv kernel.
  virtual int64_t gemv_max_rows() const = 0;
  // run_exact() at those sizes: run(), except where the gemv has a faster, differently rounded
  // form for run() (EXL2: Exl2GemvSet::exact).
  virtual void run_gemv_exact(CudaContext& ctx, const float* x, float* y, int64_t rows) const { run(ctx, x, y, rows); }
  // out[K, nc] (fp32, row-major) = W's columns [n0, n0 + nc) in original input order.
  virtual void fill_f32(CudaContext& ctx, int n0, int nc, float* out) const = 0;
  Buffer bias_;  // [N] fp32, empty without bias
};

// ys[i] = x · W_iᵀ for linears that read the same x: EXL2 matrices of equal K at gemv sizes share
// one launch (exl2_gemv_set, up to 3 per launch); any other linear runs on its own, through
// run_exact() when `exact`.
void run_linears(CudaContext& ctx, std::span<const CudaLinear* const> ls, const float* x, std::span<float* const> ys,
                 int64_t rows, bool exact = false);

// ys[i] = (rms_norm(x) ⊙ norm_w) · W_iᵀ in one gemv launch that normalizes while gathering; only for
// what fuse_norm() accepts: 1..3 EXL2 matrices of one K at rows ≤ k_norm_gemv_max_rows (every
// block reads its rows of x whole: cheaper than a separate norm launch for one or two rows, not
// for eight, measured on the H200).
inline constexpr int64_t k_norm_gemv_max_rows = 2;
bool fuse_norm(std::span<const CudaLinear* const> ls, int64_t rows);
// With `rope` (ls = q, k, v of head_dim k_exl2_gemv_cols_per_block): the launch also rotates q and
// k and stores k and v into the cache (Exl2RopeKv).
void run_linears_normed(CudaContext& ctx, std::span<const CudaLinear* const> ls, const float* x, const float* norm_w,
                        float eps, std::span<float* const> ys, int64_t rows, const Exl2RopeKv* rope = nullptr,
                        const Exl2GemvHandoff* io = nullptr);
// Tensor-core sets whose input the op before them writes, staged (Exl2MmaStaging), with no
// staging kernel of their own. mma_serves: whether `ls` (1..3 EXL2 matrices of one K) run at `rows`
// (not exact) as one tensor-core set.
bool mma_serves(std::span<const CudaLinear* const> ls, int64_t rows);
// ys[i] = (rms_norm(x) ⊙ norm_w) · W_iᵀ where mma_serves(ls, rows): the norm kernel writes the set's
// input, or, `prestaged`, the op before did (run_layer_output_staged's next). The same values as
// rms_norm, then run_linears, bit for bit. With `rope` (ls = q, k, v of
// k_exl2_gemv_cols_per_block-wide heads): then rope_qk_store's rotation and cache store, bit for
// bit, done by the set's K-slice sums where it has several.
void run_linears_norm_staged(CudaContext& ctx, std::span<const CudaLinear* const> ls, const float* x,
                             const float* norm_w, float eps, std::span<float* const> ys, int64_t rows,
                             const Exl2RopeKv* rope = nullptr, bool prestaged = false);
// A layer's output block as a chain of tensor-core sets at `rows` (each mma_serves), every op
// writing the next one's staged input:
//   - with o: x[rows, H] += att · W_oᵀ (att gathered by the staging kernel, or, att_staged, already
//     staged by the op before: decode attention, AttnArgs::stage), its K-slice sums then
//     staging gate/up's normed input (Exl2GemvSet::norm_to; a norm kernel where o has one slice);
//     without: the norm kernel stages it;
//   - the MLP, x += (silu(g) ⊙ u) · W_downᵀ with g, u = (rms_norm(x) ⊙ norm_w) · W_{gate,up}ᵀ: when
//     gate/up run in several K-slices, their sums stage down's input (g and u [rows, I] are then not
//     written);
//   - with next (1..3 matrices reading x, e.g. the next layer's q/k/v): down's sums end by staging
//     rms_norm(x) ⊙ next_norm_w (the same eps) for them, for run_linears_norm_staged(…, prestaged).
// The same values as the separate ops (the o projection's pass with residual, rms_norm,
// run_linears, the swiglu + linear + residual pass, rms_norm), bit for bit.
struct StagedLayerOutput {
  const CudaLinear* o = nullptr;
  const float* att = nullptr;
  const CudaLinear *gate = nullptr, *up = nullptr, *down = nullptr;
  float* x = nullptr;
  const float* norm_w = nullptr;
  float eps = 0.0f;
  float *g = nullptr, *u = nullptr;
  int64_t rows = 0;
  std::span<const CudaLinear* const> next;
  const float* next_norm_w = nullptr;
  bool att_staged = false;
};
void run_layer_output_staged(CudaContext& ctx, const StagedLayerOutput& a);
// Where the input of the one-matrix tensor-core set {l} (mma_serves at `rows`) goes when an op
// stages it beforehand, in the mma scratch made `bytes` large.
Exl2MmaStaging mma_staging_of(CudaContext& ctx, const CudaLinear& l, int64_t rows, size_t bytes);
// The mma scratch (Scratch::mma_staged) bytes that run_layer_output_staged asks for: an op that
// stages its input beforehand makes the scratch that large, so that the chain finds it in place.
size_t layer_output_staged_bytes(const StagedLayerOutput& a);

// A gemv set that can read its input in act-order (Exl2GemvHandoff): EXL2 matrices that share one
// permutation, of a K divisible by 4 (16-byte rows), at up to k_handoff_max_rows rows (the 1- and 2-row gemv blocks: the 4-row block
// has no registers to spare for it). Returns that permutation (host copy: permuted row j holds
// input perm[j]) and its inverse on the device, or nulls.
inline constexpr int64_t k_handoff_max_rows = 2;
struct HandoffPerm {
  std::shared_ptr<const std::vector<int32_t>> perm;
  std::shared_ptr<const Buffer> inv;  // owns inv_perm
  const int32_t* inv_perm = nullptr;
};
HandoffPerm handoff_perm(std::span<const CudaLinear* const> set, int64_t rows);

std::unique_ptr<CudaLinear> prepare_cuda_linear(CudaContext& ctx, const LinearWeights& w);

// K-slice of the EXL2 gemv (exl2_gemm.h: 128 columns per block): a multiple of 32 (of 128 unless
// K is smaller) in 128..1024 that gives at most about `target_blocks` blocks (one wave at b=1).
int exl2_gemv_k_slice(int64_t K, int64_t N, int64_t rows, int target_blocks);

// K-slice of the tensor-core kernel (exl2_mma_set, blocks of k_exl2_gemv_cols_per_block columns): a
// multiple of 128 that gives about `target_blocks` blocks (at most 4096 rows: the activations
// stream through a ring of chunks).
int exl2_mma_k_slice(int64_t K, int64_t N, int64_t rows, int target_blocks);
// Stream-K blocks (Exl2GemvSet::stream_blocks, 0: K-slices) for a tensor-core set of `tiles`
// 128-column tiles over K rows at `rows` rows whose K-slices would be `k_slice` long, aiming at
// `target_blocks` (exl2_mma_target_blocks); one row block only (rows ≤ 64). `mode`
// (Exl2MmaForm::stream_k): 0 never; n > 1 min(n, units) blocks (tests); 1 target_blocks where the
// set's K-slices' blocks fill under 80% of the waves they take (gate/up at 64 rows: 224 of 396)
// and every block gets at least two 128-row chunks.
int exl2_mma_stream_blocks(int64_t K, int64_t tiles, int64_t rows, int k_slice, int target_blocks, int mode);
// Tensor-core blocks aimed for, for a set whose widest group has `wrows` bits: one wave of
// exl2_mma_resident_blocks (as many as the kernel's registers and the multiprocessors' shared
// memory allow, in the context's form), or EXL_CUDA_MMA_BLOCKS_PER_SM (1..64) per multiprocessor.
int exl2_mma_target_blocks(const CudaContext& ctx, int64_t rows, int wrows);

// EXL2 gemv blocks aimed for per multiprocessor: 8 for one or two activation rows, 4 for more
// (fewer, longer K-slices: b=8 decode 557 → 601 tok/s on the H200, b=1 333 → 327 at 4), or
// EXL_CUDA_GEMV_BLOCKS_PER_SM (1..64) for tuning runs.
int gemv_blocks_per_sm(int64_t rows);

// K-slice (rows per gemv block, a multiple of 32 in 64..1024) that gives about `target_blocks`
// blocks (4 per multiprocessor: enough loads in flight to approach memory bandwidth).
int gemv_k_slice(int64_t K, int64_t N, int64_t rows, int target_blocks);

}  // namespace exl::cuda
