// Token sampling on the GPU (kernels in sampling.cu): the arithmetic of engine/generate/sampler.h's default
// mode, so that only the token id leaves the device.
//
// Three launches (cuda_sampler.cpp drives them):
//   1. sample_prepare (SampleArgs::slices blocks per entry, then the entry's last block): raw
//      logits (NaN/+inf → k_sample_bad_logit), mask (clear bit → -inf),
//      bias (l + b on allowed tokens), penalties (l > 0 ? l / rp : l · rp, then
//      l - (count · fp + pp)), argmax (lowest id among equal maxima; none →
//      k_sample_nothing_allowed). Greedy entries end here. Otherwise every candidate
//      (post-penalty logit > -inf) gets x = (l - max) / T and a rank key (x descending); other
//      tokens get x = NaN and the largest key. Each operation is the correctly rounded float op
//      the CPU does (explicit __f*_rn: no FMA contraction).
//   2. sort_rank_keys (entries with top_k or top_p; sort_rank_keys_segmented for all of them at
//      once when there are several): a stable radix sort of the keys with the ids as values, i.e.
//      rank order with ties by lower id — the order of the CPU's by_rank.
//   3. sample_finish: walks the candidates in the CPU's draw order (rank order when top_k cut
//      something or top_p is on, else id order): keeps the first top_k; p = float(e / Σe) with
//      e = float(exp(double(x))) (the CPU uses float expf: both are within 0.502 ulp of exp, so an
//      e differs by 1 ulp in rare cases); top_p keeps the shortest prefix whose mass reaches
//      top_p (else all, not renormalized) and renormalizes; min_p zeroes p < min_p · max p and
//      renormalizes; the draw takes r = u · Σp and the first token whose cumulative sum exceeds r
//      (else the last token with p > 0). Sums are in double like the CPU's, but in block order
//      (per-thread sequential segments, then a scan), so a cut or a draw can differ from the CPU
//      only when a cumulative sum lies within ~1e-15 (relative) of top_p or r — or within the
//      1-ulp effect of a differing e.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace exl::cuda {

// One sampled entry as the kernels read it (host-packed by cuda_sampler.cpp).
struct SampleDesc {
  int64_t row = 0;         // logits row
  int64_t mask_begin = -1; // first word in the mask array, -1 = all allowed
  double u = 0.0;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  int32_t top_k = 0;
  int32_t bias_begin = 0, bias_count = 0;  // into bias_ids / bias_vals
  int32_t pen_begin = 0, pen_count = 0;    // into pen_ids / pen_counts
  int32_t sorted = 0;                      // launch 2 ran for this entry
};

// Device arrays of one sampling call; the per-entry work arrays hold n_entries · vocab elements.
struct SampleArgs {
  const float* logits = nullptr;  // [*, vocab]
  int64_t vocab = 0;
  int32_t n_entries = 0;
  int32_t slices = 1;  // blocks per entry in launches 1a/1b, 1..k_sample_slices (sample_slices)
  const SampleDesc* descs = nullptr;
  const int32_t* bias_ids = nullptr;
  const float* bias_vals = nullptr;
  const int32_t* pen_ids = nullptr;
  const int32_t* pen_counts = nullptr;
  const uint32_t* mask = nullptr;
  float* x = nullptr;          // scaled candidate logits by id (NaN = not a candidate)
  uint32_t* keys = nullptr;    // rank keys by id
  const int32_t* order = nullptr;  // sorted ids per entry (rank order), for sorted entries
  float* w = nullptr;          // probabilities in walk order
  int32_t* n_cand = nullptr;   // candidates per entry
  int32_t* out = nullptr;      // result per entry (k_sample_pending until decided)
  // Launch 1's slices: per entry room for k_sample_slices argmax values and ids (k_sample_bad: a
  // bad logit in the slice), the maximum logit, and a counter (zero between launches).
  float* slice_max = nullptr;
  int32_t* slice_arg = nullptr;
  float* max_logit = nullptr;
  unsigned* counters = nullptr;
};
// The most blocks per entry in launch 1 (each a contiguous slice of the vocabulary).
constexpr int k_sample_slices = 64;

// Blocks per entry for `entries` entries on `sm_count` multiprocessors: about two blocks of 1024
// threads per multiprocessor in all (one wave), at least one and at most k_sample_slices per entry.
// One entry gets 64 slices; 64 entries of a 128K vocabulary get 5 blocks of ~26K ids each instead
// of 64 blocks of ~2K (4,096 blocks whose barriers and merge dominated their two loads per thread).
constexpr int sample_slices(int64_t entries, int sm_count) {
  const int64_t want = entries < 1 ? 1 : (2 * int64_t(sm_count < 1 ? 1 : sm_count) + entries - 1) / entries;
  return int(want < 1 ? 1 : want > k_sample_slices ? k_sample_slices : want);
}

// Result codes as in kernels/row_sampling.h (C++20, which nvcc's C++17 does not read; the host
// side static_asserts that they agree), plus the internal "not decided yet".
constexpr int32_t k_sample_none = -1, k_sample_bad = -2, k_sample_pending = -3;

// greedy_only: every entry has temperature 0 (launch 1 decides them all; nothing else to run).
cudaError_t sample_prepare(const SampleArgs& a, bool greedy_only, cudaStream_t stream);
cudaError_t sample_finish(const SampleArgs& a, cudaStream_t stream);
// Stable ascending radix sort of keys[n] with values iota[n] into keys_out / order. With
// temp == nullptr sets temp_bytes to the scratch it needs and does nothing else.
cudaError_t sort_rank_keys(void* temp, size_t& temp_bytes, const uint32_t* keys, uint32_t* keys_out,
                           const int32_t* iota, int32_t* order, int n, cudaStream_t stream);
// The same for several entries in one launch: segment s is [begin[s], end[s]) of keys / ids,
// sorted into the same positions of keys_out / order (positions in no segment are left as they
// are); n_items bounds every segment's end. Large segments get one block each, so this beats
// n_segments calls of sort_rank_keys once there are a few of them (cuda_sampler.cpp).
cudaError_t sort_rank_keys_segmented(void* temp, size_t& temp_bytes, const uint32_t* keys, uint32_t* keys_out,
                                     const int32_t* ids, int32_t* order, int64_t n_items, int n_segments,
                                     const int64_t* begin, const int64_t* end, cudaStream_t stream);
// iota[i] = i % period for i < n (period > 0): each entry's ids 0..period-1 in turn.
cudaError_t fill_iota(int32_t* iota, int64_t n, int64_t period, cudaStream_t stream);

}  // namespace exl::cuda
