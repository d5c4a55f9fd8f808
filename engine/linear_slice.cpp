#include "engine/linear_slice.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>

#include "kernels/cpu/thread_pool.h"
#include "kernels/error.h"

namespace exl {

namespace {

uint32_t scale_nibble(const uint32_t* row, int64_t col) { return (row[col / 8] >> (4 * (col % 8))) & 15u; }

// fn(begin, end) over [0, n) on up to 8 threads (a ThreadPool's, the caller's among them) where
// `work` (items touched) is large, else on the caller alone.
void parallel_ranges(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int threads = int(std::min({hw, int64_t(8), n, std::max<int64_t>(1, work >> 20)}));
  if (threads == 1) return fn(0, n);
  ThreadPool pool(threads);
  pool.parallel_for(n, (n + threads - 1) / threads, fn);
}

}  // namespace

LinearSlice slice_linear_columns(const LinearWeights& w, std::span<const int32_t> cols) {
  const int64_t n = int64_t(cols.size()), N = out_features(w), K = in_features(w);
  EXL_CHECK(n > 0, "engine: linear slice: a column slice of no columns");
  for (int32_t c : cols)
    EXL_CHECK(c >= 0 && c < N, "engine: linear slice: column ", c, " outside [0, ", N, ")");
  LinearSlice s;
  auto slice_bias = [&](const std::vector<float>& bias) {
    std::vector<float> b;
    if (!bias.empty())
      for (int32_t c : cols) b.push_back(bias[size_t(c)]);
    return b;
  };
  if (const auto* e = std::get_if<Exl2Matrix>(&w)) {
    Exl2Matrix m = *e;
    m.out_features = n;
    m.padded_out = (n + 31) / 32 * 32;
    const int64_t G = int64_t(e->groups.size());
    const int64_t Np = m.padded_out;
    s.words.reset(new uint32_t[size_t(e->q_rows * Np)]);  // every word written below, padding included
    uint32_t* const words = s.words.get();
    parallel_ranges(e->q_rows, e->q_rows * Np, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const uint32_t* const from = e->q_weight + q * e->padded_out;
        uint32_t* const to = words + q * Np;
        for (int64_t i = 0; i < n; ++i) to[i] = from[cols[size_t(i)]];
        std::fill(to + n, to + Np, 0u);
      }
    });
    s.scale_words.reset(new uint32_t[size_t(G * Np / 8)]());
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < n; ++i)
        s.scale_words[size_t(g * Np / 8 + i / 8)] |= scale_nibble(e->q_scale + g * e->padded_out / 8, cols[size_t(i)])
                                                     << (4 * (i % 8));
    m.q_weight = s.words.get();
    m.q_scale = s.scale_words.get();
    m.bias = slice_bias(e->bias);
    s.weights = std::move(m);
    return s;
  }
  const auto* d = std::get_if<DenseMatrix>(&w);
  EXL_CHECK(d != nullptr, "engine: linear slice: GPTQ weights are not sliced (EXL2 and dense weights are)");
  const size_t row_bytes = size_t(K) * dtype_size(d->dtype);
  s.bytes.reset(new uint8_t[size_t(n) * row_bytes]);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(s.bytes.get() + size_t(i) * row_bytes, static_cast<const uint8_t*>(d->data) + size_t(cols[size_t(i)]) * row_bytes,
                row_bytes);
  DenseMatrix m = *d;
  m.out_features = n;
  m.data = s.bytes.get();
  m.bias = slice_bias(d->bias);
  s.weights = std::move(m);
  return s;
}

LinearSlice slice_linear_rows(const LinearWeights& w, int64_t b, int64_t e, bool keep_bias) {
  const int64_t K = in_features(w), N = out_features(w);
  EXL_CHECK(0 <= b && b < e && e <= K, "engine: linear slice: rows [", b, ", ", e, ") outside [0, ", K, ")");
  LinearSlice s;
  if (const auto* x = std::get_if<Exl2Matrix>(&w)) {
    size_t g0 = 0, g1 = 0;
    while (g0 < x->groups.size() && x->groups[g0].row_start < b) ++g0;
    g1 = g0;
    while (g1 < x->groups.size() && x->groups[g1].row_start < e) ++g1;
    EXL_CHECK(g0 < x->groups.size() && x->groups[g0].row_start == b &&
                  (g1 == x->groups.size() ? e == K : x->groups[g1].row_start == e),
              "engine: linear slice: rows [", b, ", ", e, ") do not start and end at EXL2 group boundaries");
    Exl2Matrix m = *x;
    const int64_t q0 = x->groups[g0].qrow_start, q1 = g1 == x->groups.size() ? x->q_rows : x->groups[g1].qrow_start;
    m.in_features = e - b;
    m.q_rows = q1 - q0;
    m.q_weight = x->q_weight + q0 * x->padded_out;
    m.q_scale = x->q_scale + int64_t(g0) * x->padded_out / 8;
    m.q_scale_max = x->q_scale_max + g0;
    m.groups.assign(x->groups.begin() + int64_t(g0), x->groups.begin() + int64_t(g1));
    for (Exl2Group& g : m.groups) g.row_start -= b, g.qrow_start -= q0;
    m.perm.resize(size_t(e - b));
    for (int64_t i = 0; i < e - b; ++i) m.perm[size_t(i)] = int32_t(i);
    if (!keep_bias) m.bias.clear();
    s.weights = std::move(m);
    return s;
  }
  const auto* d = std::get_if<DenseMatrix>(&w);
  EXL_CHECK(d != nullptr, "engine: linear slice: GPTQ weights are not sliced (EXL2 and dense weights are)");
  const size_t es = dtype_size(d->dtype), row_bytes = size_t(e - b) * es;
  s.bytes.reset(new uint8_t[size_t(N) * row_bytes]);
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(s.bytes.get() + size_t(n) * row_bytes,
                static_cast<const uint8_t*>(d->data) + (size_t(n) * size_t(K) + size_t(b)) * es, row_bytes);
  DenseMatrix m = *d;
  m.in_features = e - b;
  m.data = s.bytes.get();
  if (!keep_bias) m.bias.clear();
  s.weights = std::move(m);
  return s;
}

}  // namespace exl
