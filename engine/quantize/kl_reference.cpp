#include "engine/quantize/kl_reference.h"

#include <algorithm>
#include <cmath>

#include "engine/quantize/calib_model.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/error.h"

namespace exl {

KlReference kl_reference(const CalibModel& cm, std::span<const float> x_ref, int64_t row_tokens, ThreadPool& pool) {
  const int64_t H = cm.config().hidden_size, V = cm.config().vocab_size, T = int64_t(x_ref.size()) / H;
  KlReference r{{}, std::vector<double>(size_t(T)), row_tokens};
  r.logits.reserve(size_t(T * V));
  for (int64_t t0 = 0; t0 < T; t0 += row_tokens) {
    const int64_t n = std::min(row_tokens, T - t0);
    const auto p = cm.logits(x_ref.subspan(size_t(t0 * H), size_t(n * H)));
    r.logits.insert(r.logits.end(), p.begin(), p.end());
  }
  pool.parallel_for(T, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* a = r.logits.data() + t * V;
      double ma = -INFINITY, sa = 0;
      for (int64_t v = 0; v < V; ++v) ma = std::max(ma, double(a[v]));
      for (int64_t v = 0; v < V; ++v) sa += std::exp(double(a[v]) - ma);
      r.lse[size_t(t)] = ma + std::log(sa);
    }
  });
  return r;
}

double mean_kl(const CalibModel& cm, const KlReference& ref, std::span<const float> x, ThreadPool& pool) {
  const int64_t H = cm.config().hidden_size, V = cm.config().vocab_size, T = int64_t(x.size()) / H;
  EXL_CHECK(int64_t(ref.lse.size()) == T, "engine: quantize: KL of ", T, " tokens against a reference of ",
            ref.lse.size());
  std::vector<double> kls(static_cast<size_t>(T));
  for (int64_t t0 = 0; t0 < T; t0 += ref.row_tokens) {
    const int64_t n = std::min(ref.row_tokens, T - t0);
    const auto q = cm.logits(x.subspan(size_t(t0 * H), size_t(n * H)));
    pool.parallel_for(n, 4, [&](int64_t b_, int64_t e_) {
      for (int64_t t = b_; t < e_; ++t) {
        const float* a = ref.logits.data() + (t0 + t) * V;
        const float* b = q.data() + t * V;
        double mb = -INFINITY, sb = 0, kl = 0;
        for (int64_t v = 0; v < V; ++v) mb = std::max(mb, double(b[v]));
        for (int64_t v = 0; v < V; ++v) sb += std::exp(double(b[v]) - mb);
        const double la = ref.lse[size_t(t0 + t)], lb = mb + std::log(sb);
        for (int64_t v = 0; v < V; ++v) kl += std::exp(double(a[v]) - la) * ((double(a[v]) - la) - (double(b[v]) - lb));
        kls[size_t(t0 + t)] = kl;
      }
    });
  }
  double total = 0;
  for (double k : kls) total += k;
  return total / double(T);
}

}  // namespace exl
