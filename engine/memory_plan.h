// Device memory planning before a model is loaded: the bytes its weights take once a backend has
// prepared them, the scratch the forward pass may grow to, and how many KV-cache pages fit in
// what is left. Pure arithmetic over the model files and the options: nothing is uploaded or
// allocated, so a model or cache that cannot fit fails with one clear error before anything is.
// The byte counts mirror the CUDA backend (kernels/cuda/); the CPU backend allocates host memory
// and reports no device, so its plans are never checked. Plain data and functions; thread-safe.
//
// Weights (weight_bytes), every buffer rounded up to k_alloc_granularity (512 B), or to
// k_large_page (2 MiB) from k_large_page / 2 up (the driver maps large allocations in 2 MiB pages):
//   embedding  vocab · hidden · dtype_size (the table as stored: f16, bf16 or f32)
//   norms      2·layers + 1 buffers of hidden · 4 (converted to f32)
//   linears    linear_device_bytes of q, k, v, o, gate, up, down of every layer and of the head
//              (a tied head is prepared from the embedding table: a second copy, as Model does)
// linear_device_bytes (K = in, N = out, Np = N padded to 32, G = groups, QR = q_rows):
//   EXL2   q_weight QR·Np·4, q_scale G·Np/8·4, q_scale_max G·2, groups G·16, group_of_row K·4,
//          perm K·4, bias N·4
//   GPTQ   qweight K/8·N·4, qzeros G·N/8·4, scales G·N·2, row_group K·4, perm K·4, bias N·4
//   dense  K·N·dtype_size, bias N·4
//
// Scratch (scratch_bytes), for T = max_step_tokens, R = min(max_batch_seqs, T) logit rows,
// S = max_seq_len, H, I, V, NH, KVH, D the config's dims, QD = NH·D, KVD = KVH·D,
// Kmax = max(H, I, QD); "·1.25" where a CUDA scratch area grows to 1.25× what is asked:
//   activations   2·T·(3H + 2QD + 2KVD + 2I)·4 + 2·R·(H + V)·4   (Model's buffers; they double)
//   act16         1.25 · T·Kmax·2                          (fp16 activations of batched GEMMs)
//   dequant       1.25 · max(k_dequant_chunk_elems, 128·Kmax)·2   (fp16 weight column chunk)
//   gemv partials 1.25 · 16·4 · max over (K, N) of the fused EXL2 gemv sets (q+k+v, gate+up, o,
//                 down, head) of N·ceil(K/ks), with ks its K slice for the largest grid
//                 (k_max_gemv_blocks) on any device
//   attn partials 1.25 · (k_max_attn_blocks·16 + 2·T·NH)·(2 + D)·4   (split decode attention)
//   prefill attn  1.25 · (2·KVH·S·D·2 + min(NH·T·S, max(256 Mi, 16·NH·S))·6)   (fp16 K/V, scores)
//   fixed         k_fixed_runtime_bytes (cuBLAS workspace, staging rings, graphs, counters)
//
// Cache: pages of KvLayout::page_bytes(). An explicit cache_pages is checked; cache_pages = 0
// sizes the pool from the device memory left after weights, scratch and the safety margin
// (k_margin_fixed + total/100), capped at max_batch_seqs · ceil(S / page_size) pages, and fails
// when fewer than ceil(min(S, T) / page_size) pages (one step's prefill) fit. Without a device
// (CPU) an automatic cache gets min(cap, cpu_default_pages) pages.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/formats/model_dir.h"
#include "kernels/backend.h"
#include "kernels/kv_layout.h"
#include "kernels/linear_weights.h"

namespace exl {

class Model;

inline constexpr int64_t k_alloc_granularity = 512;
inline constexpr int64_t k_large_page = int64_t(2) << 20;
inline constexpr int64_t k_dequant_chunk_elems = int64_t(64) << 20;  // CudaContext::dequant_chunk_elems
inline constexpr int64_t k_max_gemv_blocks = 8 * 160;                // 8 blocks per SM, ≤ 160 SMs
inline constexpr int64_t k_max_attn_blocks = 2 * 160;                // 2 blocks per SM, ≤ 160 SMs
inline constexpr int64_t k_fixed_runtime_bytes = int64_t(96) << 20;
inline constexpr int64_t k_margin_fixed = int64_t(256) << 20;

// What the loading path will run: the generator's options and the longest sequence.
struct MemoryRequest {
  KvFormat cache_format = KvFormat::fp16;
  int page_size = 64;
  int cache_pages = 0;       // 0: size from free device memory
  int max_batch_seqs = 16;
  int max_step_tokens = 512;
  int64_t max_seq_len = 0;   // positions one sequence may reach; 0: config max_position_embeddings
  int cpu_default_pages = 512;
  // Bytes per page of caches kept beside this one for the same tokens (a draft model's K/V):
  // planned with each page, so an automatic cache leaves room for them.
  int64_t companion_page_bytes = 0;
};

// The plan; every byte count is device bytes. `fits` is false only with a device and a cache
// (explicit, or the automatic minimum) that does not fit; `error` then says why.
struct MemoryPlan {
  std::string model;      // the directory, as given
  MemoryRequest request;  // as given, with max_seq_len resolved
  int64_t embedding_bytes = 0, norm_bytes = 0, linear_bytes = 0;
  int64_t weight_bytes = 0;   // their sum
  int64_t scratch_bytes = 0;
  int64_t page_bytes = 0;
  int cache_pages = 0;
  int64_t cache_tokens = 0;   // cache_pages · page_size
  int64_t cache_bytes = 0;    // cache_pages · page_bytes
  bool cache_auto = false;    // sized here rather than requested
  int64_t max_pages = 0;      // the automatic cap
  KvFormat cache_format = KvFormat::fp16;
  std::optional<DeviceMemory> device;
  int64_t margin_bytes = 0;   // kept free on the device
  bool fits = true;
  std::string error;
  int64_t total_bytes() const { return weight_bytes + scratch_bytes + cache_bytes; }
};

// Device bytes of one allocation of `bytes` (the rounding above; 0 for none).
int64_t device_alloc_bytes(int64_t bytes);
// Device bytes of one prepared linear (header formula).
int64_t linear_device_bytes(const LinearWeights& w);
// Scratch reserve for `cfg` under `req` (header formula); req.max_seq_len must be resolved (> 0).
int64_t scratch_reserve_bytes(const ModelConfig& cfg, const MemoryRequest& req);

// Plans `dir` (opened with weights; every linear is loaded and validated, nothing uploaded)
// against `device` (nullopt: no device limit). Throws exl::Error for malformed weights or options.
MemoryPlan plan_memory(const ModelDir& dir, const MemoryRequest& req, const std::optional<DeviceMemory>& device);

// Throws the plan's error when it does not fit:
//   "engine: memory plan: model 'DIR' needs X GiB of weights + Y GiB of cache (N tokens, fp16)
//    + Z GiB of scratch, but device 0 has W GiB free (...)".
void check_fits(const MemoryPlan& plan);

// The loading path: plans against backend.device_memory(), throws when the plan does not fit
// (before any allocation), then builds the Model (uploading its weights). `plan` receives the plan.
std::unique_ptr<Model> load_planned_model(const ModelDir& dir, Backend& backend, const MemoryRequest& req,
                                          MemoryPlan& plan);

// "1.25 GiB" / "12.0 MiB" / "512 B".
std::string format_bytes(int64_t bytes);
// Multi-line text of the plan for `exlagent info`.
std::string describe(const MemoryPlan& plan);

}  // namespace exl
