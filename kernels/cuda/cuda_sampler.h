// Backend::sample_rows for the CUDA backend: checks and packs the RowSampling inputs, runs the
// kernels of sampling.h on the context's stream and downloads one id per entry. Work arrays
// (six per entry, vocab elements each, and launch 1's per-slice results) grow on demand and are
// kept; no step graph uses them (CudaContext::alloc_unrecorded), except the ids, which fed steps
// read (room for k_sample_ids_room entries from the start). Host code (.cpp); owned by the
// backend, used by its thread.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/sampling.h"

namespace exl::cuda {

inline constexpr int64_t k_sample_ids_room = 1024;

class CudaSampler {
 public:
  explicit CudaSampler(CudaContext& ctx) : ctx_(ctx) {}
  ~CudaSampler();
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;
  // Samples rows[i] of logits [*, vocab] (device memory) into out[i]; waits. Throws exl::Error
  // ("kernels: cuda: sample_rows: ...") for inputs outside the vocabulary or of the wrong size.
  void run(const float* logits, int64_t vocab, std::span<const RowSampling> rows, std::span<int32_t> out);
  // The same without the wait (Backend::sample_rows_deferred): the ids stay on the device
  // (deferred_ids) and reach the host with collect(). One deferred sampling at a time: run() and
  // run_deferred() throw while one is not collected.
  void run_deferred(const float* logits, int64_t vocab, std::span<const RowSampling> rows);
  void collect(std::span<int32_t> out);
  // The device ids of the last deferred sampling (valid until the next sampling), which must
  // have had at least n entries.
  const int32_t* deferred_ids(int64_t n) const;

 private:
  void ensure(int64_t vocab, int64_t entries);
  void ensure_sort_temp(size_t bytes);  // waits for the stream when it grows the buffer
  // Queues the sampling and the download of its ids into pinned_ at out_offset_.
  void launch(const float* logits, int64_t vocab, std::span<const RowSampling> rows);
  cudaEvent_t done_ = nullptr;  // after the last deferred sampling's download
  bool pending_ = false;
  int64_t deferred_entries_ = 0;
  size_t out_offset_ = 0;
  CudaContext& ctx_;
  int64_t vocab_ = 0, entries_ = 0;
  // Per entry [vocab]: x, rank keys (then the head's sorted keys), the head's keys and ids in id
  // order, the head's ids in rank order, probabilities.
  Buffer x_, keys_, head_keys_, head_ids_, order_, w_, sort_temp_, small_, params_;
  // Per entry: Σe, its segment's end, k_sample_bins bin counts (zeroed once, left zero by the
  // kernels), select_below, n_head, k_sample_slices head counts.
  static constexpr size_t k_select_bytes_per_entry = 16 + 4 * size_t(k_sample_bins) + 8 + 4 * size_t(k_sample_slices);
  Buffer select_;
  Buffer slices_;  // launch 1's counters (zeroed once, left zero by the kernels) and slice results
  Buffer pinned_;  // host: the packed inputs, then the ids
  size_t sort_temp_bytes_ = 0;
  std::vector<uint8_t> blob_;
};

}  // namespace exl::cuda
