#include "kernels/cuda/cuda_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"

namespace exl::cuda {

static_assert(k_sample_none == k_sample_nothing_allowed && k_sample_bad == k_sample_bad_logit);

namespace {

template <typename T>
size_t append(std::vector<uint8_t>& blob, std::span<const T> v) {
  const size_t off = (blob.size() + 15) / 16 * 16;
  blob.resize(off + v.size_bytes());
  if (!v.empty()) std::memcpy(blob.data() + off, v.data(), v.size_bytes());
  return off;
}

void check_row(const RowSampling& r, int64_t vocab, size_t i) {
  const char* p = "kernels: cuda: sample_rows: ";
  EXL_CHECK(r.row >= 0, p, "entry ", i, ": negative logits row ", r.row);
  EXL_CHECK(std::isfinite(r.temperature) && r.temperature >= 0.0f, p, "entry ", i, ": temperature ",
            r.temperature);
  EXL_CHECK(r.top_k >= 0 && r.top_p >= 0.0f && r.top_p <= 1.0f && r.min_p >= 0.0f && r.min_p <= 1.0f, p,
            "entry ", i, ": top_k ", r.top_k, ", top_p ", r.top_p, ", min_p ", r.min_p, " out of range");
  EXL_CHECK(r.u >= 0.0 && r.u < 1.0, p, "entry ", i, ": u ", r.u, " not in [0, 1)");
  EXL_CHECK(r.mask.empty() || int64_t(r.mask.size()) >= (vocab + 31) / 32, p, "entry ", i, ": mask has ",
            r.mask.size(), " words, a vocabulary of ", vocab, " needs ", (vocab + 31) / 32);
  for (const TokenBias& b : r.bias)
    EXL_CHECK(b.token >= 0 && b.token < vocab, p, "entry ", i, ": bias token ", b.token,
              " outside the vocabulary of ", vocab);
  for (const TokenCount& c : r.penalties)
    EXL_CHECK(c.token >= 0 && c.token < vocab && c.count >= 0, p, "entry ", i, ": penalty token ", c.token,
              " (count ", c.count, ") outside the vocabulary of ", vocab);
}

// Sorted entries from which one segmented sort of every head replaces a device-wide sort of each
// padded head (BENCHMARKS.md, session 36: a device-wide sort of 128K keys ~63 µs on the H100, a
// block's sort of a head that large ~630 µs, of a peaked row's head a few µs).
constexpr size_t k_segmented_min = 10;

}  // namespace

void CudaSampler::ensure_sort_temp(size_t bytes) {
  if (bytes <= sort_temp_bytes_) return;
  ctx_.sync();
  sort_temp_ = ctx_.alloc_unrecorded(bytes);
  sort_temp_bytes_ = bytes;
}

void CudaSampler::ensure(int64_t vocab, int64_t entries) {
  if (vocab != vocab_) {
    ctx_.sync();
    vocab_ = vocab;
    entries_ = 0;
  }
  if (entries > entries_) {
    ctx_.sync();
    entries = std::max(entries, entries_ * 2);
    const size_t n = size_t(entries * vocab);
    // Only the ids (small_: embedding_of_samples reads them inside fed steps) are memory a
    // recorded step uses; they get room for k_sample_ids_room entries at once, so that a batch
    // growing to that many rows does not drop the step graphs.
    x_ = ctx_.alloc_unrecorded(n * 4), keys_ = ctx_.alloc_unrecorded(n * 4), head_keys_ = ctx_.alloc_unrecorded(n * 4);
    head_ids_ = ctx_.alloc_unrecorded(n * 4), order_ = ctx_.alloc_unrecorded(n * 4), w_ = ctx_.alloc_unrecorded(n * 4);
    select_ = ctx_.alloc_unrecorded(size_t(entries) * k_select_bytes_per_entry);
    EXL_CUDA_CHECK(cudaMemsetAsync(select_.data(), 0, select_.bytes(), ctx_.stream()));
    if (small_.bytes() < size_t(entries) * 8) small_ = ctx_.alloc(size_t(std::max(entries, k_sample_ids_room)) * 8);
    slices_ = ctx_.alloc_unrecorded(size_t(entries) * (size_t(k_sample_slices) * 8 + 8));
    EXL_CUDA_CHECK(cudaMemsetAsync(slices_.data(), 0, slices_.bytes(), ctx_.stream()));
    entries_ = entries;
  }
}

CudaSampler::~CudaSampler() {
  if (done_) cudaEventDestroy(done_);
}

void CudaSampler::run(const float* logits, int64_t vocab, std::span<const RowSampling> rows,
                      std::span<int32_t> out) {
  EXL_CHECK(out.size() == rows.size(), "kernels: cuda: sample_rows: ", rows.size(), " entries but ", out.size(),
            " outputs");
  if (rows.empty()) return;
  launch(logits, vocab, rows);
  deferred_entries_ = 0;  // the device ids are this sampling's now
  ctx_.sync();
  std::memcpy(out.data(), static_cast<uint8_t*>(pinned_.data()) + out_offset_, out.size_bytes());
}

void CudaSampler::run_deferred(const float* logits, int64_t vocab, std::span<const RowSampling> rows) {
  EXL_CHECK(!rows.empty(), "kernels: cuda: sample_rows_deferred: no entries");
  launch(logits, vocab, rows);
  if (!done_) EXL_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  EXL_CUDA_CHECK(cudaEventRecord(done_, ctx_.stream()));
  pending_ = true;
  deferred_entries_ = int64_t(rows.size());
}

void CudaSampler::collect(std::span<int32_t> out) {
  EXL_CHECK(pending_, "kernels: cuda: collect_samples: no deferred sampling to collect");
  EXL_CHECK(int64_t(out.size()) == deferred_entries_, "kernels: cuda: collect_samples: ", out.size(),
            " outputs for ", deferred_entries_, " entries");
  ctx_.make_current();
  EXL_CUDA_CHECK(cudaEventSynchronize(done_));
  pending_ = false;
  std::memcpy(out.data(), static_cast<uint8_t*>(pinned_.data()) + out_offset_, out.size_bytes());
}

const int32_t* CudaSampler::deferred_ids(int64_t n) const {
  EXL_CHECK(n >= 0 && n <= deferred_entries_, "kernels: cuda: embedding_of_samples: ", n,
            " tokens, but the last deferred sampling has ", deferred_entries_, " entries");
  return static_cast<const int32_t*>(small_.data());
}

void CudaSampler::launch(const float* logits, int64_t vocab, std::span<const RowSampling> rows) {
  const char* p = "kernels: cuda: sample_rows: ";
  EXL_CHECK(!pending_, p, "a deferred sampling is not collected yet");
  EXL_CHECK(vocab > 0 && vocab < int64_t(std::numeric_limits<int32_t>::max()), p, "vocabulary of ", vocab);
  EXL_CHECK(int64_t(rows.size()) < (int64_t(1) << 31) / 8, p, rows.size(), " entries");
  for (size_t i = 0; i < rows.size(); ++i) check_row(rows[i], vocab, i);

  std::vector<SampleDesc> descs(rows.size());
  std::vector<int32_t> bias_ids, pen_ids, pen_counts;
  std::vector<float> bias_vals;
  std::vector<uint32_t> mask;
  std::vector<int64_t> seg_begin;
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowSampling& r = rows[i];
    SampleDesc& d = descs[i];
    d.row = r.row;
    d.u = r.u;
    d.temperature = r.temperature, d.top_p = r.top_p, d.min_p = r.min_p, d.top_k = r.top_k;
    d.repetition_penalty = r.repetition_penalty;
    d.frequency_penalty = r.frequency_penalty;
    d.presence_penalty = r.presence_penalty;
    d.bias_begin = int32_t(bias_ids.size()), d.bias_count = int32_t(r.bias.size());
    for (const TokenBias& b : r.bias) bias_ids.push_back(b.token), bias_vals.push_back(b.bias);
    d.pen_begin = int32_t(pen_ids.size()), d.pen_count = int32_t(r.penalties.size());
    for (const TokenCount& c : r.penalties) pen_ids.push_back(c.token), pen_counts.push_back(c.count);
    if (!r.mask.empty()) {
      d.mask_begin = int64_t(mask.size());
      mask.insert(mask.end(), r.mask.begin(), r.mask.begin() + (vocab + 31) / 32);
    }
    d.sorted = r.temperature > 0.0f && (r.top_k > 0 || (r.top_p > 0.0f && r.top_p < 1.0f));
    if (d.sorted) d.segment = int32_t(seg_begin.size()), seg_begin.push_back(int64_t(i) * vocab);
  }
  blob_.clear();
  const size_t o_desc = append(blob_, std::span<const SampleDesc>(descs));
  const size_t o_bid = append(blob_, std::span<const int32_t>(bias_ids));
  const size_t o_bval = append(blob_, std::span<const float>(bias_vals));
  const size_t o_pid = append(blob_, std::span<const int32_t>(pen_ids));
  const size_t o_pcnt = append(blob_, std::span<const int32_t>(pen_counts));
  const size_t o_mask = append(blob_, std::span<const uint32_t>(mask));
  const size_t o_seg_begin = append(blob_, std::span<const int64_t>(seg_begin));

  ctx_.make_current();
  ensure(vocab, int64_t(rows.size()));
  const int64_t n_items = int64_t(rows.size()) * vocab;
  const bool segmented = seg_begin.size() >= k_segmented_min;
  if (!seg_begin.empty()) {
    size_t bytes = 0;
    if (segmented)
      EXL_CUDA_CHECK(sort_rank_keys_segmented(nullptr, bytes, nullptr, nullptr, nullptr, nullptr, n_items,
                                              int(seg_begin.size()), nullptr, nullptr, ctx_.stream()));
    else
      EXL_CUDA_CHECK(sort_rank_keys(nullptr, bytes, nullptr, nullptr, nullptr, nullptr, int(vocab), ctx_.stream()));
    ensure_sort_temp(bytes);
  }
  if (params_.bytes() < blob_.size()) {
    ctx_.sync();
    params_ = ctx_.alloc_unrecorded(std::max(blob_.size(), params_.bytes() * 2));
  }
  // Pinned staging: a copy from pageable memory would first wait for the stream (the forward pass
  // still running), leaving the GPU idle while the host then queues the sampling kernels.
  const size_t out_bytes = rows.size() * sizeof(int32_t);
  if (pinned_.bytes() < blob_.size() + out_bytes) {
    ctx_.sync();
    pinned_ = ctx_.alloc_pinned(std::max(blob_.size() + out_bytes, 2 * pinned_.bytes()));
  }
  auto* staged = static_cast<uint8_t*>(pinned_.data());
  std::memcpy(staged, blob_.data(), blob_.size());
  auto* base = static_cast<uint8_t*>(params_.data());
  EXL_CUDA_CHECK(cudaMemcpyAsync(base, staged, blob_.size(), cudaMemcpyHostToDevice, ctx_.stream()));

  SampleArgs a;
  a.logits = logits;
  a.vocab = vocab;
  a.n_entries = int32_t(rows.size());
  a.slices = sample_slices(int64_t(rows.size()), ctx_.sm_count());
  a.descs = reinterpret_cast<const SampleDesc*>(base + o_desc);
  a.bias_ids = reinterpret_cast<const int32_t*>(base + o_bid);
  a.bias_vals = reinterpret_cast<const float*>(base + o_bval);
  a.pen_ids = reinterpret_cast<const int32_t*>(base + o_pid);
  a.pen_counts = reinterpret_cast<const int32_t*>(base + o_pcnt);
  a.mask = reinterpret_cast<const uint32_t*>(base + o_mask);
  a.x = x_.f32();
  a.keys = static_cast<uint32_t*>(keys_.data());
  a.order = static_cast<const int32_t*>(order_.data());
  a.w = w_.f32();
  a.out = static_cast<int32_t*>(small_.data());
  a.n_cand = a.out + rows.size();
  a.counters = static_cast<unsigned*>(slices_.data());  // then max_logit, slice_max, slice_arg
  a.max_logit = reinterpret_cast<float*>(a.counters + entries_);
  a.slice_max = a.max_logit + entries_;
  a.slice_arg = reinterpret_cast<int32_t*>(a.slice_max + entries_ * k_sample_slices);
  auto* sel = static_cast<uint8_t*>(select_.data());  // per entry: total, segment end, bins, ...
  a.total = reinterpret_cast<double*>(sel);
  a.segment_end = reinterpret_cast<int64_t*>(sel + entries_ * 8);
  a.bins = reinterpret_cast<uint32_t*>(sel + entries_ * 16);
  a.select_below = a.bins + entries_ * k_sample_bins;
  a.n_head = reinterpret_cast<int32_t*>(a.select_below + entries_);
  a.slice_head = a.n_head + entries_;
  a.head_keys = static_cast<uint32_t*>(head_keys_.data());
  a.head_ids = static_cast<int32_t*>(head_ids_.data());
  a.pad_heads = !segmented;
  const bool greedy_only =
      std::all_of(descs.begin(), descs.end(), [](const SampleDesc& d) { return d.temperature == 0.0f; });
  EXL_CUDA_CHECK(sample_prepare(a, greedy_only, ctx_.stream()));
  if (!seg_begin.empty()) {
    EXL_CUDA_CHECK(sample_select(a, ctx_.stream()));
    size_t bytes = sort_temp_bytes_;
    auto* order = static_cast<int32_t*>(order_.data());
    if (segmented) {
      EXL_CUDA_CHECK(sort_rank_keys_segmented(sort_temp_.data(), bytes, a.head_keys, a.keys, a.head_ids, order,
                                              n_items, int(seg_begin.size()),
                                              reinterpret_cast<const int64_t*>(base + o_seg_begin), a.segment_end,
                                              ctx_.stream()));
    } else {
      for (const int64_t off : seg_begin)
        EXL_CUDA_CHECK(sort_rank_keys(sort_temp_.data(), bytes, a.head_keys + off, a.keys + off, a.head_ids + off,
                                      order + off, int(vocab), ctx_.stream()));
    }
  }
  if (!greedy_only) EXL_CUDA_CHECK(sample_finish(a, ctx_.stream()));
  EXL_CUDA_CHECK(cudaMemcpyAsync(staged + blob_.size(), a.out, out_bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
  out_offset_ = blob_.size();
}

}  // namespace exl::cuda
