#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include <climits>
#include <cmath>

#include "kernels/cuda/sampling.h"

namespace exl::cuda {
namespace {

constexpr int k_threads = 1024;
constexpr int k_warps = k_threads / 32;
constexpr unsigned k_all = 0xffffffffu;
constexpr uint32_t k_not_candidate = 0xffffffffu;

__device__ bool allowed(const uint32_t* mask, int64_t t) {
  return mask == nullptr || ((mask[t >> 5] >> (t & 31)) & 1u) != 0;
}

// x descending as an ascending unsigned key (the largest x gets the smallest key).
__device__ uint32_t rank_key(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;
}

// Block-wide reductions (every thread gets the result). `sh` holds k_warps values.
__device__ double block_sum(double v, double* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(k_all, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0;
  for (int i = 0; i < k_warps; ++i) t += sh[i];
  return t;
}

__device__ float block_max(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(k_all, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = sh[0];
  for (int i = 1; i < k_warps; ++i) t = fmaxf(t, sh[i]);
  return t;
}

__device__ int block_min_int(int v, int* sh) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(k_all, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  int t = sh[0];
  for (int i = 1; i < k_warps; ++i) t = min(t, sh[i]);
  return t;
}

__device__ int block_max_int(int v, int* sh) { return -block_min_int(-v, sh); }

// The largest value and, among equal maxima, the lowest index (INT_MAX when all are -inf).
struct ArgMax {
  float v;
  int i;
};
__device__ ArgMax better(ArgMax a, ArgMax b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

__device__ ArgMax block_argmax(ArgMax m, float* shv, int* shi) {
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax other{__shfl_xor_sync(k_all, m.v, o), __shfl_xor_sync(k_all, m.i, o)};
    m = better(m, other);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shv[threadIdx.x >> 5] = m.v, shi[threadIdx.x >> 5] = m.i;
  __syncthreads();
  ArgMax t{shv[0], shi[0]};
  for (int i = 1; i < k_warps; ++i) t = better(t, ArgMax{shv[i], shi[i]});
  return t;
}

// Exclusive prefix sum over the threads of the block, in thread order.
__device__ double block_exclusive_scan(double v, double* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(k_all, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) sh[warp] = incl;
  __syncthreads();
  double base = 0;
  for (int i = 0; i < warp; ++i) base += sh[i];
  return base + incl - v;
}

struct Shared {
  double d[k_warps];
  float f[k_warps];
  int i[k_warps];
};

// Σ w[0, n) in double: per-thread sequential segments, then the block.
__device__ double block_total(const float* w, int n, Shared& sh) {
  const int seg = (n + k_threads - 1) / k_threads;
  const int begin = min(n, int(threadIdx.x) * seg), end = min(n, begin + seg);
  double s = 0;
  for (int j = begin; j < end; ++j) s += w[j];
  return block_sum(s, sh.d);
}

// w[j] = float(w[j] / Σw) for j < n (the CPU's renormalize()).
__device__ void renormalize(float* w, int n, Shared& sh) {
  const double total = block_total(w, n, sh);
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += k_threads) w[j] = float(double(w[j]) / total);
  __syncthreads();
}

struct Crossing {
  int first;  // the first j with w[j] > 0 whose cumulative sum crosses target; INT_MAX = none
  int last;   // the last j with w[j] > 0; -1 = none
};

// Walks w[0, n) in order with a double running sum, like the CPU's loops: crossing means
// cum >= target (inclusive) or target < cum. Each thread takes a contiguous segment, starting
// from the exclusive scan of the segment sums.
__device__ Crossing find_crossing(const float* w, int n, double target, bool inclusive, Shared& sh) {
  const int seg = (n + k_threads - 1) / k_threads;
  const int begin = min(n, int(threadIdx.x) * seg), end = min(n, begin + seg);
  double local = 0;
  for (int j = begin; j < end; ++j) local += w[j];
  double cum = block_exclusive_scan(local, sh.d);
  int first = INT_MAX, last = -1;
  for (int j = begin; j < end; ++j) {
    const float p = w[j];
    if (p <= 0.0f) continue;
    cum += p;
    last = j;
    if (first == INT_MAX && (inclusive ? cum >= target : target < cum)) first = j;
  }
  Crossing c;
  c.first = block_min_int(first, sh.i);
  c.last = block_max_int(last, sh.i);
  return c;
}

// Block b of `slices` blocks: its contiguous part [begin, end) of the vocabulary.
__device__ __forceinline__ void slice_of(int64_t V, int slices, int b, int64_t& begin, int64_t& end) {
  const int64_t per = (V + slices - 1) / slices;
  begin = min(V, int64_t(b) * per), end = min(V, begin + per);
}

// Block b's argmax of entry e (bad: a NaN or +inf logit in its slice) into the entry's slots. The
// entry's last block (found by an acq_rel counter; `last` is the block's shared flag) merges every
// slice's, one warp loading them at once, and decides greedy entries (others become
// k_sample_pending with their maximum logit).
__device__ void merge_slices(const SampleArgs& a, int e, int b, const SampleDesc& d, ArgMax m, int bad, bool& last) {
  const int slot = e * k_sample_slices + b;
  if (threadIdx.x == 0) {
    a.slice_max[slot] = m.v, a.slice_arg[slot] = bad ? k_sample_bad : m.i;
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(a.counters + e) : "memory");
    last = prev == unsigned(a.slices) - 1;
    if (last) a.counters[e] = 0;
  }
  __syncthreads();
  if (!last || threadIdx.x >= 32) return;
  ArgMax t{-INFINITY, INT_MAX};
  bool any_bad = false;
  for (int k = threadIdx.x; k < a.slices; k += 32) {
    const int arg = __ldcg(a.slice_arg + e * k_sample_slices + k);
    const float v = __ldcg(a.slice_max + e * k_sample_slices + k);
    if (arg == k_sample_bad) any_bad = true;
    else t = better(t, ArgMax{v, arg});
  }
  any_bad = __any_sync(k_all, any_bad);
  for (int o = 16; o > 0; o >>= 1)
    t = better(t, ArgMax{__shfl_xor_sync(k_all, t.v, o), __shfl_xor_sync(k_all, t.i, o)});
  if (threadIdx.x == 0) {
    if (any_bad) a.out[e] = k_sample_bad;
    else if (t.i == INT_MAX || d.temperature == 0.0f) a.out[e] = t.i == INT_MAX ? k_sample_none : t.i;
    else a.out[e] = k_sample_pending, a.max_logit[e] = t.v, a.n_cand[e] = 0, a.total[e] = 0.0;
  }
}

// Launch 1a, block b of entry e (grid slices × entries): its slice of the vocabulary — masked
// logits into x, the bias and penalties of its tokens, its argmax — then the entry's last block
// merges the slices' argmaxes (lowest id among equal maxima: any order gives the same). A greedy
// entry without bias or penalties takes the argmax of the masked logits as it loads them (x is
// read only by launches 1b and 3, which greedy entries skip).
__global__ void __launch_bounds__(k_threads) sample_scan_kernel(SampleArgs a) {
  __shared__ Shared sh;
  __shared__ bool last;
  const int e = blockIdx.y, b = blockIdx.x;
  const SampleDesc d = a.descs[e];
  const int64_t V = a.vocab;
  const float* logits = a.logits + d.row * V;
  const uint32_t* mask = d.mask_begin >= 0 ? a.mask + d.mask_begin : nullptr;
  float* x = a.x + int64_t(e) * V;
  int64_t begin, end;
  slice_of(V, a.slices, b, begin, end);

  int bad = 0;
  ArgMax m{-INFINITY, INT_MAX};
  const bool direct = d.temperature == 0.0f && d.bias_count == 0 && d.pen_count == 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += k_threads) {
    const float l = logits[i];
    if (isnan(l) || l == INFINITY) bad = 1;
    const float v = allowed(mask, i) ? l : -INFINITY;
    if (direct) m = better(m, ArgMax{v, v > -INFINITY ? int(i) : INT_MAX});
    else x[i] = v;
  }
  bad = __syncthreads_or(bad);
  if (!direct) {
    for (int j = threadIdx.x; j < d.bias_count; j += k_threads) {
      const int t = a.bias_ids[d.bias_begin + j];
      if (t >= begin && t < end && allowed(mask, t)) x[t] = __fadd_rn(x[t], a.bias_vals[d.bias_begin + j]);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < d.pen_count; j += k_threads) {
      const int t = a.pen_ids[d.pen_begin + j];
      if (t < begin || t >= end) continue;
      float l = x[t];
      if (l == -INFINITY) continue;
      if (d.repetition_penalty != 1.0f)
        l = l > 0.0f ? __fdiv_rn(l, d.repetition_penalty) : __fmul_rn(l, d.repetition_penalty);
      const float sub =
          __fadd_rn(__fmul_rn(float(a.pen_counts[d.pen_begin + j]), d.frequency_penalty), d.presence_penalty);
      x[t] = __fsub_rn(l, sub);
    }
    __syncthreads();
    for (int64_t i = begin + threadIdx.x; i < end; i += k_threads)
      m = better(m, ArgMax{x[i], x[i] > -INFINITY ? int(i) : INT_MAX});
  }
  merge_slices(a, e, b, d, block_argmax(m, sh.f, sh.i), bad, last);
}

// A candidate's key bin (k_sample_bins): its key is x's bit pattern (x ≤ 0), or 0x7fffffff for x = 0.
__device__ __forceinline__ int key_bin(uint32_t key) { return min(k_sample_bins - 1, max(0, int(key >> 20) - 0x7ff)); }

// The smallest e = float(exp(double(x))) of bin b's candidates (exp and float rounding are monotone).
__device__ __forceinline__ float bin_least_e(int b) {
  if (b == 0) return 1.0f;
  return float(exp(double(__uint_as_float((uint32_t(b + 0x800) << 20) - 1u))));
}

// Launch 1b (same grid): for entries still pending, every candidate of the slice (post-penalty
// logit > -inf) gets x = (l - max) / T and a rank key; the others x = NaN and the largest key.
// Sorted entries also count their candidates per key bin and add up their e.
__global__ void __launch_bounds__(k_threads) sample_candidates_kernel(SampleArgs a) {
  __shared__ Shared sh;
  __shared__ uint32_t bins[k_sample_bins];
  const int e = blockIdx.y;
  if (a.out[e] != k_sample_pending) return;
  const SampleDesc d = a.descs[e];
  const bool sorted = d.sorted != 0;
  const int64_t V = a.vocab;
  float* x = a.x + int64_t(e) * V;
  uint32_t* keys = a.keys + int64_t(e) * V;
  const float mx = a.max_logit[e];
  int64_t begin, end;
  slice_of(V, a.slices, blockIdx.x, begin, end);
  if (sorted) {
    for (int i = threadIdx.x; i < k_sample_bins; i += k_threads) bins[i] = 0;
    __syncthreads();
  }
  int n = 0;
  double es = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += k_threads) {
    const float l = x[i];
    if (l == -INFINITY) {
      x[i] = NAN;
      keys[i] = k_not_candidate;
    } else {
      const float xc = __fdiv_rn(__fsub_rn(l, mx), d.temperature);
      const uint32_t key = rank_key(xc);
      x[i] = xc;
      keys[i] = key;
      ++n;
      if (sorted) {
        atomicAdd(&bins[key_bin(key)], 1u);
        es += double(float(exp(double(xc))));
      }
    }
  }
  n = int(block_sum(double(n), sh.d));
  if (threadIdx.x == 0 && n > 0) atomicAdd(a.n_cand + e, n);
  if (!sorted) return;
  es = block_sum(es, sh.d);
  if (threadIdx.x == 0 && n > 0) atomicAdd(a.total + e, es);
  uint32_t* out = a.bins + int64_t(e) * k_sample_bins;
  for (int i = threadIdx.x; i < k_sample_bins; i += k_threads)
    if (bins[i]) atomicAdd(out + i, bins[i]);
}

// Launch 2a (one block per entry): a sorted pending entry's head — every candidate in the first
// key bins that hold top_k candidates (top_k cutting), else in those whose mass at each bin's
// least e reaches top_p · Σe · (1 + 1e-4) (else all bins) — as select_below and n_head, and the
// end of its segment; the bins are zeroed for the next call. Others' segments are empty.
__global__ void __launch_bounds__(k_threads) sample_select_kernel(SampleArgs a) {
  __shared__ Shared sh;
  const int e = blockIdx.x;
  const SampleDesc d = a.descs[e];
  if (!d.sorted) return;
  const int64_t base = int64_t(e) * a.vocab;
  if (a.out[e] != k_sample_pending) {
    if (threadIdx.x == 0) a.n_head[e] = 0, a.segment_end[d.segment] = base;
    return;
  }
  uint32_t* bins = a.bins + int64_t(e) * k_sample_bins;
  const int b0 = 2 * int(threadIdx.x), b1 = b0 + 1;
  const uint32_t c0 = b0 < k_sample_bins ? bins[b0] : 0u, c1 = b1 < k_sample_bins ? bins[b1] : 0u;
  if (b0 < k_sample_bins) bins[b0] = 0u;
  if (b1 < k_sample_bins) bins[b1] = 0u;
  const int n_cand = a.n_cand[e];
  const bool top_k_cuts = d.top_k > 0 && d.top_k < n_cand;
  const bool top_p_on = d.top_p > 0.0f && d.top_p < 1.0f;
  const double m0 = c0 ? double(c0) * double(bin_least_e(b0)) : 0.0;
  const double m1 = c1 ? double(c1) * double(bin_least_e(b1)) : 0.0;
  const double count_before = block_exclusive_scan(double(c0) + double(c1), sh.d);
  const double mass_before = block_exclusive_scan(m0 + m1, sh.d);
  const double target = double(d.top_p) * a.total[e] * (1.0 + 1e-4);
  const auto enough = [&](double count, double mass) {
    return top_k_cuts ? count >= double(d.top_k) : mass >= target;
  };
  int cut = INT_MAX;
  if (top_k_cuts || top_p_on) {
    if (c0 && enough(count_before + c0, mass_before + m0)) cut = b0;
    else if (c1 && enough(count_before + c0 + c1, mass_before + m0 + m1)) cut = b1;
  }
  cut = block_min_int(cut, sh.i);
  // The head's size: the candidates of bins up to the cut (every candidate without one; none when
  // neither top_k nor top_p sorts — launch 4 then walks ids).
  double upto = 0.0;
  if (cut != INT_MAX) upto = (b0 <= cut ? double(c0) : 0.0) + (b1 <= cut ? double(c1) : 0.0);
  upto = block_sum(upto, sh.d);
  if (threadIdx.x == 0) {
    const int n = !(top_k_cuts || top_p_on) ? 0 : cut == INT_MAX ? n_cand : int(upto);
    a.select_below[e] = cut == INT_MAX ? k_not_candidate : uint32_t(cut + 0x800) << 20;
    a.n_head[e] = n;
    a.segment_end[d.segment] = base + n;
  }
}

// Launches 2b and 2c (grid as launch 1's): block b counts its slice's head candidates (2b), then
// writes them — keys and ids, in id order — after those of the blocks before it (2c).
template <bool WRITE>
__global__ void __launch_bounds__(k_threads) sample_head_kernel(SampleArgs a) {
  __shared__ Shared sh;
  __shared__ int warp_counts[k_warps];
  const int e = blockIdx.y, b = blockIdx.x;
  const SampleDesc d = a.descs[e];
  if (!d.sorted || a.out[e] != k_sample_pending || a.n_head[e] == 0) return;
  const int64_t V = a.vocab;
  const uint32_t below = a.select_below[e];
  const uint32_t* keys = a.keys + int64_t(e) * V;
  int64_t begin, end;
  slice_of(V, a.slices, b, begin, end);
  if (!WRITE) {
    int n = 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += k_threads) n += keys[i] < below;
    n = int(block_sum(double(n), sh.d));
    if (threadIdx.x == 0) a.slice_head[e * k_sample_slices + b] = n;
    return;
  }
  int at = 0;
  for (int k = 0; k < b; ++k) at += a.slice_head[e * k_sample_slices + k];
  uint32_t* head_keys = a.head_keys + int64_t(e) * V;
  int32_t* head_ids = a.head_ids + int64_t(e) * V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t i0 = begin; i0 < end; i0 += k_threads) {
    const int64_t i = i0 + threadIdx.x;
    const uint32_t key = i < end ? keys[i] : k_not_candidate;
    const bool in = i < end && key < below;
    const unsigned ballot = __ballot_sync(k_all, in);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < k_warps; ++w) {
      const int c = warp_counts[w];
      before += w < warp ? c : 0;
      all += c;
    }
    if (in) {
      const int j = at + before + __popc(ballot & ((1u << lane) - 1u));
      head_keys[j] = key, head_ids[j] = int32_t(i);
    }
    at += all;
    __syncthreads();
  }
  if (a.pad_heads)
    for (int64_t j = a.n_head[e] + int64_t(b) * k_threads + threadIdx.x; j < V; j += int64_t(a.slices) * k_threads)
      head_keys[j] = k_not_candidate;
}

__global__ void __launch_bounds__(k_threads) sample_finish_kernel(SampleArgs a) {
  __shared__ Shared sh;
  const int e = blockIdx.x;
  if (a.out[e] != k_sample_pending) return;
  const SampleDesc d = a.descs[e];
  const int V = int(a.vocab);
  const int n_cand = a.n_cand[e];
  const bool top_k_cuts = d.top_k > 0 && d.top_k < n_cand;
  const bool top_p_on = d.top_p > 0.0f && d.top_p < 1.0f;
  const bool by_rank = d.sorted && (top_k_cuts || top_p_on);
  const int32_t* order = by_rank ? a.order + int64_t(e) * V : nullptr;
  const float* x = a.x + int64_t(e) * V;
  float* w = a.w + int64_t(e) * V;
  // Sorted in rank order: the head (launch 2), which holds the first top_k, or the top_p cut.
  int n = by_rank ? (top_k_cuts ? d.top_k : a.n_head[e]) : V;

  double s = 0;
  for (int j = threadIdx.x; j < n; j += k_threads) {
    const float xc = x[order ? order[j] : j];
    const float p = isnan(xc) ? 0.0f : float(exp(double(xc)));
    w[j] = p;
    s += p;
  }
  const double head_sum = block_sum(s, sh.d);
  const double sum = by_rank && !top_k_cuts ? a.total[e] : head_sum;
  for (int j = threadIdx.x; j < n; j += k_threads) w[j] = float(double(w[j]) / sum);
  __syncthreads();

  if (top_p_on) {
    const Crossing c = find_crossing(w, n, double(d.top_p), true, sh);
    if (c.first != INT_MAX) {
      n = c.first + 1;
      renormalize(w, n, sh);
    }
  }
  if (d.min_p > 0.0f) {
    float pm = 0.0f;
    for (int j = threadIdx.x; j < n; j += k_threads) pm = fmaxf(pm, w[j]);
    const float threshold = __fmul_rn(d.min_p, block_max(pm, sh.f));
    for (int j = threadIdx.x; j < n; j += k_threads)
      if (w[j] < threshold) w[j] = 0.0f;
    __syncthreads();
    renormalize(w, n, sh);
  }
  const double total = block_total(w, n, sh);
  const Crossing c = find_crossing(w, n, d.u * total, false, sh);
  if (threadIdx.x == 0) {
    const int j = c.first != INT_MAX ? c.first : c.last;
    a.out[e] = j < 0 ? k_sample_none : (order ? order[j] : j);
  }
}

}  // namespace

cudaError_t sample_prepare(const SampleArgs& a, bool greedy_only, cudaStream_t stream) {
  if (a.n_entries <= 0) return cudaSuccess;
  if (a.slices < 1 || a.slices > k_sample_slices) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.slices), unsigned(a.n_entries));
  sample_scan_kernel<<<grid, k_threads, 0, stream>>>(a);
  if (!greedy_only) sample_candidates_kernel<<<grid, k_threads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t sample_finish(const SampleArgs& a, cudaStream_t stream) {
  if (a.n_entries <= 0) return cudaSuccess;
  sample_finish_kernel<<<unsigned(a.n_entries), k_threads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t sample_select(const SampleArgs& a, cudaStream_t stream) {
  if (a.n_entries <= 0) return cudaSuccess;
  if (a.slices < 1 || a.slices > k_sample_slices) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.slices), unsigned(a.n_entries));
  sample_select_kernel<<<unsigned(a.n_entries), k_threads, 0, stream>>>(a);
  sample_head_kernel<false><<<grid, k_threads, 0, stream>>>(a);
  sample_head_kernel<true><<<grid, k_threads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t sort_rank_keys(void* temp, size_t& temp_bytes, const uint32_t* keys, uint32_t* keys_out,
                           const int32_t* ids, int32_t* order, int n, cudaStream_t stream) {
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_out, ids, order, n, 0, 32, stream);
}

cudaError_t sort_rank_keys_segmented(void* temp, size_t& temp_bytes, const uint32_t* keys, uint32_t* keys_out,
                                     const int32_t* ids, int32_t* order, int64_t n_items, int n_segments,
                                     const int64_t* begin, const int64_t* end, cudaStream_t stream) {
  return cub::DeviceSegmentedSort::StableSortPairs(temp, temp_bytes, keys, keys_out, ids, order, n_items, n_segments,
                                                   begin, end, stream);
}

}  // namespace exl::cuda
