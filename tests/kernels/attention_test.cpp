// Paged causal attention on the CPU against a dense double-precision reference: GQA, several
// sequences with scattered page tables, sliding windows, and every cache format.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "random_weights.h"

namespace exl {
namespace attention_test {

struct SeqData {
  int64_t n_past, n_new;
  std::vector<int32_t> pages;
  std::vector<float> k, v;  // [n_past + n_new, kvh*D]
};

std::vector<double> reference(const SeqData& s, const std::vector<float>& q, int64_t q_row0, int NH, int KVH, int D,
                              float scale, int window) {
  std::vector<double> out(size_t(s.n_new * NH * D));
  for (int64_t t = 0; t < s.n_new; ++t) {
    const int64_t pos = s.n_past + t;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    for (int h = 0; h < NH; ++h) {
      const int kh = h / (NH / KVH);
      const float* qv = q.data() + ((q_row0 + t) * NH + h) * D;
      std::vector<double> w;
      double mx = -1e300;
      for (int64_t p = lo; p <= pos; ++p) {
        double d = 0;
        for (int i = 0; i < D; ++i) d += double(qv[i]) * s.k[size_t((p * KVH + kh) * D + i)];
        w.push_back(d * scale);
        mx = std::max(mx, w.back());
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int i = 0; i < D; ++i) {
        double acc = 0;
        for (int64_t p = lo; p <= pos; ++p) acc += w[size_t(p - lo)] / sum * s.v[size_t((p * KVH + kh) * D + i)];
        out[size_t((t * NH + h) * D + i)] = acc;
      }
    }
  }
  return out;
}

void run_case(KvFormat fmt, int D, int NH, int KVH, int window, double tol) {
  ThreadPool tp(2);
  KvLayout L{2, KVH, D, 16, fmt};
  const int layer = 1;
  std::vector<SeqData> seqs = {{0, 21, {}, {}, {}}, {37, 1, {}, {}, {}}, {5, 40, {}, {}, {}}};
  int next_page = 0;
  std::vector<int32_t> all_pages(40);
  std::iota(all_pages.begin(), all_pages.end(), 0);
  std::reverse(all_pages.begin(), all_pages.end());
  uint32_t seed = 11;
  for (auto& s : seqs) {
    const int64_t total = s.n_past + s.n_new;
    for (int64_t p = 0; p < (total + 15) / 16; ++p) s.pages.push_back(all_pages[size_t(next_page++)]);
    s.k = test::random_floats(size_t(total * KVH * D), seed++);
    s.v = test::random_floats(size_t(total * KVH * D), seed++);
  }
  std::vector<std::byte> pool(L.page_bytes() * 40);
  for (auto& s : seqs) {  // write past and new K/V
    std::vector<int32_t> slots;
    for (int64_t p = 0; p < s.n_past + s.n_new; ++p) slots.push_back(s.pages[size_t(p / 16)] * 16 + int32_t(p % 16));
    cpu::kv_write(L, pool.data(), layer, s.k.data(), s.v.data(), slots);
  }
  std::vector<SeqAttn> batch;
  int64_t rows = 0;
  for (auto& s : seqs) {
    batch.push_back({rows, s.n_new, s.n_past, s.pages});
    rows += s.n_new;
  }
  auto q = test::random_floats(size_t(rows * NH * D), 99);
  std::vector<float> out(size_t(rows * NH * D));
  const float scale = 1.0f / std::sqrt(float(D));
  cpu::attention(tp, L, pool.data(), layer, q.data(), out.data(), batch, NH, scale, window);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto ref = reference(seqs[i], q, batch[i].token_begin, NH, KVH, D, scale, window);
    double err = 0;
    for (size_t j = 0; j < ref.size(); ++j)
      err = std::max(err, std::fabs(ref[j] - out[size_t(batch[i].token_begin * NH * D) + j]));
    EXPECT_LT(err, tol) << to_string(fmt) << " D=" << D << " seq " << i << " window " << window;
  }
}

TEST(CpuAttention, MatchesDenseReference) {
  // Bounds: f32 exact up to fp32 rounding; fp16 relative rounding 2^-11 on unit-variance K/V;
  // q8 steps of max|x|/127 (≈ 3.5/127/2 per element), q4 steps of max|x|/7.
  for (int window : {0, 9}) {
    run_case(KvFormat::f32, 64, 6, 2, window, 1e-5);
    run_case(KvFormat::fp16, 64, 6, 2, window, 5e-3);
    run_case(KvFormat::q8, 64, 4, 4, window, 0.1);
    run_case(KvFormat::q4, 64, 4, 1, window, 0.8);
    run_case(KvFormat::f32, 8, 8, 4, window, 1e-5);
    run_case(KvFormat::q8, 8, 8, 4, window, 0.1);
  }
}

TEST(CpuKv, EncodeDecodeErrorWithinFormatBound) {
  for (KvFormat fmt : {KvFormat::f32, KvFormat::fp16, KvFormat::q8, KvFormat::q4}) {
    for (int D : {8, 64, 128}) {
      KvLayout L{1, 1, D, 16, fmt};
      auto x = test::random_floats(size_t(D), uint32_t(D) + uint32_t(fmt));
      std::vector<std::byte> data(L.vec_bytes());
      std::vector<uint16_t> scales(size_t(L.blocks_per_vec()));
      std::vector<float> y(static_cast<size_t>(D));
      cpu::kv_encode(L, x.data(), data.data(), scales.data());
      cpu::kv_decode(L, data.data(), scales.data(), y.data());
      for (int b = 0; b < D / L.block(); ++b) {
        float amax = 0;
        for (int i = 0; i < L.block(); ++i) amax = std::max(amax, std::fabs(x[size_t(b * L.block() + i)]));
        for (int i = 0; i < L.block(); ++i) {
          const size_t d = size_t(b * L.block() + i);
          double bound = fmt == KvFormat::f32    ? 0
                         : fmt == KvFormat::fp16 ? std::fabs(x[d]) * 0x1p-11
                         : fmt == KvFormat::q8   ? amax / 127.0 * 0.5 * 1.002
                                                 : amax / 7.0 * 0.5 * 1.002;
          EXPECT_LE(std::fabs(double(y[d]) - x[d]), bound + 1e-7) << to_string(fmt) << " D=" << D << " d=" << d;
        }
      }
    }
  }
}

}  // namespace attention_test
}  // namespace exl
