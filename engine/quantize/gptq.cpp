#include "engine/quantize/gptq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/quantize/quantize_linear.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/error.h"

namespace exl {

namespace gptq_impl {

void for_range(ThreadPool* pool, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool && n > grain) pool->parallel_for(n, grain, fn);
  else fn(0, n);
}

// In place: the lower Cholesky factor of the SPD matrix a [n, n]; false when it is not (numerically)
// positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t n, ThreadPool* pool) {
  for (int64_t j = 0; j < n; ++j) {
    double* rj = a.data() + j * n;
    double d = rj[j];
    for (int64_t k = 0; k < j; ++k) d -= rj[k] * rj[k];
    if (!(d > 0) || !std::isfinite(d)) return false;
    d = std::sqrt(d);
    rj[j] = d;
    for_range(pool, n - j - 1, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = j + 1 + b; i < j + 1 + e; ++i) {
        double* ri = a.data() + i * n;
        double s = ri[j];
        for (int64_t k = 0; k < j; ++k) s -= ri[k] * rj[k];
        ri[j] = s / d;
      }
    });
  }
  for (int64_t i = 0; i < n; ++i) std::fill(a.begin() + i * n + i + 1, a.begin() + (i + 1) * n, 0.0);
  return true;
}

// m = l⁻¹ for lower-triangular l [n, n], column by column (forward substitution).
std::vector<double> invert_lower(const std::vector<double>& l, int64_t n, ThreadPool* pool) {
  std::vector<double> m(size_t(n * n), 0.0);
  for_range(pool, n, 8, [&](int64_t b, int64_t e) {
    std::vector<double> x(static_cast<size_t>(n));
    for (int64_t j = b; j < e; ++j) {
      std::fill(x.begin(), x.end(), 0.0);
      for (int64_t i = j; i < n; ++i) {
        const double* li = l.data() + i * n;
        double s = i == j ? 1.0 : 0.0;
        for (int64_t k = j; k < i; ++k) s -= li[k] * x[size_t(k)];
        x[size_t(i)] = s / li[i];
      }
      for (int64_t i = j; i < n; ++i) m[size_t(i * n + j)] = x[size_t(i)];
    }
  });
  return m;
}

}  // namespace gptq_impl

Hessian make_hessian(int64_t dim) {
  EXL_CHECK(dim > 0, "engine: quantize: gptq: Hessian of dimension ", dim);
  return {dim, 0, std::vector<double>(size_t(dim * dim), 0.0)};
}

void accumulate_hessian(Hessian& h, const float* x, int64_t rows, ThreadPool* pool) {
  const int64_t K = h.dim;
  constexpr int64_t kChunk = 128;  // rows summed in float before the double accumulation
  for (int64_t t0 = 0; t0 < rows; t0 += kChunk) {
    const int64_t t1 = std::min(rows, t0 + kChunk);
    gptq_impl::for_range(pool, K, 8, [&](int64_t b, int64_t e) {
      std::vector<float> acc(static_cast<size_t>(K));
      for (int64_t i = b; i < e; ++i) {
        std::fill(acc.begin() + i, acc.end(), 0.0f);
        for (int64_t t = t0; t < t1; ++t) {
          const float* xt = x + t * K;
          const float a = xt[i];
          if (a == 0.0f) continue;
          for (int64_t j = i; j < K; ++j) acc[size_t(j)] += a * xt[j];
        }
        double* hi = h.h.data() + i * K;
        for (int64_t j = i; j < K; ++j) hi[j] += 2.0 * double(acc[size_t(j)]);
      }
    });
  }
  h.rows += rows;
}

GptqOrder gptq_order(std::span<const double> diag, double damp_fraction) {
  const int64_t K = int64_t(diag.size());
  GptqOrder o;
  o.dead.assign(size_t(K), 0);
  double mean = 0;
  for (int64_t i = 0; i < K; ++i) {
    if (!(diag[size_t(i)] > 0)) o.dead[size_t(i)] = 1;
    else mean += diag[size_t(i)];
  }
  mean /= double(K);
  if (!(mean > 0)) mean = 1.0;
  o.perm.resize(size_t(K));
  std::iota(o.perm.begin(), o.perm.end(), 0);
  std::stable_sort(o.perm.begin(), o.perm.end(), [&](int32_t a, int32_t b) { return diag[size_t(a)] > diag[size_t(b)]; });
  o.damp = std::max(damp_fraction * mean, 1e-10);
  return o;
}

GptqPlan plan_gptq(const Hessian& hs, double damp_fraction, ThreadPool* pool) {
  const int64_t K = hs.dim;
  EXL_CHECK(K > 0 && hs.rows > 0, "engine: quantize: gptq: no calibration rows reached this linear");
  auto at = [&](int64_t i, int64_t j) { return i <= j ? hs.h[size_t(i * K + j)] : hs.h[size_t(j * K + i)]; };
  std::vector<double> diag(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) diag[size_t(i)] = at(i, i);
  GptqOrder order = gptq_order(diag, damp_fraction);
  GptqPlan p;
  p.dim = K;
  p.perm = std::move(order.perm);
  p.dead = std::move(order.dead);

  // The upper Cholesky factor of (H + λI)⁻¹ in permuted order from one Cholesky and one triangular
  // inverse: with R the index reversal, chol_lower(R·H·R) = R·U⁻¹·R, so U = R·(that)⁻¹·R.
  double damp = order.damp;
  for (int attempt = 0; attempt < 10; ++attempt, damp *= 2) {
    std::vector<double> a(size_t(K * K));
    for (int64_t i = 0; i < K; ++i) {
      const int32_t pi = p.perm[size_t(K - 1 - i)];
      for (int64_t j = 0; j < K; ++j) {
        const int32_t pj = p.perm[size_t(K - 1 - j)];
        a[size_t(i * K + j)] = p.dead[size_t(pi)] || p.dead[size_t(pj)] ? 0.0 : at(pi, pj);
      }
      a[size_t(i * K + i)] = (p.dead[size_t(pi)] ? 1.0 : a[size_t(i * K + i)]) + damp;
    }
    if (!gptq_impl::cholesky_lower(a, K, pool)) continue;
    const std::vector<double> m = gptq_impl::invert_lower(a, K, pool);
    p.u.assign(size_t(K * K), 0.0f);
    bool finite = true;
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = i; j < K; ++j) {
        const double v = m[size_t((K - 1 - i) * K + (K - 1 - j))];
        finite = finite && std::isfinite(v);
        p.u[size_t(i * K + j)] = float(v);
      }
    if (!finite) continue;
    p.damp = damp;
    return p;
  }
  fail("engine: quantize: gptq: the Hessian of dimension ", K, " stays singular after damping up to ", damp,
       " (calibration inputs all zero or not finite?)");
}

Exl2Tensors gptq_quantize(std::span<const float> w, int64_t N, int64_t K, const GptqPlan& plan,
                          std::span<const std::pair<int, int64_t>> groups, ThreadPool* pool) {
  EXL_CHECK(int64_t(w.size()) == N * K && plan.dim == K, "engine: quantize: gptq: weight of ", w.size(),
            " values for a ", N, "x", K, " layer and a plan of dimension ", plan.dim);
  std::vector<float> rows = permuted_rows(w, N, K, plan.perm);
  for (int64_t j = 0; j < K; ++j)
    if (plan.dead[size_t(plan.perm[size_t(j)])]) std::fill(rows.begin() + j * N, rows.begin() + (j + 1) * N, 0.0f);
  Exl2Tensors t = make_exl2_tensors(K, N, make_exl2_groups(groups, K), plan.perm);
  const float* U = plan.u.data();
  std::vector<float> err;
  for (size_t g = 0; g < t.groups.size(); ++g) {
    const Exl2Group& gr = t.groups[size_t(g)];
    const int64_t r0 = gr.row_start, r1 = r0 + gr.rows;
    const GroupScales sc = fit_group_scales(rows.data() + r0 * N, gr.rows, N, gr.bits);
    t.q_scale_max[g] = sc.smax;
    for (int64_t n = 0; n < N; ++n) set_scale_code(t, g, n, sc.qscale[size_t(n)] - 1);
    const float maxq = float((1 << gr.bits) - 1), zero = float(1 << (gr.bits - 1));
    err.assign(size_t(gr.rows * N), 0.0f);
    for (int64_t j = r0; j < r1; ++j) {
      float* r = rows.data() + j * N;
      float* e = err.data() + (j - r0) * N;
      const float d = U[j * K + j];
      for (int64_t n = 0; n < N; ++n) {
        const float q = std::clamp(std::nearbyint(r[n] * sc.inv[size_t(n)]) + zero, 0.0f, maxq);
        set_code(t, g, j - r0, n, uint32_t(q));
        e[n] = (r[n] - (q - zero) * sc.scale[size_t(n)]) / d;
      }
      for (int64_t i = j + 1; i < r1; ++i) {
        const float c = U[j * K + i];
        float* ri = rows.data() + i * N;
        for (int64_t n = 0; n < N; ++n) ri[n] -= c * e[n];
      }
    }
    gptq_impl::for_range(pool, K - r1, 16, [&](int64_t b, int64_t e_) {
      for (int64_t i = r1 + b; i < r1 + e_; ++i) {
        float* ri = rows.data() + i * N;
        for (int64_t j = r0; j < r1; ++j) {
          const float c = U[j * K + i];
          const float* ej = err.data() + (j - r0) * N;
          for (int64_t n = 0; n < N; ++n) ri[n] -= c * ej[n];
        }
      }
    });
  }
  return t;
}

}  // namespace exl
