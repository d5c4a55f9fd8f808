// CPU linear layers for every weight format. Quantized weights are decoded on the fly, once per
// block of up to k_tok_chunk tokens, into a small per-thread tile, then multiplied in fp32.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/fp16_table.h"
#include "kernels/cpu/ops.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace exl::cpu {

namespace {

constexpr int64_t k_cols = 16;       // output columns per task (one 64-byte line of q_weight words)
constexpr int64_t k_tok_chunk = 32;  // tokens sharing one decoded tile

inline float dot(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

void finish(const std::vector<float>& bias, float* y, int64_t rows, int64_t N) {
  if (bias.empty()) return;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t n = 0; n < N; ++n) y[t * N + n] += bias[n];
}

// Decodes `count` b-bit values of one column's little-endian bitstream; words are `stride` apart.
inline void decode_stream(const uint32_t* words, int64_t stride, int bits, int count, int* out) {
  uint64_t buf = 0;
  int have = 0;
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  for (int i = 0; i < count; ++i) {
    if (have < bits) {
      buf |= uint64_t(*words) << have;
      words += stride;
      have += 32;
    }
    out[i] = int(buf & mask);
    buf >>= bits;
    have -= bits;
  }
}

}  // namespace

void linear_exl2(ThreadPool& tp, const Exl2Matrix& w, const float* x, float* y, int64_t rows) {
  const int64_t K = w.in_features, N = w.out_features, Np = w.padded_out, G = int64_t(w.groups.size());
  std::vector<float> xp(size_t(rows * K));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < K; ++j) xp[t * K + j] = x[t * K + w.perm[j]];
  const float* f16 = fp16_table();
  const int64_t n_tasks = (N + k_cols - 1) / k_cols;
  tp.parallel_for(n_tasks, 1, [&](int64_t b0, int64_t b1) {
    float tile[k_cols * 32];
    float acc[k_tok_chunk * k_cols];
    float scale[k_cols];
    int q[32];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n0 = blk * k_cols, nc = std::min(k_cols, N - n0);
      for (int64_t t0 = 0; t0 < rows; t0 += k_tok_chunk) {
        const int64_t tc = std::min(k_tok_chunk, rows - t0);
        std::fill(acc, acc + tc * k_cols, 0.0f);
        for (int64_t g = 0; g < G; ++g) {
          const Exl2Group& gr = w.groups[g];
          const float smax = f16[w.q_scale_max[g]] / 256.0f;
          for (int64_t c = 0; c < nc; ++c) {
            const int64_t n = n0 + c;
            const uint32_t s4 = (w.q_scale[g * (Np / 8) + n / 8] >> (4 * (n % 8))) & 15u;
            scale[c] = float((s4 + 1) * (s4 + 1)) * smax;
          }
          const int zero = 1 << (gr.bits - 1);
          for (int64_t r0 = 0; r0 < gr.rows; r0 += 32) {
            const int nr = int(std::min<int64_t>(32, gr.rows - r0));
            const int64_t qrow = gr.qrow_start + r0 * gr.bits / 32;
            for (int64_t c = 0; c < nc; ++c) {
              decode_stream(w.q_weight + qrow * Np + n0 + c, Np, gr.bits, nr, q);
              for (int i = 0; i < nr; ++i) tile[c * 32 + i] = float(q[i] - zero) * scale[c];
            }
            for (int64_t t = 0; t < tc; ++t) {
              const float* xr = xp.data() + (t0 + t) * K + gr.row_start + r0;
              for (int64_t c = 0; c < nc; ++c) acc[t * k_cols + c] += dot(tile + c * 32, xr, nr);
            }
          }
        }
        for (int64_t t = 0; t < tc; ++t)
          for (int64_t c = 0; c < nc; ++c) y[(t0 + t) * N + n0 + c] = acc[t * k_cols + c];
      }
    }
  });
  finish(w.bias, y, rows, N);
}

void linear_gptq(ThreadPool& tp, const GptqMatrix& w, const float* x, float* y, int64_t rows) {
  const int64_t K = w.in_features, N = w.out_features;
  const float* f16 = fp16_table();
  const int zero_add = w.zeros_v2 ? 0 : 1;
  const int64_t n_tasks = (N + k_cols - 1) / k_cols;
  tp.parallel_for(n_tasks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> tile(size_t(k_cols * K));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n0 = blk * k_cols, nc = std::min(k_cols, N - n0);
      for (int64_t c = 0; c < nc; ++c) {
        const int64_t n = n0 + c;
        float* wr = tile.data() + c * K;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t g = w.g_idx[k];
          const int qv = int((w.qweight[(k / 8) * N + n] >> (4 * (k % 8))) & 15u);
          const int z = int((w.qzeros[g * (N / 8) + n / 8] >> (4 * (n % 8))) & 15u) + zero_add;
          wr[k] = float(qv - z) * f16[w.scales[g * N + n]];
        }
      }
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t c = 0; c < nc; ++c) y[t * N + n0 + c] = dot(tile.data() + c * K, x + t * K, K);
    }
  });
  finish(w.bias, y, rows, N);
}

void linear_dense(ThreadPool& tp, const DenseMatrix& w, const float* x, float* y, int64_t rows) {
  const int64_t K = w.in_features, N = w.out_features;
  const float* f16 = fp16_table();
  tp.parallel_for(N, 4, [&](int64_t n_begin, int64_t n_end) {
    std::vector<float> row(size_t(w.dtype == DType::f32 ? 0 : K));
    for (int64_t n = n_begin; n < n_end; ++n) {
      const float* wr;
      if (w.dtype == DType::f32) {
        wr = static_cast<const float*>(w.data) + n * K;
      } else {
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + n * K;
        if (w.dtype == DType::f16)
          for (int64_t k = 0; k < K; ++k) row[k] = f16[src[k]];
        else
          for (int64_t k = 0; k < K; ++k) row[k] = bf16_to_float(src[k]);
        wr = row.data();
      }
      for (int64_t t = 0; t < rows; ++t) y[t * N + n] = dot(wr, x + t * K, K);
    }
  });
  finish(w.bias, y, rows, N);
}

void linear(ThreadPool& tp, const LinearWeights& w, const float* x, float* y, int64_t rows) {
  if (const auto* e = std::get_if<Exl2Matrix>(&w)) return linear_exl2(tp, *e, x, y, rows);
  if (const auto* g = std::get_if<GptqMatrix>(&w)) return linear_gptq(tp, *g, x, y, rows);
  return linear_dense(tp, std::get<DenseMatrix>(w), x, y, rows);
}

}  // namespace exl::cpu
