// Token sampling on the GPU (kernels in sampling.cu): the arithmetic of engine/generate/sampler.h's default
// mode, so that only the token id leaves the device.
//
// Launches (cuda_sampler.cpp drives them):
//   1. sample_prepare (SampleArgs::slices blocks per entry, then the entry's last block): raw
//      logits (NaN/+inf → k_sample_bad_logit), mask (clear bit → -inf),
//      bias (l + b on allowed tokens), penalties (l > 0 ? l / rp : l · rp, then
//      l - (count · fp + pp)), argmax (lowest id among equal maxima; none →
//      k_sample_nothing_allowed). Greedy entries end here. Otherwise every candidate
//      (post-penalty logit > -inf) gets x = (l - max) / T and a rank key (x descending); other
//      tokens get x = NaN and the largest key. Each operation is the correctly rounded float op
//      the CPU does (explicit __f*_rn: no FMA contraction). Entries with top_k or top_p ("sorted")
//      also count their candidates per key bin (k_sample_bins: 1/8 octave of |x| each) and sum
//      e = float(exp(double(x))) over them in double.
//   2. sample_select (sorted entries): the head of the rank order that top_k or top_p can keep —
//      the first bins holding top_k candidates (when top_k cuts), else those whose mass, counted
//      at each bin's smallest e, reaches top_p · Σe · (1 + 1e-4) (else every candidate) — then
//      those candidates' keys and ids, in id order, into the entry's head arrays. Each kept w is
//      float(e / Σe) ≥ (e / Σe)(1 − 2⁻²⁴), so the head's w reach top_p and the cut of launch 4
//      lies inside it.
//   3. a stable sort of each head's keys with the ids as values, i.e. rank order with ties by
//      lower id — the order of the CPU's by_rank — of a few hundred candidates where the
//      distribution is peaked: sort_rank_keys_segmented for many entries (a warp or a block per
//      head), sort_rank_keys of each padded head for a few (a flat distribution's head is most
//      of the vocabulary, which one block sorts ten times slower than the whole GPU).
//   4. sample_finish: walks the candidates in the CPU's draw order (rank order when top_k cut
//      something or top_p is on, else id order): keeps the first top_k; p = float(e / Σe) with
//      e = float(exp(double(x))) (the CPU uses float expf: both are within 0.502 ulp of exp, so an
//      e differs by 1 ulp in rare cases; Σe from launch 1 unless top_k cut); top_p keeps the shortest prefix whose mass reaches
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
  int32_t sorted = 0;                      // launches 2 and 3 run for this entry
  int32_t segment = -1;                    // its index among the sorted entries
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
  const int32_t* order = nullptr;  // the head's ids per entry in rank order, for sorted entries
  // Sorted entries (launches 1b–4): candidates per key bin [n_entries][k_sample_bins] (zero
  // between calls), Σe, the head (keys below select_below: n_head of them, slice_head per block
  // of launch 2b) as keys and ids in id order [n_entries][vocab], its end per segment
  // (entry · vocab + n_head) for launch 3.
  uint32_t* bins = nullptr;
  double* total = nullptr;
  uint32_t* select_below = nullptr;
  int32_t* n_head = nullptr;
  int32_t* slice_head = nullptr;
  uint32_t* head_keys = nullptr;
  int32_t* head_ids = nullptr;
  int64_t* segment_end = nullptr;
  // Launch 2c also fills each head's keys past n_head with the largest key (for sort_rank_keys
  // over the whole vocabulary).
  int32_t pad_heads = 0;
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
// Key bins of candidates (x ≤ 0): bin 0 holds x = 0, bin b > 0 the keys [(b + 0x7ff) << 20,
// (b + 0x800) << 20), i.e. 1/8 octave of |x|; the last holds x = -FLT_MAX.
constexpr int k_sample_bins = 2041;

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
// Launch 2 (sorted entries; grid as sample_prepare's): the heads and their ends.
cudaError_t sample_select(const SampleArgs& a, cudaStream_t stream);
// Launch 3 for a few entries: a stable ascending radix sort of one padded head (keys[n] with
// values ids[n]) over the whole GPU. temp == nullptr: sets temp_bytes and does nothing else.
cudaError_t sort_rank_keys(void* temp, size_t& temp_bytes, const uint32_t* keys, uint32_t* keys_out,
                           const int32_t* ids, int32_t* order, int n, cudaStream_t stream);
// Launch 3 for more entries: a stable ascending sort of each segment [begin[s], end[s]) of keys with values ids
// into the same positions of keys_out / order (positions in no segment are left as they are);
// n_items bounds every segment's end. Small heads sort in a warp or a block, large ones get a
// block each. temp == nullptr: sets temp_bytes and does nothing else.
cudaError_t sort_rank_keys_segmented(void* temp, size_t& temp_bytes, const uint32_t* keys, uint32_t* keys_out,
                                     const int32_t* ids, int32_t* order, int64_t n_items, int n_segments,
                                     const int64_t* begin, const int64_t* end, cudaStream_t stream);

}  // namespace exl::cuda
